"""The Kubernetes side: the only package that imports the `kubernetes` client.

connect  kubeconfig / in-cluster loading, reachability, API errors as Error + Hint
nodes    inventory hosts ↔ Node objects, gpustack's node labels (recorded for uninstall)
apply    server-side apply (field manager `gpustack`), DaemonSet readiness, removal by label
verify   per-node checks: GPUs, capacity, verification pods, dcgm-exporter metrics
flow     install / verify / uninstall phases in the GPU Operator's order
(its per-node table is printed by gpustack/terminal/cluster_report.py)
"""
