"""Node Feature Discovery, present or absent (SIMULATED: its master and worker are not pods).

`ClusterEmulator.install_nfd()` serves NFD's API (CRDs nodefeatures / nodefeaturerules
.nfd.k8s-sigs.io, v1alpha1) and, unless told otherwise, runs what nfd-master and nfd-worker do
for GPU labels:
- nfd-master: NodeFeature objects labelled `nfd.node.kubernetes.io/node-name=<node>` (any
  namespace) become labels on that node;
- nfd-worker (`local` source): `/etc/kubernetes/node-feature-discovery/features.d/*` files on
  the node (kubernetes-sigs/node-feature-discovery source/local/local.go
  @76e6cc8cc0d54b8bce037098b72611ffdf66ef5a) become labels on that node.
Labels in the kubernetes.io / k8s.io namespaces are dropped (the master refuses them); the
labels NFD set are tracked in the annotation `nfd.node.kubernetes.io/feature-labels`, so labels
that disappear from the sources are removed. Without NFD nothing turns GFD output into labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.cluster.emulator.images import NODE_NAME_LABEL

if TYPE_CHECKING:
    from tests.cluster.emulator.cluster import ClusterEmulator

FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d/"
TRACK = "nfd.node.kubernetes.io/feature-labels"


def _allowed(label: str) -> bool:
    domain = label.split("/", 1)[0] if "/" in label else ""
    return not any(domain == d or domain.endswith("." + d) for d in ("kubernetes.io", "k8s.io"))


class Nfd:
    def __init__(self, cluster: ClusterEmulator):
        self.cluster = cluster
        self.master = False
        self.worker = False

    def sync(self) -> None:
        cluster = self.cluster
        feature_kind = cluster.store.kind_at("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures")
        if feature_kind is None or not self.master:
            return
        wanted: dict[str, dict[str, str]] = {}
        for obj in cluster.store.items(feature_kind):
            node = (obj["metadata"].get("labels") or {}).get(NODE_NAME_LABEL)
            if node:
                wanted.setdefault(node, {}).update((obj.get("spec") or {}).get("labels") or {})
        nodes_kind = cluster.kind("v1", "Node")
        for node in cluster.store.items(nodes_kind):
            name = node["metadata"]["name"]
            labels = dict(wanted.get(name, {}))
            if self.worker:
                for path, text in sorted(cluster.hardware(name).files.items()):
                    if path.startswith(FEATURES_DIR):
                        for line in text.splitlines():
                            key, sep, value = line.partition("=")
                            if sep and not line.startswith("#"):
                                labels[key.strip()] = value.strip()
            labels = {k: v for k, v in labels.items() if _allowed(k)}
            self._label(node, labels)

    def _label(self, node: dict, labels: dict[str, str]) -> None:
        meta = node["metadata"]
        annotations = dict(meta.get("annotations") or {})
        before = set(filter(None, annotations.get(TRACK, "").split(",")))
        current = dict(meta.get("labels") or {})
        new = {k: v for k, v in current.items() if k not in before - set(labels)}
        new.update(labels)
        track = ",".join(sorted(labels))
        if new == current and annotations.get(TRACK, "") == track:
            return
        meta["labels"] = new
        if track:
            annotations[TRACK] = track
        else:
            annotations.pop(TRACK, None)
        meta["annotations"] = annotations
        self.cluster.store.touch(node)
