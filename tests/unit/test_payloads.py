"""gpustack's module payloads and compiled templates kept between ansible-playbook runs
(gpustack/ansible/payloads.py, jinja_cache.py)."""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ansible.release import __version__ as ANSIBLE_VERSION

from gpustack.ansible import jinja_cache, payloads
from tests.conftest import ROOT, collections_path


def test_gpustacks_modules_import_nothing_outside_the_key():
    """The key hashes plugins/modules and plugins/module_utils only: a module importing another
    collection's module_utils could be sent stale. Any import of a collection must be ours."""
    imports = set()
    for path in (ROOT / "plugins").rglob("*.py"):
        imports |= set(re.findall(r"ansible_collections\.(\w+\.\w+)", path.read_text()))
    assert imports == {"gpustack.gpustack"}


def _content(tmp_path: Path) -> Path:
    root = tmp_path / "content"
    (root / "plugins" / "modules").mkdir(parents=True)
    (root / "plugins" / "module_utils").mkdir(parents=True)
    (root / "plugins" / "modules" / "thing.py").write_text("# module\n")
    (root / "plugins" / "module_utils" / "util.py").write_text("# util\n")
    return root


def test_the_key_follows_every_module_and_module_util_and_ansibles_version(tmp_path):
    root = _content(tmp_path)
    first = payloads.key(root, "2.19.0")
    assert payloads.key(root, "2.19.0") == first
    assert payloads.key(root, "2.19.1") != first
    assert payloads.key(root, "2.19.0", payloads.PLAIN) != first  # without bytecode: another key
    (root / "plugins" / "module_utils" / "util.py").write_text("# util, changed\n")
    changed = payloads.key(root, "2.19.0")
    assert changed != first
    (root / "plugins" / "modules" / "other.py").write_text("# another module\n")
    assert payloads.key(root, "2.19.0") not in (first, changed)
    (root / "plugins" / "filter").mkdir()
    keyed = payloads.key(root, "2.19.0")
    (root / "plugins" / "filter" / "f.py").write_text("# a filter: never in a payload\n")
    assert payloads.key(root, "2.19.0") == keyed


class FakeBuild:
    """Ansible's build step as module_common has it: the per-process cache, built once."""

    def __init__(self, local_tmp: Path):
        self.local_tmp = local_tmp
        self.built: list[str] = []

    def __call__(self, *, module_name, module_path, **_):
        cache = self.local_tmp / "ansiballz_cache"
        cache.mkdir(parents=True, exist_ok=True)
        name = cache / f"fqn.{module_name}-ZIP_DEFLATED-none"
        if not name.exists():
            self.built.append(module_name)
            name.write_text(f"payload of {Path(module_path).read_text()}")
        return name.read_text()


@pytest.fixture
def fake_ansible(tmp_path, monkeypatch):
    """module_common's build step and per-process temporary directory, faked per 'process'."""
    from ansible import constants as C
    from ansible.executor import module_common

    monkeypatch.setattr(module_common, "_get_ansible_module_fqn",
                        lambda path: f"fqn.{Path(path).stem}")  # fmt: skip

    def new_process(n: int) -> FakeBuild:
        local_tmp = tmp_path / f"ansible-local-{n}"
        monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(local_tmp), raising=False)
        build = FakeBuild(local_tmp)
        monkeypatch.setattr(module_common, "_find_module_utils", build)
        return build

    return module_common, new_process


def test_a_kept_payload_is_not_built_again_by_the_next_process(tmp_path, fake_ansible):
    module_common, new_process = fake_ansible
    root, cache = _content(tmp_path), tmp_path / "cache"
    module = str(root / "plugins" / "modules" / "thing.py")

    first = new_process(1)
    kept = payloads.install(root, cache)
    assert module_common._find_module_utils(module_name="thing", module_path=module) == (
        "payload of # module\n"
    )
    assert first.built == ["thing"]
    assert [p.name for p in kept.iterdir()] == ["fqn.thing-ZIP_DEFLATED-none"]

    second = new_process(2)
    assert payloads.install(root, cache) == kept
    assert module_common._find_module_utils(module_name="thing", module_path=module) == (
        "payload of # module\n"
    )
    assert second.built == []  # taken from the kept one

    # a changed module: another key, built again
    Path(module).write_text("# module, changed\n")
    third = new_process(3)
    assert payloads.install(root, cache) != kept
    assert module_common._find_module_utils(module_name="thing", module_path=module) == (
        "payload of # module, changed\n"
    )
    assert third.built == ["thing"]


