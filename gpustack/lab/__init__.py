"""A local lab of podman systemd nodes (gpustack lab up/down/list)."""
