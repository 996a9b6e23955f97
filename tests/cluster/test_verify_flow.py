"""The dcgm-exporter scrape against the emulator (fake clock: timeouts cost no time).

The rest of this file's tests run on a real control plane in tests/kube/test_verify_flow.py.
This one stays: it needs a dcgm-exporter that answers through the API server's service proxy,
and a kwok pod's IP leads nowhere (the emulator answers the proxy itself, `set_service_proxy`).
The SIMULATED node hardware is tests/cluster/helpers.py's.
"""

from __future__ import annotations

from gpustack.k8s.cluster import flow
from tests.cluster.helpers import (
    gpu_cluster,
    gpu_facts,
    inventory,
    run_result,
    verify_pods,
)

NS = "gpustack-system"


def install(kubeconfig, clock, facts, hostvars=None, extravars=None, failed=()):
    session = flow.prepare(
        str(kubeconfig), inventory(kubeconfig.parent, list(facts), hostvars), extravars or {}
    )
    return flow.install(session, run_result(facts, failed), clock=clock)


def checks(report, host):
    node = next(n for n in report.nodes if n.host == host)
    return {c.name: (c.status, c.message) for c in node.checks}


def test_dcgm_scrape_and_vectoradd(cluster, kubeconfig, clock):
    emu = cluster.emulator
    uuids = gpu_cluster(emu, {"gpu1": 2})
    metrics = "".join(
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="{u}",Hostname="gpu1"}} 41\n'
        for i, u in enumerate(uuids["gpu1"][:1])
    )
    emu.set_service_proxy(NS, "dcgm-exporter", 9400, lambda path: "# HELP x\n" + metrics)
    extravars = {
        "gpustack_k8s_dcgm_scrape": "true",
        "gpustack_k8s_vector_add_image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
    }
    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 2)}, extravars=extravars)

    result = checks(report, "gpu1")
    assert result["vectoradd"][0] == "passed"
    assert result["dcgm"] == ("failed", f"no DCGM_FI_DEV_GPU_TEMP sample for {uuids['gpu1'][1]}")
    assert (
        emu.count("GET", f"/api/v1/namespaces/{NS}/services/dcgm-exporter:9400/proxy/metrics") == 3
    )
    assert verify_pods(emu) == []
