"""Real cluster components built from their Go modules, pinned here and kept in a cache.

The lab's Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet), etcd
and kwok are built from the Go module proxy at the versions below: this module is the one place
that pins them. A build happens once per (component, version, Go version) and lands in
`cache_root()/<name>-<version>-<go version>/`, with `bin/` and `build.json` (build time, peak
memory, sizes); the lab, the test suites, CI and developers reuse it and rebuild only when it
is missing.

`k8s.io/kubernetes` cannot be installed with `go install`: its go.mod replaces the `k8s.io/*`
staging modules with `./staging/...` paths. It is built through a wrapper module that requires
it and maps each staging module to its published `v0.<minor>.<patch>` release.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpustack.errors import LabError

KUBERNETES_VERSION = "1.36.3"
ETCD_VERSION = "3.6.16"
KWOK_VERSION = "0.8.0"
# NVIDIA's operands. gpustack renders k8s-device-plugin v0.20.0 by default, but the Go module
# proxy answers 403 for that version (and for v0.19.2); v0.19.3 is the newest it serves.
DEVICE_PLUGIN_VERSION = "0.19.3"
DEVICE_PLUGIN_COMMIT = "570e776d6813cb9f3e9c8c105cf8d79989db6650"  # the proxy's Origin of v0.19.3
CONTAINER_TOOLKIT_VERSION = "1.20.2"
# Upstream's Makefiles link every command with these: NVML (and libnvidia-container's symbols)
# are looked up at run time, so nothing of NVIDIA's is needed to build.
_NVIDIA_EXTLDFLAGS = "-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files"

# Prometheus Operator's CRDs (the ServiceMonitor that dcgm-exporter's scrape target is) are
# generated from its API types with controller-gen, as upstream generates them: the module proxy
# serves the types' module, not the repository whose example/prometheus-operator-crd holds them.
CONTROLLER_TOOLS_VERSION = "0.19.0"
PROMETHEUS_OPERATOR_APIS = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"
PROMETHEUS_OPERATOR_APIS_VERSION = "0.95.2"
# Volcano's CRDs (the Volcano Job gpustack's verification runs under
# gpustack_k8s_gpu_allocation=volcano), from the API types Volcano generates them from
# (volcano-sh/volcano Makefile@ed72c7c815a9fd547a787134676f73d42e9d049c, target `manifests`):
# the proxy serves volcano.sh/apis, not volcano.sh/volcano.
VOLCANO_APIS = "volcano.sh/apis"
VOLCANO_APIS_VERSION = "1.13.0"

CACHE_ENV = "GPUSTACK_COMPONENTS_CACHE"


@dataclass(frozen=True)
class GoComponent:
    """What to build: a module at a version, the packages whose binaries we keep."""

    name: str
    version: str
    module: str  # the module the wrapper requires
    packages: tuple[str, ...]  # import paths of the main packages
    ldflags: tuple[str, ...] = ()
    cgo: bool = False
    # Files of the module kept beside the binaries, under share/ (e.g. kwok's stage YAMLs).
    share: tuple[str, ...] = ()
    # Extra go.mod lines for the wrapper, computed from the required module's own go.mod.
    replaces: Callable[[str], list[str]] | None = field(default=None, compare=False)

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(p.rstrip("/").rsplit("/", 1)[-1] for p in self.packages)


def _kubernetes_replaces(gomod: str) -> list[str]:
    """`k8s.io/api => ./staging/src/k8s.io/api` -> `k8s.io/api => k8s.io/api v0.36.3`."""
    minor_patch = KUBERNETES_VERSION.split(".", 1)[1]
    names = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", gomod, re.M)))
    if not names:
        raise LabError(
            f"k8s.io/kubernetes v{KUBERNETES_VERSION}'s go.mod names no staging module",
            "the module's layout changed; see gpustack/lab/components.py",
        )
    return [f"replace {name} => {name} v0.{minor_patch}" for name in names]


def _kubernetes_ldflags() -> tuple[str, ...]:
    major, minor, _ = KUBERNETES_VERSION.split(".")
    version = f"v{KUBERNETES_VERSION}"
    base = "k8s.io/component-base/version"
    return (
        f"-X {base}.gitVersion={version}",
        f"-X {base}.gitMajor={major}",
        f"-X {base}.gitMinor={minor}",
        f"-X {base}.gitTreeState=clean",
        f"-X {base}.buildDate=1970-01-01T00:00:00Z",
        f"-X k8s.io/client-go/pkg/version.gitVersion={version}",
    )


KUBERNETES = GoComponent(
    name="kubernetes",
    version=KUBERNETES_VERSION,
    module="k8s.io/kubernetes",
    packages=(
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-controller-manager",
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "k8s.io/kubernetes/cmd/kubelet",
    ),
    ldflags=_kubernetes_ldflags(),
    replaces=_kubernetes_replaces,
)

ETCD = GoComponent(
    name="etcd",
    version=ETCD_VERSION,
    module="go.etcd.io/etcd/server/v3",
    # etcdmain is etcd's own main package (go.etcd.io/etcd/server/v3/etcdmain.Main); the
    # wrapper's main calls it, so the binary is the etcd server etcd's release ships.
    packages=("gpustack.local/build/etcd",),
    ldflags=(),
)

KWOK = GoComponent(
    name="kwok",
    version=KWOK_VERSION,
    module="sigs.k8s.io/kwok",
    packages=("sigs.k8s.io/kwok/cmd/kwok",),
    # kwok >= 0.7 runs no stage unless given some: upstream's own "fast" node and pod stages
    # and the node heartbeat (without it the node lifecycle controller marks nodes NotReady).
    share=(
        "kustomize/stage/node/fast/node-initialize.yaml",
        "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
        "kustomize/stage/pod/fast/pod-ready.yaml",
        "kustomize/stage/pod/fast/pod-complete.yaml",
        "kustomize/stage/pod/fast/pod-delete.yaml",
        # Its ClusterLogs CRD: tests serve a stand-in pod's log from a file through it.
        "kustomize/crd/bases/kwok.x-k8s.io_clusterlogs.yaml",
    ),
)

# The commands upstream's image carries (deployments/container/Dockerfile: /usr/bin/config-manager,
# gpu-feature-discovery, mps-control-daemon, nvidia-device-plugin), built as its Makefile's
# `cmds` target builds them: cgo on (go-nvml dlopens libnvidia-ml.so.1), the version stamped.
DEVICE_PLUGIN = GoComponent(
    name="k8s-device-plugin",
    version=DEVICE_PLUGIN_VERSION,
    module="github.com/NVIDIA/k8s-device-plugin",
    packages=tuple(
        f"github.com/NVIDIA/k8s-device-plugin/cmd/{cmd}"
        for cmd in (
            "nvidia-device-plugin",
            "gpu-feature-discovery",
            "mps-control-daemon",
            "config-manager",
        )
    ),
    ldflags=(
        f"'-extldflags={_NVIDIA_EXTLDFLAGS}'",
        f"-X github.com/NVIDIA/k8s-device-plugin/internal/info.version=v{DEVICE_PLUGIN_VERSION}",
        f"-X github.com/NVIDIA/k8s-device-plugin/internal/info.gitCommit={DEVICE_PLUGIN_COMMIT}",
    ),
    cgo=True,
)

# The commands of upstream's nvidia-container-toolkit-base package (nvidia-container-runtime,
# nvidia-ctk, nvidia-cdi-hook) and nvidia-container-toolkit package (the legacy prestart hook):
# packaging/debian/*.install in the module. libnvidia-container (nvidia-container-cli) is C and
# not a Go module: it is not built here.
CONTAINER_TOOLKIT = GoComponent(
    name="nvidia-container-toolkit",
    version=CONTAINER_TOOLKIT_VERSION,
    module="github.com/NVIDIA/nvidia-container-toolkit",
    packages=tuple(
        f"github.com/NVIDIA/nvidia-container-toolkit/cmd/{cmd}"
        for cmd in (
            "nvidia-container-runtime",
            "nvidia-ctk",
            "nvidia-cdi-hook",
            "nvidia-container-runtime-hook",
        )
    ),
    ldflags=(
        f"'-extldflags={_NVIDIA_EXTLDFLAGS} -Wl,-z,lazy'",
        "-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version="
        + CONTAINER_TOOLKIT_VERSION,
    ),
    cgo=True,
)

CONTROLLER_GEN = GoComponent(
    name="controller-gen",
    version=CONTROLLER_TOOLS_VERSION,
    module="sigs.k8s.io/controller-tools",
    packages=("sigs.k8s.io/controller-tools/cmd/controller-gen",),
)

# A STAND-IN for NVIDIA's DRA kubelet plugin (github.com/NVIDIA/k8s-dra-driver-gpu is not served
# by the Go module proxy): Kubernetes' own DRA test driver under NVIDIA's driver name, with
# simulated GPUs (go/gpu-kubelet-plugin/main.go says what it does and does not). Its cache key
# carries a digest of that source, so a change to it rebuilds the binary.
DRA_STAND_IN_MAIN = Path(__file__).parent / "go" / "gpu-kubelet-plugin" / "main.go"
DRA_STAND_IN = GoComponent(
    name="dra-stand-in-" + hashlib.sha256(DRA_STAND_IN_MAIN.read_bytes()).hexdigest()[:12],
    version=KUBERNETES_VERSION,
    module="k8s.io/kubernetes",
    packages=("gpustack.local/build/gpu-kubelet-plugin",),
    ldflags=_kubernetes_ldflags(),
    replaces=_kubernetes_replaces,
)

COMPONENTS: dict[str, GoComponent] = {
    c.name: c
    for c in (
        KUBERNETES,
        ETCD,
        KWOK,
        DEVICE_PLUGIN,
        CONTAINER_TOOLKIT,
        CONTROLLER_GEN,
        DRA_STAND_IN,
    )
}

# The wrapper's own main packages (etcd has no main package in a module of its own).
_WRAPPER_MAINS = {
    "etcd": (
        "etcd",
        'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
        "func main() { etcdmain.Main(os.Args) }\n",
    ),
    DRA_STAND_IN.name: ("gpu-kubelet-plugin", DRA_STAND_IN_MAIN.read_text()),
}


def cache_root() -> Path:
    """Where built components are kept: $GPUSTACK_COMPONENTS_CACHE, else /var/cache/gpustack/
    components for root, else ~/.cache/gpustack/components."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.geteuid() == 0:
        return Path("/var/cache/gpustack/components")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gpustack" / "components"


