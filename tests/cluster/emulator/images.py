"""What the operand images do when the emulated kubelet runs them (SIMULATED behaviour).

Each profile says, from upstream's own code and RBAC, what the binary needs and does; the
kubelet calls `start()` on every (re)start and `sync()` while it runs. Nothing here can be
switched to "ready" by a test: the outcome follows from the pod spec, the node's simulated
hardware, the ConfigMaps, RBAC and the API the cluster serves.

- nvidia-device-plugin (k8s-device-plugin v0.20.0 @1b826acc6af3079d8923bac395c3124b8861a9a6):
  no API calls (cmd/nvidia-device-plugin); NVML through the nvidia runtime, else exit 1 when
  failOnInitError; reads CONFIG_FILE; registers with the kubelet through the hostPath
  /var/lib/kubelet/device-plugins; resources per config: `nvidia.com/gpu` (× replicas with
  time-slicing/MPS, `.shared` with renameByDefault), MIG single: MIG devices as
  `nvidia.com/gpu`, MIG mixed: `nvidia.com/mig-<profile>` (+ `nvidia.com/gpu` for GPUs not in
  MIG mode); MPS: advertises only once the MPS control daemon runs on the node;
  failRequestsGreaterThanOne defaults to true with MPS (api/config/v1/config.go).
- gpu-feature-discovery (cmd/gpu-feature-discovery/main.go, internal/lm/output.go): with
  `use-node-feature-api` (default true) GET + CREATE/UPDATE nodefeatures.nfd.k8s-sigs.io
  `nvidia-features-for-<node>` in $NAMESPACE, exit 1 on any error; GET its own pod for owner
  references (warning only). Without it, writes features.d/gfd. Permissions as upstream's
  Role (gpu-operator assets/gpu-feature-discovery/0200_role.yaml@10ee5b3638b89e11e949412aafa5ba99279c3721).
- mps-control-daemon: init `mount-shm` needs privileged; then one MPS server per GPU.
- dcgm-exporter (NVIDIA/dcgm-exporter internal/pkg/transformation/kubernetes.go@d5e5f510a1b6b393f39a43293ccd9dc985defc79):
  NVML/DCGM needed; pod labels via a pod informer only when in-cluster config works, and a
  failure there is a warning, not an exit.
- nvidia-smi / CUDA vectorAdd (verification pods): see the GPUs the kubelet allocated.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from tests.cluster.emulator.context import Device, RunContext
from tests.cluster.emulator.devices import Registration

NFD_GROUP, NFD_VERSION = "nfd.k8s-sigs.io", "v1alpha1"

# The API calls each operand image makes, read from upstream's code, with the upstream Role that
# grants them: (verb, API group, resource, fatal: the binary exits when refused).
API_CALLS: dict[str, list[tuple[str, str, str, bool]]] = {
    # internal/lm/output.go@1b826acc6af3079d8923bac395c3124b8861a9a6 (NodeFeature API mode);
    # granted by gpu-operator assets/gpu-feature-discovery/0200_role.yaml@10ee5b3638b89e11e949412aafa5ba99279c3721
    "gpu-feature-discovery": [
        ("get", NFD_GROUP, "nodefeatures", True),
        ("create", NFD_GROUP, "nodefeatures", True),
        ("update", NFD_GROUP, "nodefeatures", True),
        ("get", "", "pods", False),  # owner references; a failure is a warning
    ],
    "nvidia-device-plugin": [],  # cmd/nvidia-device-plugin makes no API call
    "mps-control-daemon": [],  # cmd/mps-control-daemon makes no API call
    # internal/pkg/transformation/kubernetes.go@d5e5f510a1b6b393f39a43293ccd9dc985defc79: pod
    # informer for pod labels; without credentials or permission it logs and goes on
    "dcgm-exporter": [("list", "", "pods", False), ("watch", "", "pods", False)],
    # NVIDIA/k8s-dra-driver-gpu v25.12.0 (@0882da8720c28763137e0987778ec476ec4cf8df):
    # cmd/gpu-kubelet-plugin/driver.go starts k8s.io/dynamic-resource-allocation's
    # kubeletplugin helper, which publishes ResourceSlices owned by the Node; cleanup.go reads
    # ResourceClaims. Granted by deployments/helm/nvidia-dra-driver-gpu/templates/rbac-kubeletplugin.yaml.
    "gpu-kubelet-plugin": [
        ("get", "", "nodes", True),
        ("list", "resource.k8s.io", "resourceslices", True),
        ("create", "resource.k8s.io", "resourceslices", True),
        ("update", "resource.k8s.io", "resourceslices", True),
        ("delete", "resource.k8s.io", "resourceslices", True),
        ("get", "resource.k8s.io", "resourceclaims", True),
    ],
    "dra-kubelet-plugin-prestart": [],
}
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
GFD_OUTPUT = "/etc/kubernetes/node-feature-discovery/features.d/gfd"


@dataclass
class Outcome:
    """What one start of a container ends in: keeps running, or exits with a code."""

    running: bool
    exit_code: int = 0
    log: str = ""

    @classmethod
    def run(cls, log: str = "") -> Outcome:
        return cls(True, 0, log)

    @classmethod
    def exit(cls, code: int, log: str = "") -> Outcome:
        return cls(False, code, log)


class Profile:
    name = "generic"
    operand = False  # operand images: tests cannot override what they do

    def matches(self, container: dict) -> bool:
        return False

    def start(self, ctx: RunContext) -> Outcome:
        return Outcome.run()

    def sync(self, ctx: RunContext) -> None:
        """Periodic effects while running (register devices, publish labels)."""

    def stop(self, ctx: RunContext) -> None:
        """The container stopped (crash or pod gone)."""


def _command(container: dict) -> str:
    command = container.get("command") or []
    return posixpath.basename(command[0]) if command else ""


def _image(container: dict) -> str:
    return str(container.get("image") or "")


def _nvml_error(ctx: RunContext) -> str:
    return ctx.hw.nvml(ctx.runtime)


# ----------------------------------------------------------------------------- device plugin


class DevicePlugin(Profile):
    name, operand = "nvidia-device-plugin", True
    SOCKET_DIR = "/var/lib/kubelet/device-plugins"

    def matches(self, container):
        return _command(container) == "nvidia-device-plugin"

    def start(self, ctx):
        # The real plugin's order (cmd/nvidia-device-plugin/main.go@1b826acc, start): the FS
        # watcher on the kubelet socket directory first, then the configuration, then NVML. Seen
        # on a real H100 (tests/fixtures/real-gpu/2026-11-26-h100-80gb-hbm3/k8s-device-plugin/).
        if ctx.host_path(self.SOCKET_DIR) is None:
            return Outcome.exit(1, "E0101 main.go] failed to create FS watcher for "
                                "/var/lib/kubelet/device-plugins/: no such file or directory\n")  # fmt: skip
        config, error = ctx.config()
        if error:
            return Outcome.exit(1, f"E0101 main.go] {error}\n")
        flags = (config or {}).get("flags") or {}
        fail = flags.get("failOnInitError", ctx.flag("FAIL_ON_INIT_ERROR", default=True))
        nvml = _nvml_error(ctx)
        if nvml:
            text = f"E0101 factory.go] Failed to initialize NVML: {nvml}.\n"
            return (
                Outcome.exit(1, text)
                if fail
                else Outcome.run(text + "No devices found. Waiting indefinitely.\n")
            )
        strategy = flags.get("migStrategy", ctx.env("MIG_STRATEGY") or "none")
        problem = _single_strategy_problem(ctx.hw.gpus) if strategy == "single" else ""
        if problem:
            return Outcome.exit(1, "E0101 main.go] error starting plugins: " + problem + "\n")
        return Outcome.run("I0101 main.go] Starting Plugins.\n")

    def sync(self, ctx):
        config, _ = ctx.config()
        config = config or {}
        sharing = config.get("sharing") or {}
        mps = sharing.get("mps")
        replicated = mps or sharing.get("timeSlicing") or {}
        if mps and not ctx.cluster.kubelet.mps_ready(ctx.node):
            ctx.cluster.devices.unregister(ctx.node, ctx.pod["metadata"]["uid"])
            return  # waits for the MPS control daemon
        ctx.cluster.devices.register(ctx.node, ctx.pod["metadata"]["uid"], self.registrations(ctx, config, replicated, bool(mps)))  # fmt: skip

    def stop(self, ctx):
        ctx.cluster.devices.unregister(ctx.node, ctx.pod["metadata"]["uid"])

    @staticmethod
    def registrations(ctx, config, replicated, mps) -> list[Registration]:
        strategy = (
            ((config.get("flags") or {}).get("migStrategy")) or ctx.env("MIG_STRATEGY") or "none"
        )
        replicas = 1
        for item in replicated.get("resources") or []:
            if item.get("name") == "nvidia.com/gpu":
                replicas = int(item.get("replicas", 1))
        fail_gt_one = replicated.get("failRequestsGreaterThanOne", mps)
        gpu_name = (
            "nvidia.com/gpu.shared"
            if replicated.get("renameByDefault") and replicas > 1
            else "nvidia.com/gpu"
        )
        pools: dict[str, list[Device]] = {}
        for gpu in ctx.hw.gpus:
            if gpu.mig_enabled and strategy == "single":
                pools.setdefault("nvidia.com/gpu", []).extend(
                    Device(m, gpu.uuid, m, p, gpu.healthy) for m, p in gpu.mig_devices()
                )
            elif gpu.mig_enabled and strategy == "mixed":
                for m, p in gpu.mig_devices():
                    pools.setdefault(f"nvidia.com/mig-{p}", []).append(
                        Device(m, gpu.uuid, m, p, gpu.healthy)
                    )
            else:
                pools.setdefault(gpu_name, []).append(
                    Device(gpu.uuid, gpu.uuid, healthy=gpu.healthy)
                )
        out = []
        for resource, devices in pools.items():
            shared = replicas > 1 and resource.startswith("nvidia.com/gpu")
            if shared:
                devices = [
                    Device(f"{d.id}::{i}", d.gpu, d.mig, d.profile, d.healthy)
                    for d in devices
                    for i in range(replicas)
                ]
            out.append(Registration(resource, {d.id: d for d in devices}, ctx.pod["metadata"]["uid"],
                                    bool(fail_gt_one), shared))  # fmt: skip
        return out


def _single_strategy_problem(gpus) -> str:
    """What k8s-device-plugin refuses under migStrategy=single (NVIDIA/k8s-device-plugin@1b826acc
    internal/rm/device_map.go): mixed MIG modes, a MIG-enabled GPU without MIG devices, or more
    than one MIG device type on the node."""
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return ""
    if any(not g.mig for g in enabled):
        return ("invalid MIG configuration: at least one device with migEnabled=true was not "
                "configured correctly: device has no MIG devices configured")  # fmt: skip
    if len({p for g in enabled for p in g.mig}) > 1:
        return "invalid MIG configuration: more than one MIG device type present on node"
    if len(enabled) != len(gpus):
        return "all devices on the node must be configured with the same migEnabled value"
    return ""


class MpsControlDaemon(Profile):
    name, operand = "mps-control-daemon", True

    def matches(self, container):
        return _command(container) == "mps-control-daemon"

    def start(self, ctx):
        if (ctx.container.get("command") or [])[1:2] == ["mount-shm"]:
            if not ctx.privileged:
                return Outcome.exit(32, "mount: /mps/shm: permission denied.\n")
            return Outcome.exit(0, "mounted /mps/shm\n")
        nvml = _nvml_error(ctx)
        if nvml:
            return Outcome.exit(1, f"E0101 main.go] failed to initialize NVML: {nvml}\n")
        config, error = ctx.config()
        if error:
            return Outcome.exit(1, f"E0101 main.go] {error}\n")
        if not ((config or {}).get("sharing") or {}).get("mps"):
            return Outcome.run("No MPS sharing configured; nothing to do.\n")
        return Outcome.run("Starting MPS control daemon for each GPU.\n")

    def sync(self, ctx):
        config, _ = ctx.config()
        if ((config or {}).get("sharing") or {}).get("mps"):
            ctx.cluster.kubelet.set_mps_ready(ctx.node, ctx.pod["metadata"]["uid"])


# ----------------------------------------------------------------------------- GFD


class GpuFeatureDiscovery(Profile):
    name, operand = "gpu-feature-discovery", True

    def matches(self, container):
        return _command(container) == "gpu-feature-discovery"

    def start(self, ctx):
        config, error = ctx.config()
        if error:
            return Outcome.exit(1, f"E0101 main.go] {error}\n")
        fail = ctx.flag("GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR", default=True)
        nvml = _nvml_error(ctx)
        if nvml and fail:
            return Outcome.exit(1, f"E0101 main.go] failed to create resource manager: failed to initialize NVML: {nvml}\n")  # fmt: skip
        error = self.output(ctx, config or {})
        if error:
            return Outcome.exit(1, f"E0101 main.go] {error}\nI0101 main.go] Exiting\n")
        return Outcome.run("I0101 main.go] Start running\nI0101 main.go] Creating Labels\n")

    def sync(self, ctx):
        config, _ = ctx.config()
        self.output(ctx, config or {})

    @staticmethod
    def uses_api(ctx) -> bool:
        return ctx.flag("GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API", default=True)

    def output(self, ctx: RunContext, config: dict) -> str:
        """Publish the labels; '' or the error GFD exits with."""
        labels = gfd_labels(ctx, config)
        if not self.uses_api(ctx):
            path = ctx.env("GFD_OUTPUT_FILE") or GFD_OUTPUT
            host = ctx.host_path(path)
            if host:  # without the hostPath the file stays inside the container
                ctx.hw.files[host] = "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))
            return ""
        node = ctx.env("NODE_NAME") or ""
        if not node:
            return "failed to create label outputer: required flag node-name not set"
        namespace = ctx.env("NAMESPACE") or "default"
        if not ctx.token_mounted():
            return ("failed to create clientsets: create client configuration: create in-cluster "
                    "client configuration: open /var/run/secrets/kubernetes.io/serviceaccount/token: "
                    "no such file or directory")  # fmt: skip
        name = f"nvidia-features-for-{node}"
        code, message = ctx.api("get", NFD_GROUP, NFD_VERSION, "nodefeatures", namespace, name)
        if code not in (200, 404):
            return f"failed to get NodeFeature object: {message}"
        existing = ctx.cluster.nodefeature(namespace, name) if code == 200 else None
        verb = "update" if existing else "create"
        code, message = ctx.api(
            verb, NFD_GROUP, NFD_VERSION, "nodefeatures", namespace, name if existing else None
        )
        if code != 200:
            return f'failed to {verb} NodeFeature object "{name}": {message}'
        ctx.cluster.put_nodefeature(namespace, name, node, labels, ctx.pod)
        return ""


def gfd_labels(ctx: RunContext, config: dict) -> dict[str, str]:
    """The labels GFD generates (a representative subset of internal/lm)."""
    hw = ctx.hw
    flags = config.get("flags") or {}
    strategy = flags.get("migStrategy") or ctx.env("MIG_STRATEGY") or "none"
    sharing = config.get("sharing") or {}
    mode = (
        "mps" if sharing.get("mps") else ("time-slicing" if sharing.get("timeSlicing") else "none")
    )
    if not hw.gpus or not hw.driver:
        return {}
    gpu = hw.gpus[0]
    major, minor, *rest = (hw.driver.split(".") + ["0", "0"])[:3]
    labels = {
        "nvidia.com/gpu.count": str(len(hw.gpus)),
        "nvidia.com/gpu.product": gpu.name.replace(" ", "-"),
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/cuda.driver-version.full": hw.driver,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rest[0] if rest else "0",
        "nvidia.com/mig.capable": "true" if "A100" in gpu.name or "H100" in gpu.name else "false",
        "nvidia.com/gpu.sharing-strategy": mode,
    }
    if strategy != "none":  # internal/lm/strategy.go@1b826acc; none: no label (real H100 run)
        labels["nvidia.com/mig.strategy"] = strategy
    if strategy == "single" and gpu.mig:
        labels["nvidia.com/gpu.product"] += f"-MIG-{gpu.mig[0]}"
    return labels


# ----------------------------------------------------------------------------- dcgm-exporter


class DcgmExporter(Profile):
    name, operand = "dcgm-exporter", True

    def matches(self, container):
        return _image(container).rsplit("/", 1)[-1].split(":")[0].split("@")[0] == "dcgm-exporter"

    def start(self, ctx):
        nvml = _nvml_error(ctx)
        if nvml:
            return Outcome.exit(1, f'level=ERROR msg="Failed to initialize NVML" error={nvml}\n')
        log = 'level=INFO msg="Kubernetes metrics collection enabled!"\n'
        if not ctx.token_mounted():
            log += ("level=WARN msg=\"Failed to get in-cluster config, pod labels will not be "
                    "available\"\n")  # fmt: skip
        return Outcome.run(log + 'level=INFO msg="Starting webserver"\n')


# ----------------------------------------------------------------------------- DRA driver


class DraPrestart(Profile):
    """kubelet-plugin-prestart.sh (init container): finds the driver under the driver root."""

    name, operand = "dra-kubelet-plugin-prestart", True

    def matches(self, container):
        return (container.get("command") or [])[-1:] == ["/usr/bin/kubelet-plugin-prestart.sh"]

    def start(self, ctx):
        if ctx.host_path("/driver-root-parent") is None or not ctx.hw.driver:
            return Outcome.exit(1, "nvidia-smi not found below NVIDIA_DRIVER_ROOT; is the "
                                "NVIDIA driver installed and loaded on the host?\n")  # fmt: skip
        return Outcome.exit(0, "found NVIDIA driver below the driver root\n")


class DraKubeletPlugin(Profile):
    """gpu-kubelet-plugin: NVML from the host driver through /driver-root, registration with
    the kubelet through the plugins_registry hostPath (the socket paths it announces must be
    the host's), then one ResourceSlice of driver gpu.nvidia.com with the node's GPUs, or its
    MIG devices for GPUs in MIG mode (cmd/gpu-kubelet-plugin/nvlib.go, deviceinfo.go@0882da8...:
    `gpu-<minor>` with attributes type=gpu, uuid, productName; MIG devices type=mig,
    uuid, parentUUID, profile; the MIG names here are SIMULATED, upstream encodes profile id
    and placement)."""

    name, operand = "gpu-kubelet-plugin", True
    DRIVER = "gpu.nvidia.com"

    def matches(self, container):
        return _command(container) == "gpu-kubelet-plugin"

    def start(self, ctx):
        if ctx.host_path("/driver-root") is None or not ctx.hw.driver:
            return Outcome.exit(1, "E0101 main.go] error creating driver: failed to initialize "
                                "NVML: ERROR_LIBRARY_NOT_FOUND\n")  # fmt: skip
        for env in ("KUBELET_REGISTRAR_DIRECTORY_PATH", "KUBELET_PLUGINS_DIRECTORY_PATH"):
            path = ctx.env(env) or ""
            if not path or ctx.host_path(path) != path:
                return Outcome.exit(1, f"E0101 main.go] {env}={path!r}: the kubelet cannot reach "
                                    "the plugin's sockets (not the same host path)\n")  # fmt: skip
        if not ctx.token_mounted():
            return Outcome.exit(1, "E0101 main.go] create client: open "
                                "/var/run/secrets/kubernetes.io/serviceaccount/token: no such file or directory\n")  # fmt: skip
        for verb, group, resource, fatal in API_CALLS[self.name]:
            code, message = ctx.api(verb, group, "v1", resource, None, None)
            if fatal and code != 200:
                return Outcome.exit(1, f"E0101 main.go] error starting plugin: {message}\n")
        self.publish(ctx)
        return Outcome.run("I0101 driver.go] Publishing resources\n")

    def sync(self, ctx):
        self.publish(ctx)

    def stop(self, ctx):
        ctx.cluster.dra.unregister(ctx.node, ctx.pod["metadata"]["uid"])

    def publish(self, ctx) -> None:
        from tests.cluster.emulator.dra import slice_for

        cluster = ctx.cluster
        devices = []
        for minor, gpu in enumerate(ctx.hw.gpus):
            if not gpu.healthy:
                continue
            if gpu.mig is not None:  # MIG mode: only its MIG devices (none: stranded, as upstream)
                for j, (mig_uuid, profile) in enumerate(gpu.mig_devices()):
                    devices.append({"name": f"gpu-{minor}-mig-{profile.replace('.', '')}-0-{j}",
                                    "attributes": {"type": {"string": "mig"}, "uuid": {"string": mig_uuid},
                                                   "parentUUID": {"string": gpu.uuid},
                                                   "profile": {"string": profile},
                                                   "productName": {"string": gpu.name}}})  # fmt: skip
                continue
            devices.append({"name": f"gpu-{minor}",
                            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid},
                                           "productName": {"string": gpu.name}},
                            "capacity": {"memory": {"value": f"{gpu.memory_mib}Mi"}}})  # fmt: skip
        node = cluster.node(ctx.node)
        body = slice_for(node, self.DRIVER, devices)
        kind = cluster.kind("resource.k8s.io/v1", "ResourceSlice")
        existing = cluster.store.get(kind, None, body["metadata"]["name"])
        if existing is None:
            cluster.api.create(kind, None, body)
        elif existing.get("spec") != body["spec"]:
            import copy

            new = copy.deepcopy(existing)
            new["spec"] = body["spec"]
            cluster.api.writer.commit(kind, existing, new)
        cluster.dra.register(ctx.node, self.DRIVER, ctx.pod["metadata"]["uid"])


# ----------------------------------------------------------------------------- verification


class NvidiaSmi(Profile):
    name = "nvidia-smi"

    def matches(self, container):
        return _command(container) == "nvidia-smi"

    def start(self, ctx):
        if ctx.runtime != "nvidia" and not any(d.cdi for d in ctx.devices):
            return Outcome.exit(127, 'exec: "nvidia-smi": executable file not found in $PATH\n')
        if not ctx.hw.driver:
            return Outcome.exit(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")  # fmt: skip
        return Outcome.exit(0, smi_listing(ctx))


def visible(ctx: RunContext) -> list[Device]:
    """Devices the container sees. Under the nvidia runtime: the device plugin's; without any,
    the CUDA image's NVIDIA_VISIBLE_DEVICES=all makes every GPU visible (isolation is the
    device plugin's). Devices a DRA driver prepared come through CDI under any runtime, and the
    nvidia runtime still adds what NVIDIA_VISIBLE_DEVICES=all asks for (the GPU claim's CDI
    edits do not set it to void: cmd/gpu-kubelet-plugin/cdi.go@0882da8720c28763137e0987778ec476ec4cf8df)."""
    cdi = [d for d in ctx.devices if d.cdi]
    if ctx.runtime != "nvidia":
        return cdi
    plugin = [d for d in ctx.devices if not d.cdi]
    legacy = plugin or [Device(g.uuid, g.uuid) for g in ctx.hw.gpus]
    seen, out = set(), []
    for device in cdi + legacy:
        if (device.gpu, device.mig) not in seen:
            seen.add((device.gpu, device.mig))
            out.append(device)
    return out


def smi_listing(ctx: RunContext) -> str:
    """`nvidia-smi -L` inside the container: one line per GPU, MIG devices indented."""
    by_gpu: dict[str, list[Device]] = {}
    for device in visible(ctx):
        by_gpu.setdefault(device.gpu, []).append(device)
    names = {g.uuid: g.name for g in ctx.hw.gpus}
    lines = []
    for index, (gpu, devices) in enumerate(sorted(by_gpu.items())):
        lines.append(f"GPU {index}: {names.get(gpu, 'NVIDIA GPU')} (UUID: {gpu})")
        for i, device in enumerate(d for d in devices if d.mig):
            lines.append(f"  MIG {device.profile} Device {i}: (UUID: {device.mig})")
    return "\n".join(lines) + "\n"


class VectorAdd(Profile):
    name = "vectoradd"

    def matches(self, container):
        return "vectoradd" in _image(container).lower()

    def start(self, ctx):
        if ctx.runtime != "nvidia" or not ctx.hw.driver or not visible(ctx):
            return Outcome.exit(1, "Failed to allocate device vector A (error code CUDA driver version is insufficient for CUDA runtime version)!\n")  # fmt: skip
        return Outcome.exit(0, "[Vector addition of 50000 elements]\nCopy input data from the host memory to the CUDA device\nTest PASSED\nDone\n")  # fmt: skip


PROFILES: list[Profile] = [DevicePlugin(), MpsControlDaemon(), GpuFeatureDiscovery(),
                           DcgmExporter(), DraPrestart(), DraKubeletPlugin(), NvidiaSmi(),
                           VectorAdd()]  # fmt: skip


def profile_for(container: dict) -> Profile:
    for profile in PROFILES:
        if profile.matches(container):
            return profile
    return Profile()
