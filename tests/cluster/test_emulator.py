"""The emulator itself, through the real client: what other cluster tests rely on."""

from __future__ import annotations

import re

import pytest
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

from tests.cluster.emulator import PodFate
from tests.cluster.emulator.selectors import label_matcher


@pytest.fixture
def api(kubeconfig):
    api = config.new_client_from_config(str(kubeconfig))
    yield api
    api.close()


def test_label_selectors():
    labels = {"a": "1", "b": "x"}
    assert label_matcher("a=1,b")(labels)
    assert label_matcher("a in (1,2),c notin (3)")(labels)
    assert not label_matcher("a!=1")(labels)
    assert not label_matcher("!b")(labels)
    assert label_matcher("")(labels)


def test_thousand_nodes_list_and_pages(cluster, api):
    emu = cluster.emulator
    emu.add_nodes(1000, labels={"pool": "gpu"})
    core = client.CoreV1Api(api)
    response = core.list_node(_preload_content=False)  # speed: tests/cluster/bench_emulator.py
    assert response.status == 200 and response.data.count(b'"kind": "Node"') == 1000
    names, token = [], None
    while True:
        page = core.list_node(limit=300, _continue=token, label_selector="pool=gpu")
        names += [n.metadata.name for n in page.items]
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 1000 - len(names)
    assert len(names) == 1000 == len(set(names))
    assert emu.count("GET", "/api/v1/nodes") == 5  # 1 full list + 4 pages


def test_server_side_apply_ownership(cluster, api):
    dyn = dynamic.DynamicClient(api)
    cms = dyn.resources.get(api_version="v1", kind="ConfigMap")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"},
            "data": {"a": "1", "b": "2"}}  # fmt: skip
    first = cms.server_side_apply(body=body, field_manager="gpustack")
    again = cms.server_side_apply(body=body, field_manager="gpustack")
    assert again.metadata.resourceVersion == first.metadata.resourceVersion
    # Another manager changes a field gpustack owns: conflict unless forced.
    core = client.CoreV1Api(api)
    core.patch_namespaced_config_map("c", "default", {"data": {"a": "9"}}, field_manager="kubectl")
    with pytest.raises(ApiException) as info:
        cms.server_side_apply(body=body, field_manager="gpustack")
    assert info.value.status == 409 and "conflict" in info.value.body
    forced = cms.server_side_apply(body=body, field_manager="gpustack", force_conflicts=True)
    assert forced.data.a == "1"
    # A field gpustack stops applying is removed.
    body["data"] = {"a": "1"}
    dropped = cms.server_side_apply(body=body, field_manager="gpustack", force_conflicts=True)
    assert dict(dropped.data) == {"a": "1"}


def test_status_subresource_and_generation(cluster, api):
    """A Deployment: no controller in the emulator writes its status, so a client's does."""
    apps = client.AppsV1Api(api)
    dep = {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"x": "y"}},
           "template": {"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}  # fmt: skip
    apps.create_namespaced_deployment("default", dep)
    apps.patch_namespaced_deployment("d", "default", {"status": {"readyReplicas": 5}})
    obj = apps.read_namespaced_deployment("d", "default")
    assert obj.status is None or not obj.status.ready_replicas  # main resource ignores status
    assert obj.metadata.generation == 1
    apps.patch_namespaced_deployment_status("d", "default", {"status": {"readyReplicas": 5}})
    obj = apps.read_namespaced_deployment("d", "default")
    assert obj.status.ready_replicas == 5 and obj.metadata.generation == 1
    apps.patch_namespaced_deployment("d", "default", {"spec": {"minReadySeconds": 3}})
    assert apps.read_namespaced_deployment("d", "default").metadata.generation == 2


def test_daemonset_status_belongs_to_its_controller(cluster, api):
    """A client writing DaemonSet status is overwritten from the pods at the next sync."""
    apps = client.AppsV1Api(api)
    ds = {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"x": "y"}},
          "template": {"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}  # fmt: skip
    apps.create_namespaced_daemon_set("default", ds)
    apps.patch_namespaced_daemon_set_status("d", "default", {"status": {"numberReady": 5, "desiredNumberScheduled": 5,
                                                                      "currentNumberScheduled": 5, "numberMisscheduled": 0}})  # fmt: skip
    obj = apps.read_namespaced_daemon_set("d", "default")
    assert obj.status.number_ready == 0 and obj.status.desired_number_scheduled == 0  # no nodes


def test_eviction_respects_pod_disruption_budgets(cluster, api):
    emu = cluster.emulator
    emu.add_node("n1")
    emu.pod_policy = lambda pod: PodFate.running()
    core = client.CoreV1Api(api)
    for name in ("w1", "w2"):
        core.create_namespaced_pod("default", {"metadata": {"name": name, "labels": {"app": "w"}},
                                               "spec": {"containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default",
        {
            "metadata": {"name": "pdb"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "w"}}},
        },
    )
    eviction = {"metadata": {"name": "w1", "namespace": "default"}}
    core.create_namespaced_pod_eviction("w1", "default", eviction)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod_eviction(
            "w2", "default", {"metadata": {"name": "w2", "namespace": "default"}}
        )
    assert info.value.status == 429 and "disruption budget" in info.value.body
    # w1 was deleted gracefully: terminating first, gone at the kubelet's next sync.
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["w2"]


def test_logs_proxy_and_fault_injection(cluster, api):
    emu = cluster.emulator
    emu.add_node("n1")
    core = client.CoreV1Api(api)
    emu.pod_policy = lambda pod: PodFate.succeeded("hello\n")
    core.create_namespaced_pod(
        "default",
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
    )
    assert core.read_namespaced_pod_log("p", "default") == "hello\n"
    core.create_namespaced_service(
        "default", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}
    )
    emu.set_service_proxy("default", "s", 80, lambda path: f"you asked {path}")
    assert (
        core.connect_get_namespaced_service_proxy_with_path("s:80", "default", "metrics")
        == "you asked /metrics"
    )
    emu["get", re.compile("/api/v1/nodes")] << 500  # kmock's DSL: a reaction beats the store
    with pytest.raises(ApiException) as info:
        core.list_node()
    assert info.value.status == 500


def test_reactions_and_the_request_count_outlive_kmocks_trimmed_history(cluster, api):
    """kmock's views see the last KMOCK_HISTORY requests only (its matching walks that history on
    every request); the emulator's count keeps every request, and a reaction still answers."""
    from tests.cluster.emulator.kmock_adapter import KMOCK_HISTORY

    emu = cluster.emulator
    emu.add_node("n1")
    core = client.CoreV1Api(api)
    before = emu.count("GET", "/api/v1/nodes/n1")
    for _ in range(KMOCK_HISTORY + 10):
        core.read_node("n1")
    assert emu.count("GET", "/api/v1/nodes/n1") == before + KMOCK_HISTORY + 10
    assert len(emu._requests) <= KMOCK_HISTORY
    emu["get", re.compile("/api/v1/nodes/n1")] << 503
    with pytest.raises(ApiException) as info:
        core.read_node("n1")
    assert info.value.status == 503
