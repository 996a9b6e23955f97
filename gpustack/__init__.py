"""gpustack: bring NVIDIA GPU nodes up and keep them current, with Ansible."""

__version__ = "0.1.0"
