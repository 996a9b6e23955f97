"""Generate docs/variables.md from every role's meta/argument_specs.yml."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from gpustack import paths

HEADER = """# Variables reference

Generated from each role's `meta/argument_specs.yml` by `python -m gpustack.varsdoc`; a unit
test fails when this file is out of date. Pass them with `-e NAME=VALUE`, in group_vars or in
host_vars. Cross-role variables: `gpustack_require_gpu` (default false: a host without an
NVIDIA device is reported "installed, not loaded: no NVIDIA device" and does not fail).
"""


def _cell(value) -> str:
    text = " ".join(str(value).split()) if value not in (None, "") else ""
    return text.replace("|", "\\|")


def render(roles_dir: Path | None = None) -> str:
    roles_dir = roles_dir or paths.roles_dir()
    out = [HEADER]
    for role in sorted(p for p in roles_dir.iterdir() if (p / "meta/argument_specs.yml").exists()):
        spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]
        main = spec["main"]
        out.append(f"## {role.name}\n\n{_cell(main.get('short_description'))}\n")
        options = main.get("options") or {}
        if not options:
            out.append("No inputs.\n")
            continue
        out.append("| variable | type | default | description |\n|---|---|---|---|")
        for name, opt in options.items():
            kind = opt.get("type", "str")
            if opt.get("choices"):
                kind += " (" + ", ".join(str(c) for c in opt["choices"]) + ")"
            default = opt.get("default", "")
            shown = f"`{default}`" if default not in ("", None, []) else "empty"
            description = opt.get("description", "")
            if isinstance(description, list):
                description = " ".join(description)
            out.append(f"| `{name}` | {kind} | {_cell(shown)} | {_cell(description)} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else paths.content_root() / "docs/variables.md"
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
