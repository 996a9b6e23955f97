"""The kubelet's device manager: device plugin registrations, allocation, node capacity.

Read from kubernetes/kubernetes pkg/kubelet/cm/devicemanager/manager.go
@7510f32987feb7efbaced9aec1ca15303dea252b (devicesToAllocate): an unregistered resource
fails with "cannot allocate unregistered device R", no healthy device with "no healthy devices
present; cannot allocate unhealthy devices R", too few free devices with "requested number of
devices unavailable for R. Requested: N, Available: M"; then the plugin's Allocate may refuse
(NVIDIA's ValidateRequest, k8s-device-plugin internal/rm/rm.go@1b826acc6af3079d8923bac395c3124b8861a9a6:
"invalid request: maximum request size for shared resources is 1; found N" when
failRequestsGreaterThanOne). Devices of pods that are gone or terminal are free again.
A resource whose plugin went away keeps its capacity and has allocatable 0; unhealthy
devices count in capacity, not in allocatable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.cluster.emulator.context import Device


class AllocationError(Exception):
    pass


@dataclass
class Registration:
    resource: str
    devices: dict[str, Device]
    plugin: str  # uid of the device plugin pod
    fail_requests_greater_than_one: bool = False
    shared: bool = False


@dataclass
class DeviceManager:
    registrations: dict[str, dict[str, Registration]] = field(default_factory=dict)  # node -> res
    allocated: dict[str, dict[str, dict[str, str]]] = field(
        default_factory=dict
    )  # node->res->id->pod
    known: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> res -> last capacity

    def register(self, node: str, plugin: str, registrations: list[Registration]) -> None:
        mine = self.registrations.setdefault(node, {})
        for resource in [r for r, reg in mine.items() if reg.plugin == plugin]:
            if resource not in {r.resource for r in registrations}:
                del mine[resource]
        for registration in registrations:
            mine[registration.resource] = registration
            self.known.setdefault(node, {})[registration.resource] = len(registration.devices)

    def unregister(self, node: str, plugin: str) -> None:
        mine = self.registrations.get(node, {})
        for resource in [r for r, reg in mine.items() if reg.plugin == plugin]:
            del mine[resource]

    def plugins(self, node: str) -> set[str]:
        return {reg.plugin for reg in self.registrations.get(node, {}).values()}

    def is_device_resource(self, node: str, resource: str) -> bool:
        return resource in self.known.get(node, {})

    def node_resources(self, node: str) -> dict[str, tuple[int, int]]:
        """resource -> (capacity, allocatable) as the kubelet reports them."""
        out = {}
        for resource, capacity in self.known.get(node, {}).items():
            registration = self.registrations.get(node, {}).get(resource)
            if registration:
                healthy = sum(1 for d in registration.devices.values() if d.healthy)
                out[resource] = (len(registration.devices), healthy)
            else:
                out[resource] = (capacity, 0)
        return out

    def allocate(self, node: str, pod: str, resource: str, count: int) -> list[Device]:
        registration = self.registrations.get(node, {}).get(resource)
        if registration is None:
            raise AllocationError(f"cannot allocate unregistered device {resource}")
        healthy = {i for i, d in registration.devices.items() if d.healthy}
        if not healthy:
            raise AllocationError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        taken = self.allocated.setdefault(node, {}).setdefault(resource, {})
        free = [d for d in sorted(healthy) if d not in taken]
        if len(free) < count:
            raise AllocationError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(free)}"
            )
        chosen = free[:count]
        if registration.shared and count > 1 and registration.fail_requests_greater_than_one:
            raise AllocationError(
                "rpc error: code = Unknown desc = invalid request: "
                f"maximum request size for shared resources is 1; found {count}"
            )
        for device in chosen:
            taken[device] = pod
        return [registration.devices[d] for d in chosen]

    def release(self, pod: str) -> None:
        for resources in self.allocated.values():
            for taken in resources.values():
                for device in [d for d, owner in taken.items() if owner == pod]:
                    del taken[device]

    def in_use(self, node: str, resource: str) -> int:
        return len(self.allocated.get(node, {}).get(resource, {}))
