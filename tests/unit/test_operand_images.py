"""The lab's operand images (gpustack/lab/operand_images.py): the archive format ctr imports,
the names gpustack renders for the lab, the libraries an image must carry, and the import into a
node's containerd (its podman calls; tests/lab/test_operand_images.py imports and runs them on a
real node)."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpustack.errors import LabError
from gpustack.lab import components, operand_images
from gpustack.lab.operand_images import OperandImage


def _rootfs(root: Path) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_bytes(b"\x7fELF pretend")
    (root / "usr/bin/tool").chmod(0o755)
    (root / "bin").mkdir()
    (root / "bin/sh").symlink_to("/busybox/sh")
    return root


def test_the_archive_is_a_docker_save_layout_whose_ids_are_the_contents_digests(tmp_path):
    root = _rootfs(tmp_path / "rootfs")
    refs = ("lab.gpustack.local/nvidia/k8s-device-plugin:v0.19.3", "other/name:1")
    info = operand_images.write_docker_archive(
        root, {"Entrypoint": ["tool"]}, refs, tmp_path / "a.tar"
    )
    with tarfile.open(tmp_path / "a.tar") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == list(refs)
        config_bytes = tar.extractfile(manifest[0]["Config"]).read()
        layer_bytes = tar.extractfile(manifest[0]["Layers"][0]).read()
    config = json.loads(config_bytes)
    assert manifest[0]["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    assert config["config"]["Entrypoint"] == ["tool"]
    assert info["image_id"] == "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as layer:
        members = {m.name: m for m in layer.getmembers()}
    assert members["usr/bin/tool"].mode == 0o755 and members["usr/bin/tool"].uid == 0
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "/busybox/sh"
    assert {m.mtime for m in members.values()} == {0}


def test_the_same_rootfs_gives_the_same_archive(tmp_path):
    root = _rootfs(tmp_path / "rootfs")
    first = operand_images.write_docker_archive(root, {}, ("a:1",), tmp_path / "1.tar")
    (root / "usr/bin/tool").touch()  # a new mtime changes nothing in the image
    second = operand_images.write_docker_archive(root, {}, ("a:1",), tmp_path / "2.tar")
    assert first == second
    assert (tmp_path / "1.tar").read_bytes() == (tmp_path / "2.tar").read_bytes()
    assert not list(tmp_path.glob("*.part"))


def test_the_lab_names_are_what_gpustack_renders_under_the_lab_registry():
    config = operand_images.lab_config()
    device_plugin = (
        f"lab.gpustack.local/nvidia/k8s-device-plugin:v{components.DEVICE_PLUGIN_VERSION}"
    )
    assert config.image("device_plugin") == device_plugin
    assert config.image("gfd") == device_plugin  # one image upstream since v0.15
    assert config.image("verify").startswith("lab.gpustack.local/gpustack/lab-verify:")
    # the DRA stand-in carries its own name: nothing mistakes it for NVIDIA's DRA driver image
    assert config.image("dra_driver") == (
        "lab.gpustack.local/gpustack/lab-dra-stand-in:"
        f"k8s-test-driver-v{components.KUBERNETES_VERSION}"
    )
    assert operand_images.lab_cluster_vars()["gpustack_k8s_registry"] == "lab.gpustack.local"


def test_the_device_plugin_pinned_is_served_and_built_as_upstream_builds_it():
    plugin = components.COMPONENTS["k8s-device-plugin"]
    # v0.20.0 (gpustack's default tag) answers 403 at the Go module proxy; v0.19.3 is served.
    assert plugin.version == "0.19.3" and plugin.cgo
    # deployments/container/Dockerfile@570e776d: the four commands under /usr/bin
    assert set(plugin.binaries) == {
        "nvidia-device-plugin",
        "gpu-feature-discovery",
        "mps-control-daemon",
        "config-manager",
    }
    assert any("--unresolved-symbols=ignore-in-object-files" in f for f in plugin.ldflags)
    toolkit = components.COMPONENTS["nvidia-container-toolkit"]
    assert toolkit.cgo and set(toolkit.binaries) == {
        "nvidia-container-runtime",
        "nvidia-ctk",
        "nvidia-cdi-hook",
        "nvidia-container-runtime-hook",
    }


def test_a_dynamic_binary_brings_its_loader_and_libc_a_static_one_nothing(tmp_path):
    libraries = operand_images.shared_libraries(Path("/bin/sh"))
    names = {p.name for p in libraries}
    assert "libc.so.6" in names and any(n.startswith("ld-linux") for n in names)
    if not shutil.which("gcc"):
        pytest.skip("no gcc to make a static binary")
    (tmp_path / "s.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-o", str(tmp_path / "s"), str(tmp_path / "s.c")], check=True)
    assert operand_images.shared_libraries(tmp_path / "s") == []


@pytest.fixture
def podman(monkeypatch):
    """The node's podman: `answers` maps a podman argv prefix to (rc, stdout, stderr)."""
    calls: list[list[str]] = []
    answers: dict[tuple, tuple[int, str, str]] = {}

    def fake(args, container, check=True):
        calls.append(args)
        rc, out, err = next(
            (answer for prefix, answer in answers.items() if tuple(args[: len(prefix)]) == prefix),
            (0, "", ""),
        )
        if check and rc != 0:
            raise LabError(f"podman {args} failed", "")
        return subprocess.CompletedProcess(["podman", *args], rc, out, err)

    monkeypatch.setattr(operand_images, "_podman", fake)
    return answers, calls


