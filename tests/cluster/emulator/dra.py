"""Dynamic Resource Allocation (resource.k8s.io/v1) in the emulator: what gpustack's DRA path uses.

Sources (kubernetes/kubernetes): validation from
pkg/apis/resource/validation/validation.go@009801d930e2e3c8b3671a3ec28e31a2f64865ac
(`validateDeviceRequest`: a request name is a DNS label and needs exactly one of `exactly` /
`firstAvailable`; `validateExactDeviceRequest`: `deviceClassName` required, a DNS subdomain;
`validateDeviceAllocationMode`: ExactCount needs count > 0, All forbids a count;
`ValidateResourceClaimUpdate`: the claim spec is immutable; claim status: `reservedFor` only
with an allocation, an allocation never changes once set; ResourceSlice: driver, pool name,
`resourceSliceCount` > 0, exactly one of nodeName / nodeSelector / allNodes /
perDeviceNodeSelection, device names DNS labels and unique). ResourceClaimTemplate's spec is
immutable as well ("This field is immutable", the API reference of its `spec`). Defaults as
in pkg/apis/resource/v1 (allocationMode ExactCount, count 1).

Controllers, as far as gpustack needs them (SIMULATED, not upstream code):
- resourceclaim controller: a pod's `resourceClaimTemplateName` gets a ResourceClaim
  `<pod>-<claim>-<suffix>` owned by the pod (controller), annotated
  `resource.kubernetes.io/pod-claim-name`, recorded in `status.resourceClaimStatuses`; a
  missing template leaves the pod without it and a `FailedResourceClaimCreation` event.
  Claims generated for a pod that finished are deleted; deleting the pod deletes them (GC).
- scheduler (dynamicresources plugin): a pod with claims is placed only on a node whose
  ResourceSlices (published for that node) have enough devices that match the DeviceClass
  selectors and no other claim holds; the claim gets `status.allocation` (results, node
  selector on metadata.name) and `reservedFor` the pod. Otherwise "cannot allocate all claims".
- kubelet DRA manager: a pod's claims must be allocated and reserved for it (a pod bound with
  spec.nodeName that bypassed the scheduler never gets there), and the driver's kubelet
  plugin must be registered on the node; otherwise `FailedPrepareDynamicResources` and the
  pod stays Pending. Containers that list a claim in `resources.claims` get its devices
  (injected through CDI: `Device.cdi`).

CEL: the emulator evaluates only conjunctions (`&&`) of `device.driver == '<s>'` and
`device.attributes['<domain>'].<name> == '<s>'`; any other expression is refused with 422
at create, so nothing is matched by accident (a real API server compiles full CEL).
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import TYPE_CHECKING, Any

from tests.cluster.emulator.context import Device
from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.kinds import DRA_KINDS, Kind

if TYPE_CHECKING:
    from tests.cluster.emulator.cluster import ClusterEmulator

GROUP, VERSION = "resource.k8s.io", "v1"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_TERM = re.compile(
    r"^\s*device\.(?:driver|attributes\['(?P<domain>[^']+)'\]\.(?P<attr>[A-Za-z0-9_]+))"
    r"\s*==\s*'(?P<value>[^']*)'\s*$"
)
_DRIVER_TERM = re.compile(r"^\s*device\.driver\s*==\s*'(?P<value>[^']*)'\s*$")


# -- validation ------------------------------------------------------------------------------


def _invalid(kind: str, name: str, errors: list[str]) -> ApiError:
    return ApiError(422, "Invalid", f'{kind}.{GROUP} "{name}" is invalid: ' + "; ".join(errors))


def compile_cel(expression: str) -> list[tuple[str | None, str | None, str]]:
    """The emulator's CEL subset: [(domain, attribute, value)] with (None, None, v) = driver."""
    terms = []
    for part in expression.split("&&"):
        driver = _DRIVER_TERM.match(part)
        if driver:
            terms.append((None, None, driver.group("value")))
            continue
        match = _TERM.match(part)
        if not match or not match.group("domain"):
            raise ValueError(part.strip())
        terms.append((match.group("domain"), match.group("attr"), match.group("value")))
    return terms


