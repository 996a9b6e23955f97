# -*- coding: utf-8 -*-
"""Pure MIG layout logic for gpustack's nvidia_mig role: no I/O, no Ansible, Python 3 stdlib only.

* parse_config: nvidia-mig-parted's `version: v1` layout format, with the rules of
  NVIDIA/mig-parted@bd7160f4 api/spec/v1/spec.go and pkg/types/mig_config.go (AssertValidFormat)
  and the profile grammar of go-nvlib's parseMigProfile (vendored in the same commit).
* select_entry: which layout entry applies to a GPU (device-filter, devices), as
  cmd/nvidia-mig-parted/assert/assert.go WalkSelectedMigConfigForEachGPU walks them.
* parse_*: nvidia-smi's query CSV and its `mig -lgi/-lci/-lgip` tables (formats of the MIG User
  Guide, "Getting Started with MIG").
* plan_gpu: the steps that take one GPU from what it is to what the layout asks.

The same file runs on hosts as part of gpustack-mig.service (see gpustack_mig_apply.py).
"""

from __future__ import absolute_import, division, print_function

import itertools
import re

__metaclass__ = type

ENABLED, DISABLED, NOT_CAPABLE = "Enabled", "Disabled", "[N/A]"
SPEC_KEYS = ("device-filter", "devices", "mig-enabled", "mig-devices")
GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "pci.device_id",
    "pci.sub_device_id",
    "mig.mode.current",
    "mig.mode.pending",
)
_NUMBER = re.compile(r"^(\d+)(c|g|gb)$")
_ATTRIBUTE = re.compile(r"^[A-Za-z][A-Za-z0-9.]*$")


def _is_int(value):
    # Ansible may hand over int subclasses (tagged values); a bool is never a count.
    return isinstance(value, int) and not isinstance(value, bool)


class LayoutError(ValueError):
    """A layout file or entry nvidia-mig-parted would reject too."""


# ---------------------------------------------------------------- profiles
def parse_profile(text):
    """'1g.10gb', '1c.3g.40gb', '1g.10gb+me' -> (c, g, gb, attrs, negattrs); else LayoutError."""
    if not isinstance(text, str) or not text:
        raise LayoutError("profile %r is not a string like 1g.10gb" % (text,))
    plus, minus = text.split("+", 1), text.split("-", 1)
    if len(plus) == 2 and len(minus) == 2:
        raise LayoutError("profile %r has both + and - attributes" % text)
    base, rest, negative = (
        (plus[0], plus[1], False)
        if len(plus) == 2
        else ((minus[0], minus[1], True) if len(minus) == 2 else (text, None, False))
    )
    fields = base.split(".")
    if len(fields) not in (2, 3):
        raise LayoutError("profile %r: expected <g>g.<gb>gb or <c>c.<g>g.<gb>gb" % text)
    numbers = []
    for field, unit in zip(fields, ("c", "g", "gb")[3 - len(fields) :]):
        match = _NUMBER.match(field)
        if not match or match.group(2) != unit:
            raise LayoutError("profile %r: malformed field %r" % (text, field))
        numbers.append(int(match.group(1)))
    c, g, gb = numbers if len(numbers) == 3 else [numbers[0]] + numbers
    attrs = []
    if rest is not None:
        attrs = rest.split(",")
        if len(set(attrs)) != len(attrs) or not all(
            _ATTRIBUTE.match(a) and not a.endswith(".") for a in attrs
        ):
            raise LayoutError("profile %r: malformed attributes" % text)
    return (
        c,
        g,
        gb,
        tuple(sorted(attrs)) if not negative else (),
        tuple(sorted(attrs)) if negative else (),
    )


def profile_name(text):
    """Canonical name, as nvidia-mig-parted prints it: '1c.1g.10gb' -> '1g.10gb'."""
    c, g, gb, attrs, neg = parse_profile(text)
    name = ("%dc." % c if c != g else "") + "%dg.%dgb" % (g, gb)
    if attrs:
        name += "+" + ",".join(attrs)
    if neg:
        name += "-" + ",".join(neg)
    return name


