"""Files a user hands gpustack, checked before Ansible reads them: text that is UTF-8, YAML
whose aliases do not expand without end; and messages that quote them kept to one line."""

from __future__ import annotations

from pathlib import Path

from gpustack.errors import BadInput


def printable(text: str, limit: int = 300) -> str:
    """`text` on one line, undecodable or control characters as `?`, at most `limit` long: an
    error message quoting a binary file stays one readable line."""
    text = "".join(c if c.isprintable() and c != "\ufffd" else "?" for c in " ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


MAX_EXPANDED = 100_000  # YAML values of one inventory or vars file, each alias counted again
_SCAN_FILES = 2_000


def check_files(path: Path, where: str) -> None:
    """Before Ansible reads an inventory (file or directory, with the group_vars/ and host_vars/
    beside it): each file is UTF-8 text (ansible-core deprecates anything else and reads it
    mangled), and no YAML file's aliases expand past MAX_EXPANDED values (a "billion laughs"
    file makes Ansible's own inventory parser run for ever)."""
    base = path if path.is_dir() else path.parent
    candidates = [path] if path.is_file() else []
    for folder in ([path] if path.is_dir() else []) + [base / "group_vars", base / "host_vars"]:
        if folder.is_dir():
            candidates += sorted(p for p in folder.rglob("*") if p.is_file())[:_SCAN_FILES]
    for file in candidates[:_SCAN_FILES]:
        try:
            data = file.read_bytes()
        except OSError:
            continue  # Ansible says why when it reads it
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if file.suffix in (".retry", ".pyc") or _is_vault(data):
                continue
            what = where if file == path else f"{where}: {file.relative_to(base)}"
            hint = "inventories and vars files are UTF-8 text (INI, YAML or JSON)"
            raise BadInput(f"{what} is not UTF-8 text (byte {exc.start})", hint) from None
        size = _yaml_expanded_size(text)
        if size > MAX_EXPANDED:
            what = "its" if file == path else f"those of {file.relative_to(base)}"
            raise BadInput(
                f"{where}: {what} YAML aliases expand to more than {MAX_EXPANDED} values",
                "write the values out (or with fewer &anchor/*alias levels)",
            )


def _is_vault(data: bytes) -> bool:
    return data.lstrip().startswith(b"$ANSIBLE_VAULT")


def _yaml_expanded_size(text: str) -> int:
    """How many values a YAML document holds once every alias is expanded (0 when it is not
    YAML or holds no alias): counted over PyYAML's node graph, each node once (memoized)."""
    if "*" not in text or "&" not in text:
        return 0
    import yaml

    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        nodes = list(yaml.compose_all(text, Loader=loader_class))
    except (yaml.YAMLError, RecursionError, ValueError):
        return 0  # not YAML, or broken: Ansible's parser reports it
    sizes: dict[int, int] = {}

    def size(node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        sizes[id(node)] = 1  # a recursive alias counts once
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(v) for v in node.value)
        sizes[id(node)] = min(total, MAX_EXPANDED + 1)
        return sizes[id(node)]

    try:
        return sum(size(node) for node in nodes if node is not None)
    except RecursionError:
        return 0


def readable(path: Path) -> bool:
    """Whether the first byte of `path` can be read (a directory, a FIFO or a file without read
    permission cannot)."""
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError:
        return False
    return True