def _selectors(selectors: Any, path: str, errors: list[str]) -> None:
    for i, selector in enumerate(selectors or []):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        if not expression:
            errors.append(f"{path}[{i}].cel: Required value")
            continue
        try:
            compile_cel(expression)
        except ValueError as exc:
            errors.append(
                f"{path}[{i}].cel.expression: Invalid value: {expression!r}: the emulator "
                f"evaluates only `device.driver == '...'` and `device.attributes['d'].a == "
                f"'...'` joined by && (not: {exc})"
            )


def _device_claim(devices: Any, path: str, errors: list[str]) -> None:
    names = set()
    for i, request in enumerate((devices or {}).get("requests") or []):
        where = f"{path}.requests[{i}]"
        name = request.get("name") or ""
        if not name:
            errors.append(f"{where}.name: Required value")
        elif not _DNS_LABEL.match(name) or len(name) > 63:
            errors.append(f"{where}.name: Invalid value: {name!r}: must be a DNS label")
        elif name in names:
            errors.append(f"{where}.name: Duplicate value: {name!r}")
        names.add(name)
        # `exactly` is a pointer: {} is set (and then needs deviceClassName)
        exactly, first = request.get("exactly"), request.get("firstAvailable")
        if exactly is None and not first:
            errors.append(f"{where}: Required value: exactly one of `exactly` or "
                          "`firstAvailable` is required")  # fmt: skip
            continue
        if exactly is not None and first:
            errors.append(f"{where}: Invalid value: null: exactly one of `exactly` or "
                          "`firstAvailable` is required, but multiple fields are set")  # fmt: skip
            continue
        for j, sub in enumerate([exactly] if exactly is not None else first):
            at = f"{where}.exactly" if exactly is not None else f"{where}.firstAvailable[{j}]"
            cls = sub.get("deviceClassName") or ""
            if not cls:
                errors.append(f"{at}.deviceClassName: Required value")
            elif not _DNS_SUBDOMAIN.match(cls):
                errors.append(f"{at}.deviceClassName: Invalid value: {cls!r}")
            mode = sub.setdefault("allocationMode", "ExactCount")
            if mode == "ExactCount":
                count = sub.setdefault("count", 1)
                if not isinstance(count, int) or count <= 0:
                    errors.append(f"{at}.count: Invalid value: {count}: must be greater than zero")
            elif mode == "All":
                if sub.get("count"):
                    errors.append(f"{at}.count: Invalid value: {sub['count']}: must not be "
                                  "specified when allocationMode is 'All'")  # fmt: skip
            else:
                errors.append(f'{at}.allocationMode: Unsupported value: "{mode}": supported '
                              'values: "All", "ExactCount"')  # fmt: skip
            _selectors(sub.get("selectors"), f"{at}.selectors", errors)


def _slice(obj: dict, errors: list[str]) -> None:
    spec = obj.get("spec") or {}
    if not spec.get("driver"):
        errors.append("spec.driver: Required value")
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errors.append("spec.pool.name: Required value")
    if int(pool.get("resourceSliceCount") or 0) <= 0:
        errors.append("spec.pool.resourceSliceCount: Invalid value: must be greater than zero")
    set_fields = [
        f for f in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(f)
    ]
    if len(set_fields) != 1:
        errors.append(
            "spec: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            "`perDeviceNodeSelection` is required" + (", but multiple fields are set" if set_fields else "")
        )  # fmt: skip
    seen = set()
    for i, device in enumerate(spec.get("devices") or []):
        name = device.get("name") or ""
        if not _DNS_LABEL.match(name):
            errors.append(f"spec.devices[{i}].name: Invalid value: {name!r}: must be a DNS label")
        elif name in seen:
            errors.append(f"spec.devices[{i}].name: Duplicate value: {name!r}")
        seen.add(name)


