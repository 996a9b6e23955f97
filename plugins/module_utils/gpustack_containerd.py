# -*- coding: utf-8 -*-
"""What containerd has loaded against what its files say (the lost-restart check): its CRI
plugin asked over the socket with a minimal gRPC client (RuntimeService/Status, verbose - what
`crictl info` prints), compared with the runtimes of `containerd config dump`.

Shared by container_runtime's gpustack_containerd_loaded (install, verify), gpustack_apt_install
(a join's containerd_loaded: the same check right after the driver's background transaction) and
gpustack_host_probe (section loaded: status, install's fast path). Read-only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import socket
import struct
import time

from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import effective_dump

SERVICES = ("runtime.v1.RuntimeService", "runtime.v1alpha2.RuntimeService")


# --- a minimal gRPC (HTTP/2, prior knowledge) client for one unary call --------------------
def _frame(kind, flags, stream, payload=b""):
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes(bytearray([kind, flags]))
        + struct.pack(">I", stream)
        + payload
    )


def _hpack_string(text):
    data = text.encode("ascii")
    return bytes(bytearray([len(data)])) + data  # < 127 bytes, no Huffman


def _varint(data, pos):
    shift = value = 0
    while True:
        byte = bytearray(data[pos : pos + 1])[0]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def proto_fields(data):
    """(field number, value) pairs of a protobuf message (varints and byte strings)."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError("unsupported protobuf wire type %d" % wire)
        yield number, value


def grpc_unary(path, method, message, timeout=10):
    """One unary gRPC call over a unix socket; the response message, or None when the server
    sent none (e.g. Unimplemented)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    headers = (
        b"\x83\x86"  # :method POST, :scheme http (static table)
        + b"\x04"
        + _hpack_string(method)  # :path, literal
        + b"\x01"
        + _hpack_string("localhost")  # :authority
        + b"\x0f\x10"
        + _hpack_string("application/grpc")  # content-type (index 31)
        + b"\x00"
        + _hpack_string("te")
        + _hpack_string("trailers")
    )
    body = b"\x00" + struct.pack(">I", len(message)) + message
    window = struct.pack(">I", 1 << 24)
    sock.sendall(
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + _frame(4, 0, 0)  # SETTINGS
        + _frame(8, 0, 0, window)  # WINDOW_UPDATE (connection)
        + _frame(1, 4, 1, headers)  # HEADERS, END_HEADERS
        + _frame(8, 0, 1, window)
        + _frame(0, 1, 1, body)  # DATA, END_STREAM
    )
    buf = [b""]

    def read(count):
        while len(buf[0]) < count:
            chunk = sock.recv(65536)
            if not chunk:
                raise IOError("containerd closed the connection")
            buf[0] += chunk
        out, buf[0] = buf[0][:count], buf[0][count:]
        return out

    data = b""
    try:
        while True:
            head = bytearray(read(9))
            length = (head[0] << 16) | (head[1] << 8) | head[2]
            kind, flags = head[3], head[4]
            stream = struct.unpack(">I", bytes(head[5:9]))[0] & 0x7FFFFFFF
            payload = read(length)
            if kind in (4, 6) and not flags & 1:  # SETTINGS and PING want an ack
                try:
                    sock.sendall(_frame(kind, 1, 0, payload if kind == 6 else b""))
                except (IOError, OSError):
                    pass  # the reply may already be complete; reading decides
            elif kind == 7 or (kind == 3 and stream == 1):
                raise IOError("containerd ended the call (GOAWAY/RST_STREAM)")
            elif kind == 0 and stream == 1:
                data += payload
            if stream == 1 and kind in (0, 1) and flags & 1:
                break
    finally:
        sock.close()
    if len(data) < 5:
        return None
    return data[5 : 5 + struct.unpack(">I", data[1:5])[0]]


def cri_config(sock_path):
    """The CRI plugin's loaded configuration (the JSON `crictl info` prints under "config")."""
    for service in SERVICES:
        reply = grpc_unary(sock_path, "/%s/Status" % service, b"\x08\x01")  # verbose: true
        if reply is None:
            continue
        info = {}
        for number, value in proto_fields(reply):
            if number == 2:  # map<string, string> info
                entry = dict(proto_fields(value))
                info[entry.get(1, b"").decode("utf-8")] = entry.get(2, b"").decode("utf-8")
        if "config" in info:
            return json.loads(info["config"])
    return None