def test_modules_outside_gpustacks_collection_are_left_to_ansible(tmp_path, fake_ansible):
    module_common, new_process = fake_ansible
    root, cache = _content(tmp_path), tmp_path / "cache"
    theirs = tmp_path / "library" / "command.py"
    theirs.parent.mkdir()
    theirs.write_text("# a user's module\n")
    for n in (1, 2):
        build = new_process(n)
        kept = payloads.install(root, cache)
        module_common._find_module_utils(module_name="command", module_path=str(theirs))
        assert build.built == ["command"]  # built by each process, as Ansible does
        assert list(kept.iterdir()) == []


def test_old_keys_are_pruned(tmp_path, fake_ansible):
    _, new_process = fake_ansible
    root, cache = _content(tmp_path), tmp_path / "cache"
    for n in range(payloads.KEEP_KEYS + 2):
        new_process(n)
        (root / "plugins" / "modules" / "thing.py").write_text(f"# version {n}\n")
        newest = payloads.install(root, cache)
        os.utime(newest, (n, n + 1_000_000))  # mtimes in order, whatever the clock's resolution
    assert len(list(cache.iterdir())) == payloads.KEEP_KEYS
    assert newest.is_dir()


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return base64.b64encode(out.getvalue())


def _members(zip_data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data))) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


# Imports pkg.mod from the zip given as argv[1] and prints its X and the payload files compiled
# from source on the way (the "compile" audit event, which zipimport's source path raises).
IMPORT_FROM_ZIP = """
import sys
compiled = []
sys.addaudithook(lambda event, args: event == "compile" and compiled.append(args[1]))
sys.path.insert(0, sys.argv[1])
from pkg import mod
print(mod.X, sorted({str(name).rsplit("/", 2)[-1] for name in compiled if ".zip" in str(name)}))
"""