def validate_create(kind: Kind, obj: dict) -> None:
    """Validation and defaulting of a new resource.k8s.io/v1 object (422 on a mistake)."""
    if kind.group != GROUP:
        return
    name = obj.get("metadata", {}).get("name") or obj.get("metadata", {}).get("generateName", "")
    errors: list[str] = []
    spec = obj.get("spec")
    if kind.kind == "DeviceClass":
        _selectors((spec or {}).get("selectors"), "spec.selectors", errors)
    elif kind.kind == "ResourceClaimTemplate":
        if not isinstance(spec, dict) or "spec" not in spec:
            errors.append("spec.spec: Required value")
        else:
            _device_claim((spec["spec"] or {}).get("devices"), "spec.spec.devices", errors)
    elif kind.kind == "ResourceClaim":
        _device_claim((spec or {}).get("devices"), "spec.devices", errors)
    elif kind.kind == "ResourceSlice":
        _slice(obj, errors)
    if errors:
        raise _invalid(kind.plural, name, errors)


def validate_update(kind: Kind, old: dict, new: dict) -> None:
    """Immutability and the status invariants of resource.k8s.io/v1 objects."""
    if kind.group != GROUP:
        return
    name = old["metadata"]["name"]
    errors: list[str] = []
    if kind.kind in ("ResourceClaim", "ResourceClaimTemplate") and new.get("spec") != old.get(
        "spec"
    ):
        errors.append("spec: Invalid value: field is immutable")
    if kind.kind == "ResourceClaim":
        status, before = new.get("status") or {}, old.get("status") or {}
        if status.get("reservedFor") and not status.get("allocation"):
            errors.append("status.reservedFor: Forbidden: may not be specified when "
                          "`allocated` is not set")  # fmt: skip
        if (
            before.get("allocation")
            and status.get("allocation")
            and (status["allocation"] != before["allocation"])
        ):
            errors.append("status.allocation: Invalid value: field is immutable")
    if kind.kind == "ResourceSlice":
        _slice(new, errors)
        for field in ("driver", "nodeName"):
            if (new.get("spec") or {}).get(field) != (old.get("spec") or {}).get(field):
                errors.append(f"spec.{field}: Invalid value: field is immutable")
    if kind.kind == "DeviceClass":
        _selectors((new.get("spec") or {}).get("selectors"), "spec.selectors", errors)
    if errors:
        raise _invalid(kind.plural, name, errors)


def validate_pod(pod: dict) -> None:
    """Pod validation of spec.resourceClaims and containers' resources.claims."""
    spec = pod.get("spec") or {}
    name = pod.get("metadata", {}).get("name") or pod.get("metadata", {}).get("generateName", "")
    errors = []
    claims = set()
    for i, claim in enumerate(spec.get("resourceClaims") or []):
        cname = claim.get("name") or ""
        if not _DNS_LABEL.match(cname):
            errors.append(f"spec.resourceClaims[{i}].name: Invalid value: {cname!r}")
        elif cname in claims:
            errors.append(f"spec.resourceClaims[{i}].name: Duplicate value: {cname!r}")
        claims.add(cname)
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if claim.get(k)]
        if len(sources) != 1:
            errors.append(f"spec.resourceClaims[{i}]: Invalid value: must specify one of: "
                          "`resourceClaimName`, `resourceClaimTemplateName`")  # fmt: skip
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    for container in containers:
        for j, ref in enumerate((container.get("resources") or {}).get("claims") or []):
            if ref.get("name") not in claims:
                errors.append(f"spec.containers[{container.get('name')}].resources.claims[{j}]"
                              f'.name: Not found: "{ref.get("name")}"')  # fmt: skip
    if errors:
        raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: ' + "; ".join(errors))


# -- devices and selectors ---------------------------------------------------------------------


