"""A Kubernetes API emulator for cluster-flow tests (see README.md next to this package).

The real `kubernetes` client talks HTTP to it; nothing in the client is patched.
Modules: kmock_adapter (the only kmock user: server, discovery, request log, fault
injection), store, apiserver + apply + strategies (the API server), selectors, fields,
eviction (EvictionREST + disruption controller), rbac, scheduler, daemonset, kubelet +
devices + context + images (node agents and what operand images do), nfd, hardware
(SIMULATED host hardware), cluster (ties them together), server (thread + kubeconfig).
"""

from tests.cluster.emulator.cluster import ClusterEmulator, PodFate
from tests.cluster.emulator.hardware import Gpu, NodeHardware
from tests.cluster.emulator.kinds import NODEFEATURE_CRD, SERVICEMONITOR_CRD, Kind
from tests.cluster.emulator.server import EmulatorThread

__all__ = [
    "NODEFEATURE_CRD",
    "SERVICEMONITOR_CRD",
    "ClusterEmulator",
    "EmulatorThread",
    "Gpu",
    "Kind",
    "NodeHardware",
    "PodFate",
]
