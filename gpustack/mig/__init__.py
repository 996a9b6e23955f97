"""`gpustack mig`: MIG layouts changed on Kubernetes nodes, one node at a time: reconfigure (the
label-driven sequence, pure), host (the nvidia_mig role on one host), command."""