def attribute(device: dict, domain: str, driver: str, name: str) -> Any:
    """A device attribute by qualified name; a bare name is in the driver's own domain."""
    attrs = device.get("attributes") or {}
    value = attrs.get(f"{domain}/{name}")
    if value is None and domain == driver:
        value = attrs.get(name)
    if not isinstance(value, dict):
        return None
    return next(iter(value.values()), None)


def matches(expression: str, driver: str, device: dict) -> bool:
    for domain, attr, value in compile_cel(expression):
        if domain is None:
            if driver != value:
                return False
        elif attribute(device, domain, driver, attr or "") != value:
            return False
    return True


class Dra:
    """The resourceclaim controller, the scheduler's allocator and the kubelet DRA manager."""

    def __init__(self, cluster: ClusterEmulator):
        self.cluster = cluster
        self.plugins: dict[str, dict[str, str]] = {}  # node -> driver -> plugin pod uid

    def kind(self, name: str) -> Kind:
        return self.cluster.kind(f"{GROUP}/{VERSION}", name)

    # -- the resourceclaim controller --------------------------------------------------------

    def sync(self) -> None:
        cluster = self.cluster
        pods_kind = cluster.kind("v1", "Pod")
        claims_kind = self.kind("ResourceClaim")
        for pod in cluster.store.items(pods_kind):
            spec = pod.get("spec") or {}
            if not spec.get("resourceClaims") or pod["metadata"].get("deletionTimestamp"):
                continue
            status = pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                for claim in self._generated(pod):
                    cluster.api.remove(claims_kind, claim)
                continue
            recorded = {s.get("name") for s in status.get("resourceClaimStatuses") or []}
            for entry in spec["resourceClaims"]:
                if entry.get("resourceClaimTemplateName") and entry["name"] not in recorded:
                    self._create_claim(pod, entry)

    def _generated(self, pod: dict) -> list[dict]:
        uid = pod["metadata"]["uid"]
        return [
            c
            for c in self.cluster.store.items(self.kind("ResourceClaim"), pod["metadata"]["namespace"])
            if any(r.get("uid") == uid and r.get("controller") for r in c["metadata"].get("ownerReferences") or [])
        ]  # fmt: skip

    def _create_claim(self, pod: dict, entry: dict) -> None:
        cluster = self.cluster
        ns = pod["metadata"]["namespace"]
        template_name = entry["resourceClaimTemplateName"]
        template = cluster.store.get(self.kind("ResourceClaimTemplate"), ns, template_name)
        if template is None:
            cluster.event(pod, "FailedResourceClaimCreation",
                          f"PodResourceClaim {entry['name']}: resource claim template "
                          f'"{template_name}": resourceclaimtemplate.resource.k8s.io '
                          f'"{template_name}" not found', "Warning", "resource_claim")  # fmt: skip
            return
        meta = copy.deepcopy((template.get("spec") or {}).get("metadata") or {})
        annotations = {**(meta.get("annotations") or {}), POD_CLAIM_ANNOTATION: entry["name"]}
        claim = {
            "metadata": {
                "generateName": f"{pod['metadata']['name']}-{entry['name']}-",
                "labels": meta.get("labels") or {},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                     "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"],
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": copy.deepcopy(template["spec"]["spec"]),
        }  # fmt: skip
        created = cluster.api.create(self.kind("ResourceClaim"), ns, claim)
        status = copy.deepcopy(pod.get("status") or {})
        status.setdefault("resourceClaimStatuses", []).append(
            {"name": entry["name"], "resourceClaimName": created["metadata"]["name"]}
        )
        cluster.store.set_status(cluster.kind("v1", "Pod"), pod, status)

    # -- claims of a pod --------------------------------------------------------------------------

    def pod_claims(self, pod: dict) -> dict[str, tuple[str, dict | None]]:
        """pod claim name -> (ResourceClaim name, the object or None when it does not exist)."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        generated = {
            s.get("name"): s.get("resourceClaimName")
            for s in status.get("resourceClaimStatuses") or []
        }
        out = {}
        for entry in spec.get("resourceClaims") or []:
            name = entry.get("resourceClaimName") or generated.get(entry["name"]) or ""
            obj = (
                self.cluster.store.get(self.kind("ResourceClaim"), pod["metadata"]["namespace"], name)
                if name
                else None
            )  # fmt: skip
            out[entry["name"]] = (name, obj)
        return out

    # -- the scheduler's allocator ---------------------------------------------------------------

    def _slices_on(self, node: str) -> list[dict]:
        return [
            s
            for s in self.cluster.store.items(self.kind("ResourceSlice"))
            if (s.get("spec") or {}).get("nodeName") == node
        ]

    def _taken(self) -> set[tuple[str, str, str]]:
        taken = set()
        for claim in self.cluster.store.items(self.kind("ResourceClaim")):
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                taken.add((result.get("driver"), result.get("pool"), result.get("device")))
        return taken

    def fit(self, pod: dict, node: str) -> tuple[bool, str, list[tuple[dict, list[dict]]]]:
        """(fits, reason, [(claim, allocation results)] to write when the pod is bound)."""
        claims = self.pod_claims(pod)
        if not claims:
            return True, "", []
        plans = []
        taken = self._taken()
        for pod_claim, (name, claim) in claims.items():
            if claim is None:
                return False, f'waiting for resource claim "{name or pod_claim}" to be created', []
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
                values = [v for t in terms for f in t.get("matchFields") or [] for v in f.get("values") or []]  # fmt: skip
                if terms and node not in values:
                    return False, "resourceclaim not available on the node", []
                plans.append((claim, []))
                continue
            results = []
            for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
                exact = request.get("exactly") or {}
                cls = self.cluster.store.get(
                    self.kind("DeviceClass"), None, exact.get("deviceClassName", "")
                )
                if cls is None:
                    return False, (f"request {request['name']}: device class "
                                   f"{exact.get('deviceClassName')} does not exist"), []  # fmt: skip
                expressions = [((s.get("cel") or {}).get("expression") or "")
                               for s in ((cls.get("spec") or {}).get("selectors") or []) + (exact.get("selectors") or [])]  # fmt: skip
                free = []
                for slc in self._slices_on(node):
                    spec = slc["spec"]
                    for device in spec.get("devices") or []:
                        key = (spec["driver"], spec["pool"]["name"], device["name"])
                        if key in taken:
                            continue
                        if all(matches(e, spec["driver"], device) for e in expressions):
                            free.append(key)
                want = (
                    len(free)
                    if exact.get("allocationMode") == "All"
                    else int(exact.get("count", 1))
                )
                if want == 0 or len(free) < want:
                    return False, "cannot allocate all claims", []
                for driver, pool, device in free[:want]:
                    taken.add((driver, pool, device))
                    results.append({"request": request["name"], "driver": driver,
                                    "pool": pool, "device": device})  # fmt: skip
            plans.append((claim, results))
        return True, "", plans

    def allocate(self, pod: dict, node: str, plans: list[tuple[dict, list[dict]]]) -> None:
        """Write the allocation and the reservation for `pod` (the scheduler's PreBind)."""
        kind = self.kind("ResourceClaim")
        for claim, results in plans:
            status = copy.deepcopy(claim.get("status") or {})
            if results:
                status["allocation"] = {
                    "devices": {"results": results},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                }  # fmt: skip
            reserved = status.setdefault("reservedFor", [])
            if not any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
                reserved.append({"resource": "pods", "name": pod["metadata"]["name"],
                                 "uid": pod["metadata"]["uid"]})  # fmt: skip
            new = copy.deepcopy(claim)
            new["status"] = status
            validate_update(kind, claim, new)
            self.cluster.store.set_status(kind, claim, status)

    # -- the kubelet's DRA manager --------------------------------------------------------------

    def register(self, node: str, driver: str, plugin: str) -> None:
        self.plugins.setdefault(node, {})[driver] = plugin

    def unregister(self, node: str, plugin: str) -> None:
        """The plugin went away: the kubelet forgets it and removes its ResourceSlices."""
        mine = self.plugins.get(node, {})
        for driver in [d for d, uid in mine.items() if uid == plugin]:
            del mine[driver]
            kind = self.kind("ResourceSlice")
            for slc in self._slices_on(node):
                if slc["spec"].get("driver") == driver:
                    self.cluster.api.remove(kind, slc)

    def prepare(self, pod: dict, node: str) -> tuple[str, dict[str, list[Device]]]:
        """('' or the FailedPrepareDynamicResources message, container -> devices)."""
        claims = self.pod_claims(pod)
        if not claims:
            return "", {}
        uid = pod["metadata"]["uid"]
        devices: dict[str, list[Device]] = {}
        by_claim: dict[str, list[Device]] = {}
        for pod_claim, (name, claim) in claims.items():
            if claim is None:
                return f'resourceclaim "{name or pod_claim}" not found', {}
            status = claim.get("status") or {}
            if not status.get("allocation") or not any(
                r.get("uid") == uid for r in status.get("reservedFor") or []
            ):
                return (f'pod {pod["metadata"]["name"]} ({uid}) is not allowed to use resource '
                        f'claim {name}: claim is not allocated or not reserved for the pod '
                        "(was it bound with spec.nodeName, bypassing the scheduler?)"), {}  # fmt: skip
            got = []
            for result in status["allocation"]["devices"].get("results") or []:
                driver = result["driver"]
                if driver not in self.plugins.get(node, {}):
                    return (f"failed to get gRPC client for driver {driver}: plugin name "
                            f"{driver} not found in the list of registered DRA plugins"), {}  # fmt: skip
                device = self._device(node, result)
                if device is None:
                    return (f"prepare {driver}: device {result['device']} of pool "
                            f"{result['pool']} is not published on this node"), {}  # fmt: skip
                got.append((result["request"], device))
            by_claim[pod_claim] = got  # type: ignore[assignment]
        spec = pod.get("spec") or {}
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            for ref in (container.get("resources") or {}).get("claims") or []:
                for request, device in by_claim.get(ref.get("name"), []):  # type: ignore[misc]
                    if not ref.get("request") or ref["request"] == request:
                        devices.setdefault(container["name"], []).append(device)
        return "", devices

    def _device(self, node: str, result: dict) -> Device | None:
        for slc in self._slices_on(node):
            spec = slc["spec"]
            if spec.get("driver") != result["driver"] or spec["pool"]["name"] != result["pool"]:
                continue
            for device in spec.get("devices") or []:
                if device["name"] != result["device"]:
                    continue
                driver = spec["driver"]
                values = {
                    a: attribute(device, driver, driver, a)
                    for a in ("type", "uuid", "parentUUID", "profile")
                }
                if values["type"] == "mig":
                    return Device(device["name"], values["parentUUID"], values["uuid"],
                                  values["profile"], cdi=True)  # fmt: skip
                return Device(device["name"], values["uuid"], cdi=True)
        return None


# -- what the DRA kubelet plugin publishes (used by images.DraKubeletPlugin) ---------------------


def slice_for(node: dict, driver: str, devices: list[dict]) -> dict:
    """One ResourceSlice for all of a node's devices (pool = node name, as the kubeletplugin
    helper publishes node-local devices), owned by the Node."""
    name = node["metadata"]["name"]
    digest = hashlib.sha1(f"{name}/{driver}".encode()).hexdigest()[:5]
    return {
        "metadata": {"name": f"{name}-{driver}-{digest}",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                          "uid": node["metadata"]["uid"], "controller": True}]},
        "spec": {"driver": driver, "nodeName": name,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }  # fmt: skip


__all__ = ["DRA_KINDS", "Dra", "slice_for", "validate_create", "validate_pod", "validate_update"]