# ---------------------------------------------------------------- layout files
def _check_entry(config, k, entry):
    where = "mig-configs.%s[%d]" % (config, k)
    if not isinstance(entry, dict):
        raise LayoutError("%s: expected a mapping" % where)
    unknown = sorted(set(entry) - set(SPEC_KEYS))
    if unknown:
        raise LayoutError("%s: unexpected field: %s" % (where, unknown[0]))
    for required in ("devices", "mig-enabled"):
        if required not in entry:
            raise LayoutError("%s: missing required field: %s" % (where, required))
    devices = entry["devices"]
    if devices != "all" and not (
        isinstance(devices, list) and all(_is_int(d) and d >= 0 for d in devices)
    ):
        raise LayoutError("%s: devices must be 'all' or a list of GPU indexes" % where)
    filters = entry.get("device-filter")
    filters = [filters] if isinstance(filters, str) else filters
    if filters is not None and not (
        isinstance(filters, list) and all(_device_id(f) for f in filters)
    ):
        raise LayoutError("%s: device-filter must be PCI ids like 0x233010DE" % where)
    if not isinstance(entry["mig-enabled"], bool):
        raise LayoutError("%s: mig-enabled must be true or false" % where)
    devices_map = entry.get("mig-devices")
    if entry["mig-enabled"] and devices_map is None:
        raise LayoutError(
            "%s: missing required field 'mig-devices' when 'mig-enabled' is true" % where
        )
    if not entry["mig-enabled"] and devices_map:
        raise LayoutError("%s: MIG devices included when 'mig-enabled' is false" % where)
    devices_map = devices_map or {}
    if not isinstance(devices_map, dict):
        raise LayoutError("%s: mig-devices must map profiles to counts" % where)
    for name, count in devices_map.items():
        try:
            parse_profile(name)
        except LayoutError as exc:
            raise LayoutError("%s: %s" % (where, exc)) from None
        if not _is_int(count) or count < 0:
            raise LayoutError("%s: invalid count %r for %s" % (where, count, name))
    if devices_map and not any(devices_map.values()):
        raise LayoutError("%s: all counts for all MIG profiles are 0" % where)


def parse_config(doc):
    """Validate a loaded layout file; return {name: [entries]}."""
    if not isinstance(doc, dict) or doc.get("version") != "v1":
        raise LayoutError("not an nvidia-mig-parted layout file: 'version: v1' is required")
    unknown = sorted(set(doc) - {"version", "mig-configs"})
    if unknown:
        raise LayoutError("unexpected field: %s" % unknown[0])
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise LayoutError("at least one entry in 'mig-configs' is required")
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise LayoutError("at least one entry in '%s' is required" % name)
        for k, entry in enumerate(entries):
            _check_entry(name, k, entry)
    return configs


def desired_devices(entry):
    """{canonical profile: count} of an entry, zero counts dropped."""
    out = {}
    for name, count in (entry.get("mig-devices") or {}).items():
        if count:
            key = profile_name(name)
            out[key] = out.get(key, 0) + count
    return out


# ---------------------------------------------------------------- device selection
def _device_id(text):
    """'0x233010DE' or '0x233010DE:0x16C110DE' -> (device+vendor, sub or None); None if bad."""
    try:
        parts = [int(p, 16) for p in str(text).split(":")]
    except ValueError:
        return None
    return (parts[0], parts[1] if len(parts) == 2 else None) if 1 <= len(parts) <= 2 else None


def matches_filter(entry, device_id, sub_device_id=None):
    filters = entry.get("device-filter")
    filters = [filters] if isinstance(filters, str) else (filters or [])
    if not filters:
        return True
    have = (_device_id(device_id) or (None,))[0]
    sub = (_device_id(sub_device_id) or (None,))[0] if sub_device_id else None
    for text in filters:
        want, want_sub = _device_id(text)
        if want == have and (want_sub is None or want_sub == sub):
            return True
    return False