def _import_from(tmp_path: Path, members: dict[str, bytes]) -> str:
    archive = tmp_path / "payload.zip"
    archive.write_bytes(base64.b64decode(_zip(members)))
    run = subprocess.run([sys.executable, "-c", IMPORT_FROM_ZIP, str(archive)],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return run.stdout.strip()


def test_bytecode_beside_each_source_is_what_the_host_imports(tmp_path):
    plain = {"pkg/__init__.py": b"", "pkg/mod.py": b"X = 1\n"}
    assert _import_from(tmp_path, plain) == "1 ['__init__.py', 'mod.py']"  # compiled on the host
    with_bytecode = payloads.add_bytecode(_zip(plain))
    members = _members(with_bytecode)
    assert sorted(members) == ["pkg/__init__.py", "pkg/__init__.pyc", "pkg/mod.py", "pkg/mod.pyc"]
    assert members["pkg/mod.py"] == b"X = 1\n"  # the sources stay
    assert _import_from(tmp_path, members) == "1 []"  # nothing compiled on the host
    assert payloads.add_bytecode(with_bytecode) is None  # has bytecode already


def test_bytecode_the_host_cannot_trust_is_ignored(tmp_path):
    members = _members(
        payloads.add_bytecode(_zip({"pkg/__init__.py": b"", "pkg/mod.py": b"X = 1\n"}))
    )
    # a .py that is not the one compiled: the hash differs, the .py is imported
    assert _import_from(tmp_path, {**members, "pkg/mod.py": b"X = 2\n"}) == "2 ['mod.py']"
    # another Python's magic number: ignored as well
    foreign = {**members, "pkg/mod.pyc": b"\x00\x00\r\n" + members["pkg/mod.pyc"][4:]}
    assert _import_from(tmp_path, foreign) == "1 ['mod.py']"


def test_ansible_playbook_takes_a_kept_payload_in_its_next_run(tmp_path):
    """Real ansible-playbook through launch.py, twice: the second run builds no payload of
    gpustack's module (ANSIBLE_DEBUG shows Ansible's own cache steps) and its module still runs.
    Neither run compiles the payload's Python files where the module runs (the local connection,
    the controller's Python: its bytecode is taken); with GPUSTACK_PAYLOAD_BYTECODE=0 it does."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - gpustack.gpustack.gpustack_dpkg_selections:\n"
        "        names: []\n        selection: hold\n      check_mode: true\n"
    )
    hook = tmp_path / "hook"  # the module's process records what it compiles from the payload
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import sys\n"
        "def _note(event, args):\n"
        "    if event == 'compile' and '_payload.zip' in str(args[1]):\n"
        f"        with open({str(tmp_path / 'compiled')!r}, 'a') as fh:\n"
        "            fh.write(str(args[1]) + '\\n')\n"
        "sys.addaudithook(_note)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "ANSIBLE_DEBUG": "1",
           "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
           "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}  # fmt: skip
    command = [sys.executable, "-m", "gpustack.ansible.launch", "-c", "local", "-i", "localhost,",
               "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)]  # fmt: skip
    runs = [
        subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "ok=1" in run.stdout
    creating = "ANSIBALLZ: Creating module"
    assert creating in runs[0].stdout
    assert creating not in runs[1].stdout
    assert "ANSIBALLZ: using cached module" in runs[1].stdout
    kept = list((tmp_path / "xdg" / "gpustack" / "ansiballz").glob("*/*gpustack_dpkg_selections*"))
    assert len(kept) == 1
    assert not (tmp_path / "compiled").exists()

    plain = subprocess.run(command, capture_output=True, text=True, timeout=120,
                           env={**env, "GPUSTACK_PAYLOAD_BYTECODE": "0"})  # fmt: skip
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    assert creating in plain.stdout  # another key
    compiled = (tmp_path / "compiled").read_text().splitlines()
    assert any(name.endswith("/ansible/module_utils/basic.py") for name in compiled)
    assert any(name.endswith("/gpustack_dpkg_selections.py") for name in compiled)


JINJA_PLAY = r"""
- hosts: localhost
  gather_facts: false
  vars:
    who: world
  tasks:
    - ansible.builtin.debug:
        msg: "{{ 'hello ' ~ who | upper }}"
    - ansible.builtin.debug:
        msg: "Test\\3; {{ 'a_name' | regex_replace('^(.*)_name$', '\\1') }}"
    - ansible.builtin.debug:
        msg: "item {{ item }}"
      loop: [1, 2, 3]
      when: item > 1
    - ansible.builtin.set_fact:
        size: "{{ who | length }}"
    - ansible.builtin.assert:
        that: [size | int == 5, "'or' in who"]
"""


def _jinja_runs(tmp_path: Path, count: int, **extra: str) -> list[subprocess.CompletedProcess]:
    playbook = tmp_path / "jinja.yml"
    playbook.write_text(JINJA_PLAY)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), **extra,
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}  # fmt: skip
    command = [sys.executable, "-m", "gpustack.ansible.launch", "-c", "local", "-i", "localhost,",
               "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)]  # fmt: skip
    runs = []
    for _ in range(count):
        runs.append(subprocess.run(command, capture_output=True, text=True, env=env, timeout=120))
        assert runs[-1].returncode == 0, runs[-1].stdout[-3000:] + runs[-1].stderr[-3000:]
    return runs


def _spools(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "xdg" / "gpustack" / "jinja").glob("*/*.m")}


@pytest.mark.skipif(not ANSIBLE_VERSION.startswith(jinja_cache.SERIES),
                    reason="the compile cache is only installed for its ansible-core series")  # fmt: skip
def test_templates_compiled_by_one_run_are_taken_by_the_next_with_the_same_results(tmp_path):
    """Cold (every template compiled, kept), warm (taken from the cache): the same output, the
    backslash escaping of YAML-sourced templates included; the warm run compiles nothing new."""
    (cold,) = _jinja_runs(tmp_path, 1)
    after_cold = _spools(tmp_path)
    assert after_cold  # the workers kept what they compiled
    warm, again = _jinja_runs(tmp_path, 2)
    assert warm.stdout == cold.stdout == again.stdout
    assert '"msg": "HELLO WORLD"' not in cold.stdout  # `~` binds looser than `|`
    assert '"msg": "hello WORLD"' in cold.stdout
    assert '"msg": "Test\\\\3; a"' in cold.stdout  # \1 reached regex_replace as a backreference
    assert "item 1" not in cold.stdout and "item 3" in cold.stdout
    new = _spools(tmp_path) - after_cold
    assert all(name.startswith("merged-") for name in new), new  # nothing compiled again

    # A Jinja extension changes what a source compiles to: another key, compiled again.
    before = _spools(tmp_path)
    (other,) = _jinja_runs(tmp_path, 1, ANSIBLE_JINJA2_EXTENSIONS="jinja2.ext.loopcontrols")
    assert other.stdout == cold.stdout
    assert any(not name.startswith("merged-") for name in _spools(tmp_path) - before)


def test_no_compile_cache_outside_its_ansible_series(tmp_path, monkeypatch):
    import ansible.release

    monkeypatch.setattr(ansible.release, "__version__", "2.99.0")
    assert jinja_cache.install(tmp_path) is None
    assert not any(tmp_path.iterdir())


def test_spool_files_are_merged_and_bounded(tmp_path, monkeypatch):
    import marshal

    directory = tmp_path / "key"
    directory.mkdir()
    for n in range(jinja_cache.COMPACT_AT + 1):
        with (directory / f"{n}.m").open("wb") as fh:
            fh.write(marshal.dumps((("expression", False, (), "Env", f"x{n}"), b"code")))
    with (directory / "torn.m").open("wb") as fh:  # a worker killed in the middle of a record
        fh.write(marshal.dumps((("expression", False, (), "Env", "y"), b"code"))[:-3])
    cache = jinja_cache._load(directory)
    assert len(cache) == jinja_cache.COMPACT_AT + 1
    (merged,) = directory.glob("*.m")
    assert merged.name.startswith("merged-")
    assert jinja_cache._load(directory) == cache

    monkeypatch.setattr(jinja_cache, "MAX_BYTES", merged.stat().st_size - 1)
    assert jinja_cache._load(directory) == {}
    assert list(directory.iterdir()) == []


def test_the_plugins_workers_loaded_again_are_loaded_in_the_main_process(tmp_path):
    """preload.load() after Ansible's plugin loader is set up: the modules of ansible-core's test
    plugins, gpustack's filter files, the template lookup, the normal action and the module JSON
    profiles are in sys.modules (a forked worker finds them there instead of loading them)."""
    script = f"""
import sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([{str(collections_path())!r}])
before = set(sys.modules)
from gpustack.ansible import preload
preload.load()
for name in sorted(set(sys.modules) - before):
    print(name)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = done.stdout.split()
    for stem in ("apt_signed_repo", "container_runtime", "gpu_converged",
                 "nvidia_container_toolkit", "nvidia_driver", "nvidia_mig"):  # fmt: skip
        assert f"ansible_collections.gpustack.gpustack.plugins.filter.{stem}" in loaded
    assert sum(name.startswith("ansible.plugins.test.") for name in loaded) >= 3
    assert "ansible_collections.ansible.builtin.plugins.lookup.template" in loaded
    assert "ansible.plugins.action.normal" in loaded
    assert "ansible.module_utils._internal._json._profiles._module_legacy_c2m" in loaded
