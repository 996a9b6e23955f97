"""Server-side apply of every object gpustack renders, in each GPU mode, against a real
kube-apiserver: its OpenAPI validation, defaulting, Pod Security labels, field ownership and
list merging by key are Kubernetes' own. A second apply must change nothing (same
resourceVersion), and check mode (dryRun=All) must create nothing."""

from __future__ import annotations

import pytest

from gpustack.k8s.cluster import apply
from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.manifests import ClusterConfig, render

pytestmark = pytest.mark.kube

MODES = {
    "default": {},
    "time-slicing": {"gpustack_k8s_time_slicing_replicas": 4},
    "time-slicing-renamed": {
        "gpustack_k8s_time_slicing_replicas": 2,
        "gpustack_k8s_rename_by_default": True,
    },
    "mps": {"gpustack_k8s_mps_replicas": 4},
    "mig-single": {"gpustack_k8s_mig_strategy": "single"},
    "mig-mixed": {"gpustack_k8s_mig_strategy": "mixed"},
    "dra": {"gpustack_k8s_gpu_allocation": "dra"},
    "hami": {
        "gpustack_k8s_gpu_allocation": "hami",
        "gpustack_k8s_hami_kube_scheduler_tag": "v1.36.3",
    },
    "no-gfd-no-dcgm": {
        "gpustack_k8s_gfd_enabled": False,
        "gpustack_k8s_dcgm_exporter_enabled": False,
    },
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_applies_then_changes_nothing(kubeconfig, unique, mode):
    cluster = connect(str(kubeconfig))
    config = ClusterConfig.from_vars(
        {"gpustack_k8s_namespace": f"gs-{mode}-{unique}", **MODES[mode]}
    )
    objects = render(config)

    first = apply.apply_objects(cluster, objects)
    assert {a.action for a in first if a.kind != "RuntimeClass"} == {"created"}, first

    second = apply.apply_objects(cluster, objects)
    changed = [a.ref for a in second if a.action != "unchanged"]
    assert changed == [], f"a second apply changed {changed}"


def test_check_mode_creates_nothing(kubeconfig, unique, kube):
    cluster = connect(str(kubeconfig))
    namespace = f"gs-check-{unique}"
    config = ClusterConfig.from_vars({"gpustack_k8s_namespace": namespace})
    done = apply.apply_objects(cluster, render(config), dry_run=True)
    assert {a.action for a in done if a.kind != "RuntimeClass"} == {"would create"}
    names = [n["metadata"]["name"] for n in kube.cp.get("/api/v1/namespaces")["items"]]
    assert namespace not in names
