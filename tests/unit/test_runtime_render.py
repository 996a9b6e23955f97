"""CRI-O drop-in and k3s/RKE2 config.yaml.d drop-in, rendered by Ansible; the k3s/RKE2 template
checks (filters gpustack_k3s_templates, gpustack_k3s_generated). No CRI-O or k3s here: the lab's
k3s stand-in (tests/fixtures/k3s, tests/lab/test_k3s.py) runs the role against real containerd."""

import base64
import tomllib

import yaml

from plugins.filter.container_runtime import k3s_generated, k3s_read_templates, k3s_templates
from tests.conftest import ROOT, run_playbook
from tests.fixtures import k3s_templates as templates


def render(tmp_path, **variables):
    variables = {"out": str(tmp_path), **variables}
    proc = run_playbook(ROOT / "tests/unit/playbooks/render_runtime.yml", variables)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (tmp_path / "crio.toml").read_text(), (tmp_path / "k3s.yaml").read_text()


def test_crio_dropin(tmp_path):
    crio, _ = render(tmp_path)
    data = tomllib.loads(crio)
    assert data == {
        "crio": {
            "runtime": {
                "runtimes": {
                    "nvidia": {
                        "runtime_path": "/usr/bin/nvidia-container-runtime",
                        "runtime_type": "oci",
                    }
                }
            }
        }
    }
    crio, _ = render(tmp_path, container_runtime_nvidia_default=True)
    assert tomllib.loads(crio)["crio"]["runtime"]["default_runtime"] == "nvidia"


def test_k3s_dropin_sets_only_the_default_runtime(tmp_path):
    _, dropin = render(tmp_path)
    assert yaml.safe_load(dropin) == {"default-runtime": "nvidia"}
    assert dropin.startswith("#")  # "Ansible managed", as a comment


BASE_PLUS_RUNTIME = templates.BASE_PLUS_RUNTIME
LEGACY = templates.legacy()
FULL_WITH_RUNTIME = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]
  runtime_type = "io.containerd.runc.v2"
"""
BASE_ONLY = """{{ template "base" . }}
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
"""


V2, V3 = "config.toml.tmpl", "config-v3.toml.tmpl"


def classify(v2=None, v3=None, default=False, version=2):
    return k3s_templates({V2: v2, V3: v3}, "nvidia", default, version)


def test_no_template_is_fine():
    assert classify() == {
        "legacy": [],
        "active": "",
        "extends_base": True,
        "declares": False,
        "error": "",
        "hint": "",
    }


def test_a_template_that_includes_the_base_and_declares_the_runtime_again_is_refused():
    result = classify(v2=BASE_PLUS_RUNTIME)
    assert result["active"] == V2 and result["legacy"] == []
    assert (
        "table twice" in result["error"] and "remove the nvidia runtime's tables" in result["hint"]
    )


def test_gpustacks_own_earlier_template_is_removed_not_refused():
    result = classify(v2=LEGACY)
    assert result["legacy"] == [V2] and result["active"] == "" and result["error"] == ""
    # one of the user's next to it is then the one k3s reads
    result = classify(v2=LEGACY, v3=BASE_ONLY, version=3)
    assert result["legacy"] == [V2] and result["active"] == V3 and result["error"] == ""


def test_a_template_that_replaces_the_base_must_declare_the_runtime():
    result = classify(v2="version = 2\n")
    assert "never reach containerd" in result["error"]
    assert classify(v2=FULL_WITH_RUNTIME)["error"] == ""
    # ... and set the default itself: k3s's default-runtime lives in the base
    assert "default-runtime" in classify(v2=FULL_WITH_RUNTIME, default=True)["error"]
    assert classify(v2=BASE_ONLY, default=True)["error"] == ""


def test_the_template_k3s_reads_first_existing_v3_then_v2():
    """k3s-io/k3s pkg/agent/containerd/config.go@469d009 (templateGenerations): a recent k3s reads
    config-v3.toml.tmpl when it exists, else config.toml.tmpl; it does not look at containerd's
    version. Its generated config.toml is version 3 only when it used the v3 base."""
    bad_v3 = "version = 3\n"  # replaces the base, no runtime
    # generated at version 3: a recent k3s; the first template that exists is the one
    assert "never reach" in classify(v2=BASE_ONLY, v3=bad_v3, version=3)["error"]
    assert classify(v2="version = 2\n", v3=BASE_ONLY, version=3)["error"] == ""
    assert classify(v2="version = 2\n", version=3)["active"] == V2
    # generated at version 2 (or none yet): an older k3s (config.toml.tmpl only), or a recent one
    # that found config.toml.tmpl alone at its last start. A config-v3.toml.tmpl there now is
    # what a recent k3s reads at the restart gpustack causes: judged too, refused with a hint
    result = classify(v2=BASE_ONLY, v3=bad_v3, version=2)
    assert result["active"] == V3 and "never reach" in result["error"], result
    assert "an older k3s ignores it" in result["hint"], result["hint"]
    assert classify(v3=bad_v3, version=2)["active"] == V3
    result = classify(v2=BASE_PLUS_RUNTIME, v3=BASE_ONLY, version=2)
    assert result["active"] == V2 and "table twice" in result["error"], result
    assert "older k3s" not in result["hint"]
    assert classify(v2=BASE_ONLY, v3=BASE_ONLY, version=2) == {
        "legacy": [], "active": V3, "extends_base": True, "declares": False,
        "error": "", "hint": "",
    }  # fmt: skip


def test_the_role_judges_gpustack_reads_answer():
    reads = {
        V2: {"exists": True, "content": base64.b64encode(BASE_PLUS_RUNTIME.encode()).decode()},
        V3: {"exists": False, "content": ""},
        "config.toml": {"exists": True, "content": ""},  # not a template: ignored
    }
    assert k3s_read_templates(reads, "nvidia") == classify(v2=BASE_PLUS_RUNTIME)


GENERATED = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia".options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def test_generated_configuration():
    binary = "/usr/bin/nvidia-container-runtime"
    assert k3s_generated(GENERATED, "nvidia", binary) == {"wired": True, "default": True}
    assert k3s_generated(GENERATED, "nvidia", "/other") == {"wired": False, "default": True}
    v3 = GENERATED.replace("version = 2", "version = 3").replace(
        "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"
    )
    assert k3s_generated(v3, "nvidia", binary)["wired"] is True
    assert k3s_generated("", "nvidia", binary) == {"wired": False, "default": False}
    assert k3s_generated("not toml [", "nvidia", binary) == {"wired": False, "default": False}