def select_entry(entries, gpu):
    """The entry that decides this GPU: the last that matches (mig-parted applies them in order)."""
    chosen = None
    for entry in entries:
        devices = entry["devices"]
        if devices != "all" and gpu["index"] not in devices:
            continue
        if matches_filter(entry, gpu.get("device_id"), gpu.get("sub_device_id")):
            chosen = entry
    return chosen


# ---------------------------------------------------------------- nvidia-smi outputs
def parse_query_gpu(text):
    """Rows of `--query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits` -> GPU dicts."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(GPU_FIELDS):
            raise ValueError("unexpected nvidia-smi query line: %r" % line)
        row = dict(zip(GPU_FIELDS, cells))
        gpus.append(
            {
                "index": int(row["index"]),
                "uuid": row["uuid"],
                "name": row["name"],
                "bus_id": row["pci.bus_id"],
                "device_id": row["pci.device_id"],
                "sub_device_id": row["pci.sub_device_id"],
                "mig_capable": row["mig.mode.current"] in (ENABLED, DISABLED),
                "mode_current": row["mig.mode.current"],
                "mode_pending": row["mig.mode.pending"],
            }
        )
    return gpus


def parse_compute_apps(text):
    """`--query-compute-apps=pid,gpu_uuid,process_name --format=csv,noheader` -> process dicts."""
    procs = []
    for line in text.splitlines():
        cells = line.split(", ", 2)
        if len(cells) == 3 and cells[0].strip().isdigit():
            procs.append(
                {"pid": int(cells[0]), "gpu_uuid": cells[1].strip(), "name": cells[2].strip()}
            )
    return procs


_LIST_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")
_LIST_MIG = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)]+)\)")


def parse_list(text):
    """`nvidia-smi -L` -> {GPU or MIG device UUID: GPU index}."""
    owner, index = {}, None
    for line in text.splitlines():
        gpu, mig = _LIST_GPU.match(line), _LIST_MIG.match(line)
        if gpu:
            index = int(gpu.group(1))
            owner[gpu.group(2)] = index
        elif mig and index is not None:
            owner[mig.group(1)] = index
    return owner


_LGI = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|$")
_LCI = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s*\|$")
_LGIP = re.compile(
    r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(Yes|No)\s+(\d+)\s+\d+\s+\d+\s*\|$"
)


def parse_lgi(text):
    return [
        {
            "gpu": int(m.group(1)),
            "name": m.group(2),
            "profile_id": int(m.group(3)),
            "gi": int(m.group(4)),
            "start": int(m.group(5)),
            "size": int(m.group(6)),
        }
        for m in map(_LGI.match, text.splitlines())
        if m
    ]


def parse_lci(text):
    return [
        {
            "gpu": int(m.group(1)),
            "gi": int(m.group(2)),
            "name": m.group(3),
            "profile_id": int(m.group(4)),
            "ci": int(m.group(5)),
        }
        for m in map(_LCI.match, text.splitlines())
        if m
    ]


def parse_lgip(text):
    """-> {gpu index: {canonical profile: {"id", "free", "total", "g", "gib"}}}."""
    out = {}
    for m in map(_LGIP.match, text.splitlines()):
        if m:
            name = profile_name(m.group(2))
            out.setdefault(int(m.group(1)), {})[name] = {
                "id": int(m.group(3)),
                "free": int(m.group(4)),
                "total": int(m.group(5)),
                "g": parse_profile(name)[1],
                "gib": float(m.group(6)),
            }
    return out


def current_devices(gpu_index, gis, cis):
    """A MIG-enabled GPU's instances keyed like a layout ('1g.10gb', '1c.3g.40gb'); empty GIs."""
    devices, empty = {}, 0
    for gi in (g for g in gis if g["gpu"] == gpu_index):
        gi_name = profile_name(gi["name"])
        g = parse_profile(gi_name)[1]
        mine = [c for c in cis if c["gpu"] == gpu_index and c["gi"] == gi["gi"]]
        if not mine:
            empty += 1
        for ci in mine:
            c = int(ci["name"].split("c.", 1)[0]) if re.match(r"^\d+c\.", ci["name"]) else g
            key = gi_name if c == g else "%dc.%s" % (c, gi_name)
            devices[key] = devices.get(key, 0) + 1
    return devices, empty


