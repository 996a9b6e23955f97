"""The typed Kubernetes-side configuration: every `gpustack_k8s_*` variable, checked once.

Values come from the inventory (cluster-wide variables) and `-e`; `-e KEY=VALUE` gives
strings, so fields accept "4" for 4 and "true"/"false" for booleans (pydantic's lax mode).
A mistake leaves as BadInput (`Error:` + `Hint:`, exit 2), never as a pydantic traceback.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpustack.errors import BadInput

VAR_PREFIX = "gpustack_k8s_"

# DNS-1123 label: what Kubernetes accepts as a namespace name.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Registry host with optional port, then optional path components (no scheme, no tag).
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*)(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = re.compile(rf"^{_HOST}(?:/{_PATH_COMPONENT})*$")
_REPOSITORY = re.compile(rf"^(?:{_HOST}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
# DNS-1123 subdomain: what Kubernetes accepts as a Secret or PriorityClass name.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# An absolute host path without `..`, `//` or a trailing slash (a hostPath the kubelet mounts).
# Label keys and values (k8s.io/apimachinery validation.IsQualifiedName, IsValidLabelValue)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# monitoring.coreos.com/v1 Duration's pattern (github.com/prometheus-operator/prometheus-operator/
# pkg/apis/monitoring@v0.95.2 v1/types.go); empty: Prometheus' global interval
_PROMETHEUS_DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_LABEL_VALUE.match(name))


_HOST_PATH = re.compile(r"^(/[A-Za-z0-9._+@-]+)+$")

# gpu_allocation modes that replace NVIDIA's device plugin: who does (for refusals of its
# settings) and how that one shares GPUs instead.
_REPLACES_DEVICE_PLUGIN = {
    "dra": ("NVIDIA's DRA driver", "ResourceClaim configuration"),
    "hami": ("HAMi's plugin", f"{VAR_PREFIX}hami_device_split_count"),
    "volcano": ("Volcano's vGPU device plugin", f"{VAR_PREFIX}volcano_device_split_count"),
}
# Of those, the ones that split whole GPUs by memory and compute (deployed without MIG).
_SHARING_PLUGINS = ("hami", "volcano")

# Images the manifests use, by the name `ClusterConfig.image()` takes.
IMAGES = (
    "device_plugin",
    "gfd",
    "dcgm_exporter",
    "verify",
    "vector_add",
    "dra_driver",
    "hami",
    "hami_kube_scheduler",
    "volcano_device_plugin",
)
# kube-scheduler's version in the HAMi scheduler pod: the cluster's, as HAMi's chart takes it
# (`resolvedKubeSchedulerTag`/`strippedKubeVersion`, charts/hami/templates/_helpers.tpl@v2.10.0)
_KUBE_VERSION = re.compile(r"^(v[0-9]+\.[0-9]+\.[0-9]+)")


def split_registry(repository: str) -> tuple[str | None, str]:
    """`nvcr.io/nvidia/x` -> ("nvcr.io", "nvidia/x"); `busybox` -> (None, "busybox").

    The first component is a registry when it holds a dot or a port, or is `localhost`
    (the rule container runtimes use).
    """
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, repository


def join_image(repository: str, tag: str) -> str:
    """A tag is joined with `:`, a digest (sha256:...) with `@`."""
    return f"{repository}@{tag}" if _DIGEST.match(tag) else f"{repository}:{tag}"


class ClusterConfig(BaseModel):
    """What gpustack deploys on the Kubernetes side; every field has a working default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = "gpustack-system"
    registry: str | None = None
    device_plugin_image: str = "nvcr.io/nvidia/k8s-device-plugin"
    device_plugin_tag: str = "v0.20.0"
    mig_strategy: Literal["none", "single", "mixed"] = "none"
    time_slicing_replicas: int = Field(default=1, ge=1, le=256)
    mps_replicas: int = Field(default=1, ge=1, le=48)
    rename_by_default: bool = False
    fail_on_init_error: bool = True
    gfd_enabled: bool = True
    gfd_image: str | None = None
    gfd_tag: str | None = None
    # How GFD publishes labels: NFD's NodeFeature API, the features.d file, or whichever the
    # cluster supports (docs/kubernetes.md, GPU Feature Discovery).
    gfd_mode: Literal["auto", "node-feature-api", "feature-file"] = "auto"
    dcgm_exporter_enabled: bool = True
    dcgm_exporter_image: str = "nvcr.io/nvidia/k8s/dcgm-exporter"
    dcgm_exporter_tag: str = "4.6.0-4.8.3-distroless"
    verify_image: str = "nvcr.io/nvidia/cuda"
    verify_tag: str = "12.9.1-base-ubuntu22.04"
    vector_add_image: str | None = None
    dcgm_scrape: bool = False
    # dcgm-exporter's ServiceMonitor (rendered where its CRD is served), as the GPU Operator's
    # ClusterPolicy dcgmExporter.serviceMonitor: additionalLabels (e.g. the `release` label
    # kube-prometheus-stack's default selector wants), interval, honorLabels.
    servicemonitor_labels: dict[str, str] = Field(default_factory=dict)
    servicemonitor_interval: str = "30s"
    servicemonitor_honor_labels: bool = False
    daemonset_timeout: int = Field(default=300, ge=10, le=3600)
    capacity_timeout: int = Field(default=150, ge=10, le=3600)
    verify_timeout: int = Field(default=300, ge=10, le=3600)
    # Distributions and private registries (docs/kubernetes.md, "Distributions and registries").
    kubelet_root_dir: str = "/var/lib/kubelet"
    runtime_class: str = "nvidia"
    priority_class: str = "system-node-critical"
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    compat_with_cpu_manager: bool = False
    # How GPUs reach pods: the device plugin (`nvidia.com/gpu` extended resources), NVIDIA's
    # DRA driver for GPUs (ResourceClaims; needs resource.k8s.io/v1, docs/dra.md), or HAMi's
    # device plugin and scheduler (GPU memory and compute split per pod; docs/sharing.md), or
    # Volcano's vGPU device plugin for a Volcano scheduler the user runs (docs/sharing.md).
    gpu_allocation: Literal["device-plugin", "dra", "hami", "volcano"] = "device-plugin"
    dra_driver_image: str = "nvcr.io/nvidia/k8s-dra-driver-gpu"
    dra_driver_tag: str = "v25.12.0"
    # HAMi (Project-HAMi/HAMi v2.10.0, charts/hami/values.yaml@4707fb02): one image for the
    # device plugin, its monitor and the scheduler extender (global.imageTag); kube-scheduler
    # from the chart's registry, at the cluster's version unless a tag is set.
    hami_image: str = "docker.io/projecthami/hami"
    hami_tag: str = "v2.10.0"
    # Kubernetes' own registry, not the chart's mirror (docs/upstream-parity.md says why).
    hami_kube_scheduler_image: str = "registry.k8s.io/kube-scheduler"
    hami_kube_scheduler_tag: str | None = None
    hami_device_split_count: int = Field(default=10, ge=1, le=1024)
    hami_device_memory_scaling: float = Field(default=1.0, gt=0, le=100)
    hami_default_mem: int = Field(default=0, ge=0)
    hami_default_cores: int = Field(default=0, ge=0, le=100)
    hami_node_scheduler_policy: Literal["binpack", "spread"] = "binpack"
    hami_gpu_scheduler_policy: Literal["binpack", "spread"] = "spread"
    # MiB of GPU memory the verification pod asks HAMi for (nvidia.com/gpumem): nvidia-smi in
    # the pod must report it as the GPU's total memory, the limit HAMi-core enforces.
    hami_verify_memory: int = Field(default=1024, ge=1, le=1048576)
    # Volcano (gpustack_k8s_gpu_allocation=volcano): Volcano's vGPU device plugin
    # (Project-HAMi/volcano-vgpu-device-plugin v1.12.0, volcano-vgpu-device-plugin.yml@afefcc2f);
    # Volcano itself is the user's, its scheduler ConfigMap is checked, never written.
    volcano_device_plugin_image: str = "docker.io/projecthami/volcano-vgpu-device-plugin"
    volcano_device_plugin_tag: str = "v1.12.0"
    volcano_device_split_count: int = Field(default=10, ge=1, le=1024)
    # MiB of GPU memory each pod of verify's `share` Job asks for (volcano.sh/vgpu-memory):
    # nvidia-smi in the pod must report it as the GPU's total memory, the limit HAMi-core enforces.
    volcano_verify_memory: int = Field(default=1024, ge=1, le=1048576)
    volcano_namespace: str = "volcano-system"
    volcano_scheduler_configmap: str = "volcano-scheduler-configmap"
    volcano_scheduler_name: str = "volcano"

    @field_validator(
        "registry",
        "gfd_image",
        "gfd_tag",
        "vector_add_image",
        "hami_kube_scheduler_tag",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return value.strip() if isinstance(value, str) else value

    @field_validator("namespace", "volcano_namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if len(value) > 63 or not _DNS_LABEL.match(value):
            raise ValueError(
                f"{value!r} is not a valid namespace name "
                "(lower-case letters, digits and '-', at most 63, starting and ending alphanumeric)"
            )
        return value

    @field_validator("kubelet_root_dir", mode="before")
    @classmethod
    def _kubelet_root_dir(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            value = value.rstrip("/") if len(value) > 1 else value
            if not _HOST_PATH.match(value) or "/../" in value + "/" or "/./" in value + "/":
                raise ValueError(
                    f"{value!r} is not an absolute directory path (e.g. /var/lib/k0s/kubelet)"
                )
        return value

    @field_validator("runtime_class", "priority_class", mode="before")
    @classmethod
    def _optional_name(cls, value: Any, info: ValidationInfo) -> Any:
        # "" (or null from YAML) leaves the pod field unset; otherwise a Kubernetes name.
        # A RuntimeClass here is also its handler, which must be a DNS label.
        if value is None:
            return ""
        if isinstance(value, str):
            value = value.strip()
            label = info.field_name == "runtime_class"
            pattern, limit = (_DNS_LABEL, 63) if label else (_DNS_SUBDOMAIN, 253)
            if value and (len(value) > limit or not pattern.match(value)):
                raise ValueError(
                    f"{value!r} is not a valid name (lower-case letters, digits, '-'"
                    f"{'' if label else ' and .'}, at most {limit}), or empty to leave it unset"
                )
        return value

    @field_validator("image_pull_secrets", mode="before")
    @classmethod
    def _pull_secrets(cls, value: Any) -> Any:
        # `-e gpustack_k8s_image_pull_secrets=a,b` gives a string; YAML gives a list.
        if value is None:
            return ()
        if isinstance(value, str):
            value = [part for part in (p.strip() for p in value.split(",")) if part]
        if isinstance(value, list | tuple):
            for name in value:
                if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
                    raise ValueError(f"{name!r} is not a Secret name")
            if len(set(value)) != len(value):
                raise ValueError(f"{list(value)!r} names a Secret twice")
            return tuple(value)
        return value

    @field_validator("servicemonitor_labels", mode="before")
    @classmethod
    def _servicemonitor_labels(cls, value: Any) -> Any:
        # `-e gpustack_k8s_servicemonitor_labels=release=kube-prometheus-stack,team=ml` gives a
        # string; YAML or JSON gives a mapping.
        if value is None or value == "":
            return {}
        if isinstance(value, str):
            pairs = [p.strip() for p in value.split(",") if p.strip()]
            if any("=" not in p for p in pairs):
                raise ValueError("expected KEY=VALUE pairs separated by commas, or a mapping")
            value = dict(p.split("=", 1) for p in pairs)
        if not isinstance(value, dict):
            raise ValueError("expected a mapping of label keys to values")
        for key, label in value.items():
            if not isinstance(key, str) or not _label_key(key):
                raise ValueError(f"{key!r} is not a label key")
            if key.startswith(("app.kubernetes.io/", "gpustack.io/")):
                raise ValueError(f"{key!r} is gpustack's own label (it finds its objects by it)")
            if not isinstance(label, str) or not (label == "" or _LABEL_VALUE.match(label)):
                raise ValueError(f"{label!r} (of {key}) is not a label value")
        return value

    @field_validator("servicemonitor_interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        if not _PROMETHEUS_DURATION.match(value):
            raise ValueError(f"{value!r} is not a Prometheus duration")
        return value

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.rstrip("/")
        if "://" in value or not _REGISTRY.match(value):
            raise ValueError(f"{value!r} is not a registry (host[:port][/path], no scheme, no tag)")
        return value

    @field_validator(
        "device_plugin_image",
        "gfd_image",
        "dcgm_exporter_image",
        "verify_image",
        "dra_driver_image",
        "hami_image",
        "hami_kube_scheduler_image",
        "volcano_device_plugin_image",
    )
    @classmethod
    def _repository(cls, value: str | None) -> str | None:
        if value is not None and not _REPOSITORY.match(value):
            raise ValueError(
                f"{value!r} is not an image repository (e.g. nvcr.io/nvidia/k8s-device-plugin; "
                "no tag: the tag has its own variable)"
            )
        return value

    @field_validator(
        "device_plugin_tag",
        "gfd_tag",
        "dcgm_exporter_tag",
        "verify_tag",
        "dra_driver_tag",
        "hami_tag",
        "hami_kube_scheduler_tag",
        "volcano_device_plugin_tag",
    )
    @classmethod
    def _tag(cls, value: str | None) -> str | None:
        if value is not None and not (_TAG.match(value) or _DIGEST.match(value)):
            raise ValueError(f"{value!r} is not an image tag (e.g. v0.20.0) or sha256:<digest>")
        return value

    @field_validator("vector_add_image")
    @classmethod
    def _full_reference(cls, value: str | None) -> str | None:
        if value is None:
            return None
        repository, tag = _split_reference(value)
        if not _REPOSITORY.match(repository) or not (_TAG.match(tag) or _DIGEST.match(tag)):
            raise ValueError(
                f"{value!r} is not an image reference with a tag "
                "(e.g. nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0)"
            )
        return value

    @model_validator(mode="after")
    def _sharing(self) -> ClusterConfig:
        if self.time_slicing_replicas > 1 and self.mps_replicas > 1:
            raise ValueError(
                f"{VAR_PREFIX}time_slicing_replicas={self.time_slicing_replicas} and "
                f"{VAR_PREFIX}mps_replicas={self.mps_replicas}: the device plugin shares "
                "GPUs one way, time-slicing or MPS"
            )
        if self.mps_replicas > 1 and self.mig_strategy != "none":
            raise ValueError(
                f"{VAR_PREFIX}mps_replicas={self.mps_replicas} with "
                f"{VAR_PREFIX}mig_strategy={self.mig_strategy}: MPS sharing does not work with MIG"
            )
        mode = self.gpu_allocation
        if mode in _REPLACES_DEVICE_PLUGIN:
            who, instead = _REPLACES_DEVICE_PLUGIN[mode]
            shared = {"time_slicing_replicas": self.time_slicing_replicas,
                      "mps_replicas": self.mps_replicas}  # fmt: skip
            for field, value in shared.items():
                if value > 1:
                    raise ValueError(
                        f"{VAR_PREFIX}{field}={value} with {VAR_PREFIX}gpu_allocation={mode}: "
                        f"sharing replicas are NVIDIA device plugin settings; {who} shares "
                        f"GPUs through {instead} instead"
                    )
            if self.compat_with_cpu_manager:
                raise ValueError(
                    f"{VAR_PREFIX}compat_with_cpu_manager=true with {VAR_PREFIX}gpu_allocation"
                    f"={mode}: it is an NVIDIA device plugin setting, which {who} replaces"
                )
        if mode in _SHARING_PLUGINS and self.mig_strategy != "none":
            raise ValueError(
                f"{VAR_PREFIX}mig_strategy={self.mig_strategy} with {VAR_PREFIX}"
                f"gpu_allocation={mode}: {_REPLACES_DEVICE_PLUGIN[mode][0]} is deployed with "
                "migStrategy none (it splits whole GPUs by memory and compute; MIG is the "
                "device plugin's or the DRA driver's)"
            )
        return self

    # -- derived values -------------------------------------------------------------

    def image(self, which: str) -> str:
        """Full image reference for `which` (one of IMAGES), after the registry override."""
        if which == "device_plugin":
            repository, tag = self.device_plugin_image, self.device_plugin_tag
        elif which == "gfd":  # GFD ships in the device plugin image since v0.15
            repository = self.gfd_image or self.device_plugin_image
            tag = self.gfd_tag or self.device_plugin_tag
        elif which == "dcgm_exporter":
            repository, tag = self.dcgm_exporter_image, self.dcgm_exporter_tag
        elif which == "dra_driver":
            repository, tag = self.dra_driver_image, self.dra_driver_tag
        elif which == "hami":
            repository, tag = self.hami_image, self.hami_tag
        elif which == "hami_kube_scheduler":
            repository = self.hami_kube_scheduler_image
            tag = self.hami_kube_scheduler_tag or ""
            if not tag:
                raise BadInput(
                    "no kube-scheduler version for HAMi's scheduler (the cluster's is not known "
                    "here)",
                    "set gpustack_k8s_hami_kube_scheduler_tag to the cluster's version, e.g. "
                    "v1.36.3",
                )
        elif which == "volcano_device_plugin":
            repository, tag = self.volcano_device_plugin_image, self.volcano_device_plugin_tag
        elif which == "verify":
            repository, tag = self.verify_image, self.verify_tag
        elif which == "vector_add":
            if not self.vector_add_image:
                raise BadInput(
                    "no CUDA vectorAdd image configured",
                    "set gpustack_k8s_vector_add_image, e.g. "
                    "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                )
            repository, tag = _split_reference(self.vector_add_image)
        else:
            raise ValueError(f"unknown image {which!r}; one of {', '.join(IMAGES)}")
        if self.registry:
            repository = f"{self.registry}/{split_registry(repository)[1]}"
        return join_image(repository, tag)

    def gfd_node_feature_api(self, nfd_api_served: bool) -> bool:
        """Whether GFD publishes through NFD's NodeFeature API (else the features.d file).

        `auto` follows the cluster: the API when `nodefeatures.nfd.k8s-sigs.io` is served.
        """
        if self.gfd_mode == "auto":
            return nfd_api_served
        return self.gfd_mode == "node-feature-api"

    @property
    def gpus_per_device(self) -> int:
        """How many `nvidia.com/gpu` units one physical GPU advertises (time-slicing/MPS, or
        HAMi's deviceSplitCount: its plugin registers that many devices per GPU)."""
        if self.gpu_allocation == "hami":
            return self.hami_device_split_count
        if self.gpu_allocation == "volcano":
            return self.volcano_device_split_count
        return max(self.time_slicing_replicas, self.mps_replicas)

    @property
    def sharing(self) -> Literal["none", "time-slicing", "mps"]:
        if self.mps_replicas > 1:
            return "mps"
        return "time-slicing" if self.time_slicing_replicas > 1 else "none"

    @property
    def resource_name(self) -> str:
        """The extended resource GPU pods request (renamed when sharing with renameByDefault)."""
        if self.gpu_allocation == "volcano":  # Volcano's vGPU plugin: shares of a GPU
            return "volcano.sh/vgpu-number"
        if self.rename_by_default and self.sharing != "none":
            return "nvidia.com/gpu.shared"
        return "nvidia.com/gpu"

    @property
    def pod_common(self) -> dict[str, Any]:
        """Pod-spec fields every gpustack pod carries (priority, RuntimeClass, pull secrets).

        Empty settings are left out, so the pod gets the cluster's defaults.
        """
        fields: dict[str, Any] = {}
        if self.priority_class:
            fields["priorityClassName"] = self.priority_class
        if self.runtime_class:
            fields["runtimeClassName"] = self.runtime_class
        if self.image_pull_secrets:
            fields["imagePullSecrets"] = [{"name": name} for name in self.image_pull_secrets]
        return fields

    def kubelet_path(self, name: str) -> str:
        """A directory under the kubelet's root on the host (device-plugins, pod-resources)."""
        return f"{self.kubelet_root_dir.rstrip('/')}/{name}"

    @property
    def dra(self) -> bool:
        """GPUs are allocated through NVIDIA's DRA driver (ResourceClaims), not the plugin."""
        return self.gpu_allocation == "dra"

    @property
    def hami(self) -> bool:
        """GPUs are allocated through HAMi's device plugin and scheduler extender."""
        return self.gpu_allocation == "hami"

    @property
    def volcano(self) -> bool:
        """GPUs are shared through Volcano's vGPU device plugin and Volcano's scheduler."""
        return self.gpu_allocation == "volcano"

    def for_cluster(self, version: str | None) -> ClusterConfig:
        """This configuration with HAMi's kube-scheduler tag taken from the cluster's version
        (`v1.36.3+k3s1` -> `v1.36.3`, as HAMi's chart strips it) unless the user set one."""
        if not self.hami or self.hami_kube_scheduler_tag or not version:
            return self
        match = _KUBE_VERSION.match(version)
        if not match:
            return self
        return self.model_copy(update={"hami_kube_scheduler_tag": match.group(1)})

    @property
    def capacity_predictable(self) -> bool:
        """Whether `gpus x gpus_per_device` is the node's expected capacity.

        With MIG the count depends on the MIG layout on the node (mixed exposes
        `nvidia.com/mig-*` resources instead), so only "some capacity" can be checked.
        """
        return self.mig_strategy == "none"

    # -- construction from Ansible variables ----------------------------------------

    @classmethod
    def from_vars(cls, variables: dict[str, Any]) -> ClusterConfig:
        """Build from variables named `gpustack_k8s_<field>`; other variables are ignored."""
        known = set(cls.model_fields)
        values: dict[str, Any] = {}
        for key, value in variables.items():
            if not key.startswith(VAR_PREFIX):
                continue
            field = key.removeprefix(VAR_PREFIX)
            if field not in known:
                close = difflib.get_close_matches(field, sorted(known), n=1)
                hint = (
                    f"did you mean {VAR_PREFIX}{close[0]}?"
                    if close
                    else "see docs/kubernetes.md for the gpustack_k8s_* variables"
                )
                raise BadInput(f"unknown variable {key}", hint)
            values[field] = value
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise _bad_input(exc, values) from None


def _split_reference(reference: str) -> tuple[str, str]:
    """`repo:tag` or `repo@sha256:...` -> (repo, tag-or-digest); no tag gives ''."""
    if "@" in reference:
        repository, _, digest = reference.partition("@")
        return repository, digest
    head, sep, tag = reference.rpartition(":")
    if sep and "/" not in tag:
        return head, tag
    return reference, ""


_HINTS = {
    "namespace": "e.g. gpustack_k8s_namespace=gpu-operator-lite",
    "registry": "e.g. gpustack_k8s_registry=registry.example:5000/nvidia-mirror",
    "mig_strategy": "choose none, single or mixed",
    "gfd_mode": "choose auto, node-feature-api or feature-file",
    "gpu_allocation": (
        "choose device-plugin, dra (NVIDIA's DRA driver, Kubernetes >= 1.34) or hami "
        "(HAMi's device plugin and scheduler, docs/sharing.md)"
    ),
    "hami_device_split_count": "how many pods may share one GPU, 1 to 1024",
    "hami_device_memory_scaling": "1 = no oversubscription; above 1 oversubscribes GPU memory",
    "hami_default_mem": "MiB of GPU memory a pod gets when it asks none; 0 = the whole GPU",
    "hami_default_cores": "percent of a GPU's compute a pod gets when it asks none, 0 to 100",
    "hami_node_scheduler_policy": "choose binpack or spread",
    "hami_gpu_scheduler_policy": "choose binpack or spread",
    "hami_verify_memory": "MiB the verification pod asks for, e.g. 1024",
    "volcano_verify_memory": "MiB each pod of the share check's Volcano Job asks for, e.g. 1024",
    "time_slicing_replicas": "1 turns time-slicing off; 2 or more shares each GPU",
    "mps_replicas": "1 turns MPS off; 2 to 48 shares each GPU through MPS",
    "vector_add_image": (
        "a full reference, e.g. nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"
    ),
    "daemonset_timeout": "seconds, 10 to 3600",
    "capacity_timeout": "seconds, 10 to 3600",
    "verify_timeout": "seconds, 10 to 3600",
    "kubelet_root_dir": "the kubelet's --root-dir, e.g. /var/lib/k0s/kubelet (k0s)",
    "runtime_class": "the RuntimeClass (= handler) of the nvidia runtime, or empty for none",
    "priority_class": "a PriorityClass name, or empty for none",
    "image_pull_policy": "choose IfNotPresent, Always or Never",
    "image_pull_secrets": "Secret names in the namespace, as a list or comma-separated",
    "servicemonitor_labels": "e.g. -e gpustack_k8s_servicemonitor_labels=release=my-prometheus",
    "servicemonitor_interval": "e.g. 30s or 1m",
}


def _bad_input(exc: ValidationError, values: dict[str, Any]) -> BadInput:
    err = exc.errors()[0]
    message = str(err["msg"]).removeprefix("Value error, ")
    if not err["loc"]:  # a check across fields (model validator)
        return BadInput(
            message, "set one of them back to its default (1, none, false, device-plugin)"
        )
    field = str(err["loc"][0])
    shown = values.get(field, err.get("input"))
    message = message[0].lower() + message[1:] if message else message
    hint = _HINTS.get(field)
    if hint is None:
        if field.endswith("_image"):
            hint = "an image repository without tag, e.g. nvcr.io/nvidia/k8s-device-plugin"
        elif field.endswith("_tag"):
            hint = "an image tag, e.g. v0.20.0"
        elif field.endswith(("_enabled", "_scrape", "_by_default", "_error", "_manager")):
            hint = "use true or false"
        else:
            hint = "see docs/kubernetes.md (Configuration)"
    return BadInput(f"{VAR_PREFIX}{field}={shown}: {message}", hint)
