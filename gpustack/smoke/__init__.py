"""`gpustack smoke`: a read-only smoke suite for GPU hosts (docs/gpu-hosts.md).

The host side (roles gpu_preflight, gpu_smoke) returns facts and the raw output of
NVIDIA's tools; everything here is pure and runs on the controller: `parse` reads each tool's
output (the nvidia-smi XML among them), `checks` turns facts into checks and a verdict,
`capture` masks and writes what the tools printed as test data (gpustack/terminal/smoke_view.py
prints the tables).
"""