def go_version(go: str = "go") -> str:
    """The Go toolchain's version, e.g. `go1.26.8` (GOTOOLCHAIN respected)."""
    try:
        proc = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True)
    except FileNotFoundError as exc:
        raise LabError(
            "Go is not installed: the lab's Kubernetes is built from Go modules",
            "install Go 1.26 or newer (https://go.dev/dl, or Debian's golang-1.26-go) "
            "and put `go` on the PATH",
        ) from exc
    except subprocess.CalledProcessError as exc:
        raise LabError(
            f"`go env GOVERSION` failed: {exc.stderr.strip()}", "check the Go install"
        ) from exc
    return proc.stdout.strip()


def component_dir(component: GoComponent, go: str | None = None) -> Path:
    return cache_root() / f"{component.name}-{component.version}-{go or go_version()}"


def cached(component: GoComponent, go: str | None = None) -> Path | None:
    """The component's bin/ directory when every binary and shared file is there, else None."""
    bindir = _built(component, go)
    share = component_dir(component, go) / "share"
    if bindir and all((share / Path(f).name).is_file() for f in component.share):
        return bindir
    return None


def _built(component: GoComponent, go: str | None = None) -> Path | None:
    """The bin/ directory of a finished build (its shared files may be missing)."""
    bindir = component_dir(component, go) / "bin"
    if (
        all((bindir / b).is_file() for b in component.binaries)
        and (bindir.parent / "build.json").is_file()
    ):
        return bindir
    return None


