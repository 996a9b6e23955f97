"""Where the Ansible content lives: in the wheel, or in the source checkout.

The content root is also the Ansible collection gpustack.gpustack (galaxy.yml, roles/,
playbooks/, plugins/). Ansible finds a collection only under a directory shaped
`ansible_collections/<namespace>/<name>`; `collections_path()` provides one (a symlink to the
content root), so the CLI runs the same modules, module_utils and filters by their collection
names that a user's own playbook or an AWX job does (docs/collection.md).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

_PACKAGE_DIR = Path(__file__).resolve().parent


def load_yaml(path: Path) -> Any:
    """One of gpustack's own YAML files (the roles' specs and defaults, read by every command):
    libyaml's safe loader where PyYAML has it (14 files: about 0.08 s with the pure-Python one,
    0.03 s with libyaml's), else the pure-Python one."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)


def content_root() -> Path:
    """Directory holding `playbooks/`, `roles/` and `templates/`."""
    bundled = _PACKAGE_DIR / "_content"
    if (bundled / "playbooks").is_dir():
        return bundled
    return _PACKAGE_DIR.parent


def docs_dir() -> Path:
    """The user documentation (docs/*.md): shipped in the wheel, or the checkout's."""
    return content_root() / "docs"


_DOC_REFERENCE = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md)\b")


def resolve_doc_references(text: str) -> str:
    """`docs/<name>.md` in a hint or help text, as a path a user can open where gpustack is
    installed from a wheel (its docs live in the package); unchanged in a checkout, where
    docs/ is the repository's."""
    if content_root() == _PACKAGE_DIR.parent:
        return text
    return _DOC_REFERENCE.sub(lambda m: str(docs_dir() / m.group(1)), text)


def playbook(name: str) -> Path:
    return content_root() / "playbooks" / name


COLLECTION_NAMESPACE = "gpustack"
COLLECTION_NAME = "gpustack"


def roles_dir() -> Path:
    return content_root() / "roles"


def templates_dir() -> Path:
    """Jinja2 templates of the Kubernetes manifests (and the Grafana dashboard)."""
    return content_root() / "templates"


def state_root() -> Path:
    """gpustack's own state: run artifacts and upgrade state files ($GPUSTACK_STATE_DIR)."""
    base = os.environ.get("GPUSTACK_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "gpustack"
    )
    return Path(base)


def collections_path(root: Path | None = None) -> Path:
    """A directory for ANSIBLE_COLLECTIONS_PATH in which gpustack.gpustack is the content root.

    The symlink lives under the state root, in a directory named after the content root's
    path: two checkouts (or a checkout and a wheel) sharing a state root never swap each
    other's modules. It is made atomically, so runs started in parallel never see half a link."""
    target = content_root()
    key = hashlib.sha256(str(target).encode()).hexdigest()[:16]
    base = (root or state_root()) / "collections" / key
    parent = base / "ansible_collections" / COLLECTION_NAMESPACE
    link = parent / COLLECTION_NAME
    if os.path.islink(link) and os.readlink(link) == str(target):
        return base
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{COLLECTION_NAME}.{os.getpid()}"
    if os.path.lexists(staging):
        staging.unlink()
    staging.symlink_to(target, target_is_directory=True)
    os.replace(staging, link)
    return base
