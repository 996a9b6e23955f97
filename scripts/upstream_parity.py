#!/usr/bin/env python3
"""docs/upstream-parity.md from docs/upstream-parity.yaml, and the check that keeps both true.

The YAML file records, per operand, each field gpustack renders next to the pinned upstream
value and its source (`path@commit`), and why gpustack differs where it does. Each row names
where the field lives in the rendered object (`path`) and gpustack's value per scenario
(a scenario is a set of gpustack_k8s_* settings), so tests/unit/test_upstream_parity.py can
render every scenario and fail on any drift between the templates and the table.

    python scripts/upstream_parity.py --write   # regenerate the Markdown from the YAML
    python scripts/upstream_parity.py --check   # exit 1 on a stale Markdown or a drifted value

Path syntax (resolved against one rendered object):
    a.b           mapping keys            ["nvidia.com/x"]  a key with dots or slashes
    [name=foo]    the list item whose `name` is foo          [*]  map the rest over a list
    [0]           a list index
    |keys |yaml |csvfields |kinds   filters (sorted mapping keys, parse YAML text, the first
                                    column of a CSV without comments, the object kinds)
    pod.  -> the pod spec (spec.template.spec in a DaemonSet, spec in a Pod)
    ctr.  -> pod.containers[name=<the operand's container>].
A value of "<absent>" means the path does not exist in the rendered object.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "upstream-parity.yaml"
DOC = ROOT / "docs" / "upstream-parity.md"
ABSENT = "<absent>"

_TOKEN = re.compile(
    r"""\.?(?P<key>[A-Za-z0-9_-]+)
      | \["(?P<quoted>[^"]+)"\]
      | \[(?P<field>[A-Za-z]+)=(?P<value>[^\]]+)\]
      | \[(?P<star>\*)\]
      | \[(?P<index>\d+)\]
      | \|(?P<filter>[a-z]+)""",
    re.VERBOSE,
)


class _Absent:
    def __repr__(self) -> str:
        return ABSENT


MISSING = _Absent()


def load(path: Path = DATA) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def tokens(path: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        if not match:
            raise ValueError(f"bad path {path!r} at {path[pos:]!r}")
        pos = match.end()
        if match["key"] is not None:
            out.append(("key", match["key"]))
        elif match["quoted"] is not None:
            out.append(("key", match["quoted"]))
        elif match["field"] is not None:
            out.append(("select", (match["field"], match["value"])))
        elif match["star"] is not None:
            out.append(("star", None))
        elif match["index"] is not None:
            out.append(("index", int(match["index"])))
        else:
            out.append(("filter", match["filter"]))
    return out


def _filter(name: str, value: Any) -> Any:
    if name == "keys":
        return sorted(value) if isinstance(value, dict) else MISSING
    if name == "yaml":
        return yaml.safe_load(value) if isinstance(value, str) else MISSING
    if name == "csvfields":
        return [
            line.split(",", 1)[0].strip()
            for line in value.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
    raise ValueError(f"unknown filter |{name}")


def resolve(value: Any, steps: list[tuple[str, Any]]) -> Any:
    for position, (kind, arg) in enumerate(steps):
        if value is MISSING:
            return MISSING
        if kind == "key":
            value = value.get(arg, MISSING) if isinstance(value, dict) else MISSING
        elif kind == "select":
            field, wanted = arg
            found = [i for i in value or [] if isinstance(i, dict) and i.get(field) == wanted]
            value = found[0] if found else MISSING
        elif kind == "index":
            value = value[arg] if isinstance(value, list) and arg < len(value) else MISSING
        elif kind == "star":
            if not isinstance(value, list):
                return MISSING
            rest = steps[position + 1 :]
            return [resolve(item, rest) for item in value]
        else:
            value = _filter(arg, value)
    return value


def expand(path: str, obj: dict[str, Any], container: str | None) -> str:
    pod = "spec" if obj.get("kind") == "Pod" else "spec.template.spec"
    if path.startswith("ctr."):
        if not container:
            raise ValueError(f"{path}: the operand names no container")
        path = f"pod.containers[name={container}]." + path.removeprefix("ctr.")
    elif path.startswith("init."):
        name, _, rest = path.removeprefix("init.").partition(".")
        path = f"pod.initContainers[name={name}]." + rest
    if path == "pod" or path.startswith(("pod.", "pod|")):
        path = pod + path[3:]
    return path


# -- rendering the scenarios ---------------------------------------------------------------


def scenario_config(data: dict[str, Any], name: str):
    from gpustack.k8s.manifests_config import ClusterConfig

    return ClusterConfig.from_vars(
        {f"gpustack_k8s_{k}": v for k, v in (data["scenarios"][name] or {}).items()}
    )


def scenario_available(data: dict[str, Any], name: str) -> bool:
    """False when a scenario sets a variable this tree does not know yet (see `requires`)."""
    return set(data["scenarios"][name] or {}) <= known_fields()


def rendered_objects(data: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """`Kind/name` -> object for one scenario: every manifest plus one verification pod."""
    from gpustack.k8s.manifests import render, render_verify_pod

    config = scenario_config(data, name)
    rendered = render(config, servicemonitor=True)
    objects = {f"{o['kind']}/{o['metadata']['name']}": o for o in rendered}
    kwargs: dict[str, Any] = {"node_name": "gpu-1", "name": "verify"}
    if "gpus" in inspect.signature(render_verify_pod).parameters:
        kwargs["gpus"] = 1
    objects["Pod/verify"] = render_verify_pod(config, **kwargs)
    if getattr(config, "dra", False):  # the DRA verification objects (docs/dra.md)
        from gpustack.k8s.manifests import render_dra_verify_pod, render_verify_claim_template

        objects["ResourceClaimTemplate/verify"] = render_verify_claim_template(
            config, name="verify"
        )
        objects["Pod/verify-dra"] = render_dra_verify_pod(
            config, node_name="gpu-1", name="verify-dra", claim_template="verify"
        )
    objects["*"] = {"kinds": sorted({o["kind"] for o in objects.values()})}
    return objects


def expected(row: dict[str, Any], scenario: str) -> Any:
    value = row["gpustack"]
    if isinstance(value, dict) and "*" in value:
        return value.get(scenario, value["*"])
    return value


def normalise(value: Any) -> Any:
    if isinstance(value, list):
        return [normalise(item) for item in value]
    return ABSENT if value is MISSING else value


def mismatches(data: dict[str, Any]) -> tuple[list[str], int, list[str]]:
    """(drift messages, values compared, what this tree cannot check yet and why)."""
    drift: list[str] = []
    compared = 0
    available = [s for s in data["scenarios"] if scenario_available(data, s)]
    unavailable = [
        f"scenario {s} (sets {', '.join(sorted(set(data['scenarios'][s]) - known_fields()))})"
        for s in data["scenarios"]
        if s not in available
    ]
    cache = {s: rendered_objects(data, s) for s in available}
    for operand in data["operands"]:
        for row in operand["rows"]:
            requires = row.get("requires") or operand.get("requires")
            if requires and requires not in known_fields():
                unavailable.append(f"{operand['name']}: {row['field']} (needs {requires})")
                continue
            scenarios = row.get("scenarios") or operand.get("scenarios") or available
            for scenario in scenarios:
                if scenario not in cache:
                    continue  # listed above: this tree does not know its settings
                target = row.get("object") or operand["object"]
                obj = cache[scenario].get(target)
                want = expected(row, scenario)
                if row.get("path") in (None, ""):
                    got: Any = "<present>" if obj is not None else ABSENT
                elif obj is None:
                    continue  # the object is not rendered here; its presence has its own row
                else:
                    steps = tokens(expand(row["path"], obj, operand.get("container")))
                    got = normalise(resolve(obj, steps))
                compared += 1
                if json.dumps(got, sort_keys=True) != json.dumps(want, sort_keys=True):
                    drift.append(
                        f"{operand['name']} / {row['field']} [{scenario}]: table says "
                        f"{json.dumps(want)}, rendered {json.dumps(got)}"
                    )
    return drift, compared, unavailable


def known_fields() -> set[str]:
    from gpustack.k8s.manifests_config import ClusterConfig

    return set(ClusterConfig.model_fields)


# -- Markdown ------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _gpustack_cell(value: Any) -> str:
    if isinstance(value, dict) and "*" in value:
        parts = [f"{_cell(value['*'])}"]
        parts += [f"{name}: {_cell(v)}" for name, v in value.items() if name != "*"]
        return "<br>".join(parts)
    return _cell(value)


def _text(value: str | None) -> str:
    return " ".join((value or "").split()).replace("|", "\\|")


def _source(data: dict[str, Any], ref: str) -> str:
    key, _, detail = ref.partition(" ")
    src = data["sources"][key]
    where = f"{src['repo']}:`{src['path']}@{src['commit'][:10]}`"
    return f"{where} {detail}".strip()


def markdown(data: dict[str, Any]) -> str:
    out = [
        "# Upstream parity: gpustack's manifests against NVIDIA's",
        "",
        "<!-- Generated from docs/upstream-parity.yaml by scripts/upstream_parity.py --write;"
        " edit the YAML, not this file. -->",
        "",
        _text(data["intro"]),
        "",
        "**{rows} fields compared; {differ} differ from upstream on purpose (the rows with a "
        "reason); {fixed} were wrong and are fixed here.**".format(**counts(data)),
        "",
        "## Pinned upstream sources",
        "",
        "| key | repository | path | commit | note |",
        "|---|---|---|---|---|",
    ]
    for key, src in data["sources"].items():
        out.append(
            f"| `{key}` | {src['repo']} | `{src['path']}` | `{src['commit']}` | "
            f"{_text(src.get('note'))} |"
        )
    out += ["", "## Scenarios", "", "| scenario | gpustack_k8s_* settings |", "|---|---|"]
    for name, settings in data["scenarios"].items():
        text = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in (settings or {}).items())
        out.append(f"| `{name}` | {text or 'defaults'} |")
    out += ["", _text(data.get("reading")), ""]
    for operand in data["operands"]:
        out += [f"## {operand['name']}", "", _text(operand.get("summary")), ""]
        out += [
            "| field | upstream | source | gpustack | why it differs |",
            "|---|---|---|---|---|",
        ]
        for row in operand["rows"]:
            sources = "<br>".join(_source(data, ref) for ref in row["source"])
            why = _text(row.get("why")) or "same"
            if row.get("fixed"):
                why = f"**fixed here:** {_text(row['fixed'])}" + (
                    f" {why}" if row.get("why") else ""
                )
            field = _text(row["field"])
            if row.get("scenarios"):  # a row of one mode: say which scenarios it covers
                field += "<br>in " + ", ".join(f"`{name}`" for name in row["scenarios"])
            out.append(
                f"| {field} | {_text(row['upstream'])} | {sources} | "
                f"{_gpustack_cell(row['gpustack'])} | {why} |"
            )
        out.append("")
    for section in data.get("behaviour") or []:  # prose: not manifests, checked by their tests
        out += [f"## {section['name']}", "", _text(section["text"]), ""]
    out += [_text(data.get("footer")), ""]
    return "\n".join(out)


def counts(data: dict[str, Any]) -> dict[str, int]:
    rows = [row for operand in data["operands"] for row in operand["rows"]]
    return {
        "rows": len(rows),
        "differ": sum(1 for r in rows if r.get("why")),
        "fixed": sum(1 for r in rows if r.get("fixed")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help="regenerate docs/upstream-parity.md")
    group.add_argument("--check", action="store_true", help="fail on drift")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    data = load()
    text = markdown(data)
    if args.write:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC.relative_to(ROOT)}: {counts(data)}")
        return 0
    stale = DOC.read_text(encoding="utf-8") != text
    problems = ["docs/upstream-parity.md is stale"] if stale else []
    drift, compared, unavailable = mismatches(data)
    problems += drift
    for line in problems:
        print(line)
    print(f"{compared} values compared, {len(problems)} problems, {len(unavailable)} not checkable")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