def _copy_share(component: GoComponent, staging: Path, work: Path, env: dict[str, str]) -> None:
    """The module's files `component.share` names, into `staging`/share (a download, no build)."""
    source = Path(_module_info(component.module, component.version, work, env)["Dir"])
    (staging / "share").mkdir(exist_ok=True)
    for name in component.share:
        shutil.copy2(source / name, staging / "share" / Path(name).name)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a second build of the same component waits
        yield


def _go(args: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    proc = subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise LabError(
            f"building {what} failed (`go {' '.join(args[:2])}` exited {proc.returncode}):\n{tail}",
            "the Go module proxy must be reachable (GOPROXY) and Go new enough for the module",
        )


def _module_gomod(module: str, version: str, cwd: Path, env: dict[str, str]) -> str:
    return Path(_module_info(module, version, cwd, env)["GoMod"]).read_text()


def _module_info(module: str, version: str, cwd: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@v{version}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    info = json.loads(proc.stdout or "{}")
    if proc.returncode != 0 or not info.get("GoMod"):
        raise LabError(
            f"{module}@v{version} could not be downloaded: {info.get('Error') or proc.stderr}",
            "the Go module proxy must be reachable and serve this version",
        )
    return info


def build(component: GoComponent, log: Callable[[str], None] = lambda _: None) -> Path:
    """Build the component into the cache unless it is there; return its bin/ directory."""
    go = go_version()
    target = component_dir(component, go)
    with locked(cache_root() / f".{target.name}.lock"):
        found = cached(component, go)
        if found:
            return found
        env = dict(os.environ, CGO_ENABLED="1" if component.cgo else "0", GOFLAGS="-mod=mod")
        with tempfile.TemporaryDirectory(prefix=f"gpustack-build-{component.name}-") as tmp:
            work = Path(tmp)
            (work / "go.mod").write_text("module gpustack.local/build\n\ngo 1.26.0\n")
            if _built(component, go):  # built before a shared file was added: copy, not rebuild
                _copy_share(component, target, work, env)
                return target / "bin"
            log(f"building {component.name} v{component.version} with {go} (minutes, once)")
            extra = []
            if component.replaces:
                extra = component.replaces(
                    _module_gomod(component.module, component.version, work, env)
                )
            (work / "go.mod").write_text(
                "module gpustack.local/build\n\ngo 1.26.0\n\n"
                f"require {component.module} v{component.version}\n\n" + "\n".join(extra) + "\n"
            )
            imports = [p for p in component.packages if not p.startswith("gpustack.local/")]
            (work / "tools.go").write_text(
                "//go:build tools\n\npackage tools\n\nimport (\n"
                + "".join(f'\t_ "{p}"\n' for p in imports)
                + ")\n"
            )
            if component.name in _WRAPPER_MAINS:
                sub, source = _WRAPPER_MAINS[component.name]
                (work / sub).mkdir()
                (work / sub / "main.go").write_text(source)
            _go(["mod", "tidy"], work, env, component.name)
            out = work / "out"
            out.mkdir()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.monotonic()
            ldflags = " ".join(("-s", "-w", *component.ldflags))
            _go(
                [
                    "build",
                    "-trimpath",
                    f"-ldflags={ldflags}",
                    "-o",
                    str(out) + "/",
                    *component.packages,
                ],
                work,
                env,
                component.name,
            )
            seconds = time.monotonic() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            staging = target.with_name(target.name + ".part")
            shutil.rmtree(staging, ignore_errors=True)
            (staging / "bin").mkdir(parents=True)
            sizes = {}
            for binary in component.binaries:
                shutil.copy2(out / binary, staging / "bin" / binary)
                sizes[binary] = (staging / "bin" / binary).stat().st_size
            if component.share:
                _copy_share(component, staging, work, env)
            (staging / "go.mod").write_text((work / "go.mod").read_text())
            (staging / "build.json").write_text(
                json.dumps(
                    {
                        "component": component.name,
                        "version": component.version,
                        "module": component.module,
                        "go": go,
                        "build_seconds": round(seconds, 1),
                        "cpu_seconds": round(
                            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                            1,
                        ),
                        # ru_maxrss of children is the largest single child (the Go compiler or
                        # linker), in KiB on Linux.
                        "peak_rss_mib": round(after.ru_maxrss / 1024),
                        "sizes": sizes,
                    },
                    indent=2,
                )
                + "\n"
            )
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        log(f"built {component.name} v{component.version} in {seconds:.0f} s -> {target}")
        return target / "bin"


def _generated_crds(
    name: str, module: str, version: str, packages: tuple[str, ...], options: str, log
) -> Path:
    """The directory of the CRDs controller-gen generates (`options`) from the API types of
    `packages` in `module` at `version`, generated once and cached beside the components: the
    module proxy serves the types' module, not the repositories whose YAML holds them."""
    controller_gen = build(CONTROLLER_GEN, log) / "controller-gen"
    target = cache_root() / f"{name}-{version}-controller-gen-{CONTROLLER_TOOLS_VERSION}"
    with locked(cache_root() / f".{target.name}.lock"):
        if any(target.glob("*.yaml")):  # complete: renamed into place once generated
            return target
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod")
        with tempfile.TemporaryDirectory(prefix="gpustack-crds-") as tmp:
            work = Path(tmp)
            (work / "go.mod").write_text(
                f"module gpustack.local/crds\n\ngo 1.26.0\n\nrequire {module} v{version}\n"
            )
            imports = "".join(f'import _ "{p}"\n' for p in packages)
            (work / "tools.go").write_text(f"package crds\n\n{imports}")
            _go(["mod", "tidy"], work, env, f"{name}'s API types")
            staging = target.with_name(target.name + ".part")
            shutil.rmtree(staging, ignore_errors=True)
            run = subprocess.run(
                [str(controller_gen), options, *(f"paths={p}" for p in packages),
                 f"output:crd:dir={staging}"],
                cwd=work, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if run.returncode != 0:
                raise LabError(
                    f"controller-gen could not generate {name}: "
                    f"{(run.stderr or run.stdout).strip()[-500:]}",
                    f"check that the Go module proxy serves {module}@v{version}",
                )
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    log(f"generated {name} -> {target}")
    return target


def prometheus_operator_crds(log: Callable[[str], None] = lambda _: None) -> Path:
    """The directory of Prometheus Operator's CRDs (monitoring.coreos.com_servicemonitors.yaml
    and the others) at PROMETHEUS_OPERATOR_APIS_VERSION, as upstream generates them
    (`crd:crdVersions=v1`)."""
    return _generated_crds(
        "prometheus-operator-crds", PROMETHEUS_OPERATOR_APIS, PROMETHEUS_OPERATOR_APIS_VERSION,
        (f"{PROMETHEUS_OPERATOR_APIS}/v1",), "crd:crdVersions=v1", log,
    )  # fmt: skip


def volcano_crds(log: Callable[[str], None] = lambda _: None) -> Path:
    """The directory of Volcano's CRDs (batch.volcano.sh_jobs.yaml, scheduling.volcano.sh_
    podgroups.yaml and _queues.yaml) from volcano.sh/apis at VOLCANO_APIS_VERSION, with the
    options Volcano's Makefile generates its Job CRD with."""
    return _generated_crds(
        "volcano-crds", VOLCANO_APIS, VOLCANO_APIS_VERSION,
        (f"{VOLCANO_APIS}/pkg/apis/batch/v1alpha1", f"{VOLCANO_APIS}/pkg/apis/scheduling/v1beta1"),
        "crd:crdVersions=v1,generateEmbeddedObjectMeta=true,maxDescLen=0", log,
    )  # fmt: skip


def ensure(names: tuple[str, ...] = ("kubernetes", "etcd"), log=lambda _: None) -> dict[str, Path]:
    """Each named component's bin/ directory, built when missing."""
    return {name: build(COMPONENTS[name], log) for name in names}


def build_info(component: GoComponent) -> dict | None:
    try:
        return json.loads((component_dir(component) / "build.json").read_text())
    except (OSError, ValueError):
        return None


def describe(build_missing: bool = False, log=lambda _: None) -> list[dict]:
    """One row per pinned component: version, where it is cached, its build figures."""
    rows = []
    go = go_version()
    if build_missing:
        prometheus_operator_crds(log)  # builds controller-gen first
        volcano_crds(log)
    for component in COMPONENTS.values():
        if build_missing:
            build(component, log)
        info = build_info(component) if cached(component, go) else None
        rows.append(
            {
                "component": component.name,
                "version": component.version,
                "module": component.module,
                "go": go,
                "cached": str(component_dir(component, go) / "bin") if info else None,
                "build_seconds": (info or {}).get("build_seconds"),
                "peak_rss_mib": (info or {}).get("peak_rss_mib"),
                "sizes_mib": {
                    k: round(v / 2**20, 1) for k, v in ((info or {}).get("sizes") or {}).items()
                },
            }
        )
    return rows