IMAGE = OperandImage("pause", Path("/cache/pause.tar"), ("registry.k8s.io/pause:3.10.2",), {})
LS = ("exec", "node", "ctr", "-n", "k8s.io", "images", "ls")


def test_load_into_node_copies_imports_native_and_checks_the_name(podman):
    answers, calls = podman
    answers[LS] = (0, "registry.k8s.io/pause:3.10.2\n", "")
    assert operand_images.load_into_node("node", [IMAGE]) == ["registry.k8s.io/pause:3.10.2"]
    target = f"{operand_images.ARCHIVE_DIR_IN_NODE}/pause.tar"
    assert ["cp", "/cache/pause.tar", f"node:{target}"] in calls
    imports = [c for c in calls if c[2:6] == ["ctr", "-n", "k8s.io", "images"] and "import" in c]
    assert imports == [[*LS[:6], "import", "--local", "--snapshotter", "native", target]]


def test_containerd_1x_without_local_is_asked_again_without_it(podman):
    answers, calls = podman
    answers[("exec", "node", "ctr", "-n", "k8s.io", "images", "import", "--local")] = (
        1,
        "",
        "flag provided but not defined: -local",
    )
    answers[LS] = (0, "registry.k8s.io/pause:3.10.2\n", "")
    operand_images.load_into_node("node", [IMAGE])
    assert [
        *LS[:6],
        "import",
        "--snapshotter",
        "native",
        "/var/lib/gpustack-lab/images/pause.tar",
    ] in calls


def test_an_image_containerd_does_not_list_afterwards_is_an_error_with_a_hint(podman):
    answers, _ = podman
    answers[LS] = (0, "something/else:1\n", "")
    with pytest.raises(LabError) as raised:
        operand_images.load_into_node("node", [IMAGE])
    assert "does not list registry.k8s.io/pause:3.10.2" in raised.value.message
    assert "ctr -n k8s.io images ls" in raised.value.hint


def test_a_failed_import_says_which_image_and_why(podman):
    answers, _ = podman
    answers[("exec", "node", "ctr")] = (1, "", "ctr: failed to dial containerd.sock")
    with pytest.raises(LabError) as raised:
        operand_images.load_into_node("node", [IMAGE])
    assert "could not import registry.k8s.io/pause:3.10.2" in raised.value.message
    assert "containerd.sock" in raised.value.message


def test_the_dra_stand_in_is_keyed_by_its_source_and_built_with_kubernetes_pinned():
    """components.DRA_STAND_IN: Kubernetes' DRA test driver at the pinned release, wrapped by
    go/gpu-kubelet-plugin/main.go; a change to that source gives another cache directory."""
    import hashlib

    stand_in = components.DRA_STAND_IN
    digest = hashlib.sha256(components.DRA_STAND_IN_MAIN.read_bytes()).hexdigest()[:12]
    assert stand_in.name == f"dra-stand-in-{digest}" and stand_in.binaries == (
        "gpu-kubelet-plugin",
    )
    assert (stand_in.module, stand_in.version) == (
        "k8s.io/kubernetes",
        components.KUBERNETES_VERSION,
    )
    source = components.DRA_STAND_IN_MAIN.read_text()
    assert '"k8s.io/kubernetes/test/e2e/dra/test-driver/app"' in source
    assert 'const driverName = "gpu.nvidia.com"' in source and "stand-in (no GPU)" in source
