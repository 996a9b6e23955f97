"""Where the Ansible content lives: in the wheel, or in the source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def content_root() -> Path:
    """Directory holding `playbooks/`, `roles/` and `templates/`."""
    bundled = _PACKAGE_DIR / "_content"
    if (bundled / "playbooks").is_dir():
        return bundled
    return _PACKAGE_DIR.parent


def playbook(name: str) -> Path:
    return content_root() / "playbooks" / name


def roles_dir() -> Path:
    return content_root() / "roles"


def templates_dir() -> Path:
    """Jinja2 templates of the Kubernetes manifests (and the Grafana dashboard)."""
    return content_root() / "templates"