# ---------------------------------------------------------------- planning
def check_profiles(wanted, available):
    """Why `wanted` ({profile: count}) cannot be created from `-lgip` data, or None."""
    unknown = sorted(p for p in wanted if p not in available)
    if unknown:
        return "profile %s is not offered by this GPU (it offers %s)" % (
            ", ".join(unknown),
            ", ".join(sorted(available)) or "none",
        )
    for name, count in sorted(wanted.items()):
        if count > available[name]["total"]:
            return "%d x %s asked, the GPU holds at most %d" % (
                count,
                name,
                available[name]["total"],
            )
    slices = max(p["g"] for p in available.values())
    used = sum(available[n]["g"] * k for n, k in wanted.items())
    if used > slices:
        return "the profiles need %d compute slices, the GPU has %d" % (used, slices)
    return None


def creation_orders(wanted, available, limit=24):
    """Profile ids to pass to `-cgi`, biggest first (placement), then other orders to retry with."""
    flat = sorted(
        (n for n, k in wanted.items() for _ in range(k)),
        key=lambda n: (-available[n]["g"], -available[n]["gib"], n),
    )
    orders, seen = [], set()
    for perm in itertools.chain([tuple(flat)], itertools.permutations(flat)):
        if perm not in seen:
            seen.add(perm)
            orders.append([available[n]["id"] for n in perm])
        if len(orders) >= limit:
            break
    return orders


def plan_gpu(gpu, entry, current):
    """Steps for one GPU: destroy, set-mode, reset, create. `current` = current_devices() result.

    Returns {"in_layout", "desired_mode", "desired", "steps", "problem"}; problem set means the
    layout cannot apply to this GPU and nothing may be changed.
    """
    plan = {
        "in_layout": entry is not None,
        "desired_mode": None,
        "desired": None,
        "steps": [],
        "problem": None,
    }
    if entry is None:
        plan["problem"] = "the layout has no entry for GPU %d (%s, %s)" % (
            gpu["index"],
            gpu["name"],
            gpu["device_id"],
        )
        return plan
    want = ENABLED if entry["mig-enabled"] else DISABLED
    plan["desired_mode"] = want
    plan["desired"] = desired_devices(entry) if entry["mig-enabled"] else None
    if not gpu["mig_capable"]:
        if entry["mig-enabled"] and entry["devices"] != "all":
            plan["problem"] = "GPU %d (%s) is not MIG-capable" % (gpu["index"], gpu["name"])
        plan["desired_mode"] = NOT_CAPABLE
        return plan
    devices, empty = current
    has_instances = bool(devices) or empty > 0
    steps = plan["steps"]
    if (
        gpu["mode_current"] == ENABLED
        and has_instances
        and (gpu["mode_pending"] != want or want == DISABLED or devices != plan["desired"] or empty)
    ):
        steps.append("destroy")
    if gpu["mode_pending"] != want:
        steps.append("set-mode")
    if gpu["mode_current"] != want:
        steps.append("reset")
    if want == ENABLED and ("reset" in steps or "destroy" in steps or devices != plan["desired"]):
        if plan["desired"]:
            steps.append("create")
    return plan


def describe(gpu, plan):
    """Human words for a plan: 'GPU 0: enable MIG mode (reset or reboot), create 7 x 1g.10gb'."""
    words = []
    steps = plan["steps"]
    if "destroy" in steps:
        words.append("destroy its MIG instances")
    if "set-mode" in steps or "reset" in steps:
        verb = "enable" if plan["desired_mode"] == ENABLED else "disable"
        words.append("%s MIG mode%s" % (verb, " (reset or reboot)" if "reset" in steps else ""))
    if "create" in steps:
        words.append(
            "create " + ", ".join("%d x %s" % (k, n) for n, k in sorted(plan["desired"].items()))
        )
    return "GPU %d: %s" % (gpu["index"], ", ".join(words))