def loaded_runtimes(config):
    """{name: {runtime_type, options}} from the CRI JSON (containerd 1.x and 2.x)."""
    runtimes = ((config or {}).get("containerd") or {}).get("runtimes") or {}
    found = {}
    for name, entry in runtimes.items():
        found[name] = {
            "runtime_type": entry.get("runtimeType") or entry.get("runtime_type") or "",
            "options": entry.get("options") or {},
        }
    return found


# --- the runtimes of the effective configuration on disk ------------------------------------
def _toml_value(text):
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        return text


# containerd 1.x's CRI plugin turns two deprecated tables into runtime handlers when it loads
# its configuration (ValidatePluginConfig, pkg/cri/config/config.go@v1.6.20 and @v1.7.24): a
# `untrusted_workload_runtime` with a runtime_type becomes the runtime "untrusted", and a
# `default_runtime` with a runtime_type becomes the runtime "default" (and the default runtime:
# default_runtime_name = "default"). `containerd config dump` prints the tables as they are, so
# the files' runtimes are read the same way here. containerd 2.x dropped both fields (its dump
# has neither table, and it ignores them in a file with a warning).
LEGACY_RUNTIMES = (("untrusted_workload_runtime", "untrusted"), ("default_runtime", "default"))


def disk_runtimes(dump):
    """{name: {runtime_type, options}} of `.containerd.runtimes.<name>` tables in a dump, with
    the runtimes containerd 1.x derives from its deprecated tables (LEGACY_RUNTIMES)."""
    header = re.compile(
        r"^\[(.*)\.(?:runtimes\.[\"']?([^\"'.\]]+)[\"']?"
        r"|(untrusted_workload_runtime|default_runtime))(\.options)?\]$"
    )
    found, legacy, entries, current, in_options = {}, {}, {}, None, False
    for line in dump.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            match = header.match(stripped)
            current = None
            if match and match.group(1).endswith(".containerd"):
                entries = legacy if match.group(3) else found
                current = match.group(2) or match.group(3)
                entries.setdefault(current, {"runtime_type": "", "options": {}})
            in_options = bool(match and match.group(4))
            continue
        if not current or "=" not in stripped or stripped.startswith("#"):
            continue
        key, value = [part.strip() for part in stripped.split("=", 1)]
        key = key.strip("\"'")
        if in_options:
            entries[current]["options"][key] = _toml_value(value)
        elif key == "runtime_type":
            entries[current]["runtime_type"] = _toml_value(value)
    for table, name in LEGACY_RUNTIMES:
        if (legacy.get(table) or {}).get("runtime_type"):
            found[name] = legacy[table]
    return found


def differences(loaded, disk):
    """What the running daemon lacks or has beyond its files, for the runtime handlers."""
    found = []
    for name in sorted(disk):
        if name not in loaded:
            found.append("runtime %r is in the files but not loaded" % name)
            continue
        want, have = disk[name], loaded[name]
        if want["runtime_type"] and want["runtime_type"] != have["runtime_type"]:
            found.append(
                "runtime %r: loaded type %s, files say %s"
                % (name, have["runtime_type"], want["runtime_type"])
            )
        for key, value in sorted(want["options"].items()):
            if have["options"].get(key) != value:
                found.append(
                    "runtime %r: loaded %s=%r, files say %r"
                    % (name, key, have["options"].get(key), value)
                )
    for name in sorted(set(loaded) - set(disk)):
        found.append("runtime %r is loaded but no longer in the files" % name)
    return found


def loaded_state(config, sock, marker):
    """{loaded, disk, differences, restart_pending, restart_needed} of the running containerd;
    marker: gpustack's restart-pending marker (container_runtime writes it)."""
    pending = bool(marker) and os.path.exists(marker)
    rc, out, err = effective_dump(config)
    disk = {"runtimes": {}, "error": ""}
    if rc != 0:
        disk["error"] = " ".join(err.split())[:300]
    else:
        disk["runtimes"] = disk_runtimes(out)
    loaded = {"available": False, "error": "", "runtimes": {}}
    try:
        config_json = cri_config(sock)
        if config_json is None:
            loaded["error"] = "the CRI plugin did not answer (disabled?)"
        else:
            loaded["available"] = True
            loaded["runtimes"] = loaded_runtimes(config_json)
    except (IOError, OSError, ValueError) as exc:
        loaded["error"] = "cannot ask containerd at %s: %s" % (sock, exc)
    diff = differences(loaded["runtimes"], disk["runtimes"]) if loaded["available"] else []
    if disk["error"]:
        diff = []
    return {
        "loaded": loaded,
        "disk": disk,
        "differences": diff,
        "restart_pending": pending,
        "restart_needed": pending or bool(diff),
    }


# The check's options (gpustack_containerd_loaded's argument spec; gpustack_apt_install's
# containerd_loaded takes the same keys).
LOADED_CHECK_OPTIONS = dict(
    config=dict(type="path", default="/etc/containerd/config.toml"),
    socket=dict(type="path", default="/run/containerd/containerd.sock"),
    marker=dict(type="path", default=""),
    name=dict(type="str", default="nvidia"),
    binary=dict(type="path", default=""),
    test_container=dict(type="dict", default={}),
)
RUNTIME_OK = "gpustack-runtime-ok"


def test_container(module, params, state):
    """The verify container through the handler the running daemon loaded (skipped: no image, no
    binary, or a running daemon without the handler)."""
    spec = params["test_container"]
    loaded = state["loaded"]
    if not spec.get("image") or not state.get("binary_exists"):
        return {"skipped": True}
    if loaded.get("available") and params["name"] not in loaded.get("runtimes", {}):
        return {"skipped": True}
    handler = loaded.get("runtimes", {}).get(params["name"]) or {}
    options = handler.get("options") or {}
    ctr = module.get_bin_path("ctr")
    cmd = (
        [ctr or "ctr", "--namespace", "gpustack", "run", "--rm"]
        + ["--snapshotter", spec.get("snapshotter") or "overlayfs"]
        + ["--runtime", handler.get("runtime_type") or "io.containerd.runc.v2"]
        + ["--runc-binary", options.get("BinaryName") or params["binary"]]
        + list(spec.get("ctr_args") or [])
        + [spec["image"], spec.get("container") or "gpustack-verify", "/bin/sh", "-c",
           "echo " + RUNTIME_OK]
    )  # fmt: skip
    if not ctr:
        return {"rc": 127, "stdout": "", "stderr": "ctr: not found in PATH", "cmd": cmd,
                "attempts": 0}  # fmt: skip
    for attempt in range(1, 4):
        rc, out, err = module.run_command(cmd)
        if RUNTIME_OK in out or attempt == 3:
            return {"rc": rc, "stdout": out, "stderr": err, "cmd": cmd, "attempts": attempt}
        time.sleep(2)


def loaded_check(module, params):
    """gpustack_containerd_loaded's result: loaded_state, with the binary and the effective
    configuration's dump where `binary` is given and the test container where `test_container`
    is (params: LOADED_CHECK_OPTIONS's keys, their defaults filled in)."""
    state = loaded_state(params["config"], params["socket"], params["marker"])
    if params["binary"]:
        rc, out, err = effective_dump(params["config"])  # loaded_state's (once per module run)
        state.update(
            binary_exists=os.path.exists(params["binary"]),
            dump={"rc": rc, "stdout": out, "stderr": err},
        )
    if params["test_container"]:
        state["run"] = test_container(module, params, state)
    return state
