# -*- coding: utf-8 -*-
"""The one place gpustack's host modules read a host: files, commands, packages, holds, units,
and whether a (dumped) containerd configuration holds the nvidia runtime.

Shipped to the host with every module that imports it (gpustack_host_probe, gpustack_converged,
gpustack_smoke_probe). Reads only; nothing here changes the host.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import hashlib
import os
import re
import subprocess

# Directories searched after PATH (a module's PATH on a host can be minimal, an SSH session's
# always is); a module adds the ones its arguments name (RKE2's binary directory). Last, the
# driver tree of hosts whose driver is not a package (the H100 VMs of docs/gpu-hosts.md have one
# there, with /usr/local/nvidia/bin first on their login PATH; they also have /usr/bin/nvidia-smi).
EXTRA_PATH = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/usr/local/nvidia/bin",
]


def read(path, default=None):
    try:
        with open(path, "r") as fh:
            return fh.read()
    except (IOError, OSError, TypeError):
        return default


def slurp(path):
    """(exists, content base64, error) of a file, as ansible.builtin.slurp reads it; exists is
    true for a file that is there but cannot be read (error says why)."""
    try:
        with open(path, "rb") as fh:
            return True, base64.b64encode(fh.read()).decode("ascii"), ""
    except (IOError, OSError) as exc:
        return os.path.lexists(path), "", str(exc)


def run(args, data=None, env=None):
    """(rc, stdout, stderr) of a command, fed `data` (str) when given; a missing binary is rc
    127. A command that exits before reading its input (dpkg on a held lock) still gives its own
    rc and stderr: communicate() ignores the broken pipe (run_command fails on it instead)."""
    if args and os.sep not in args[0]:  # a bare name: PATH, then EXTRA_PATH
        args = [which(args[0]) or args[0]] + list(args[1:])
    try:
        stdin = subprocess.PIPE if data is not None else None
        proc = subprocess.Popen(args, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)  # fmt: skip
        out, err = proc.communicate(None if data is None else data.encode("utf-8"))
        return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    except OSError as exc:
        return 127, "", str(exc)


def read_entry(path):
    """A file as gpustack_reads reports it: exists, content (base64), error; a file that cannot
    be read counts as missing (slurp's failed_when: false)."""
    exists, content, error = slurp(path)
    return {"exists": exists and not error, "content": content, "error": error}


def command_entry(argv):
    """A read-only command as gpustack_reads reports it (as ansible.builtin.command runs an argv):
    rc, stdout, stderr (trailing newlines removed), stdout_lines."""
    rc, out, err = run([str(arg) for arg in argv])
    out, err = out.rstrip("\r\n"), err.rstrip("\r\n")
    return {"rc": rc, "stdout": out, "stderr": err, "stdout_lines": out.splitlines()}


def reads(files, commands):
    """(files, commands) of gpustack_reads, none failing: the commands first, then the files (a
    file of /proc read after nvidia-smi, which may load the module through nvidia-modprobe)."""
    ran = {name: command_entry(argv) for name, argv in commands.items()}
    return {name: read_entry(path) for name, path in files.items()}, ran


def read_failure(commands, argvs, must_succeed):
    """The error of the first of `must_succeed` whose command failed, else None."""
    for name in must_succeed:
        if name in commands and commands[name]["rc"] != 0:
            answer = commands[name]
            return "%s failed (rc %d): %s" % (
                " ".join(str(arg) for arg in argvs[name]),
                answer["rc"],
                answer["stderr"] or answer["stdout"],
            )
    return None


# Where apt users read when the package lists were last refreshed, the first that exists counting:
# the success stamp some systems' apt hooks touch (Ubuntu), then the lists directory
# (ansible.builtin.apt's get_cache_mtime()).
APT_LISTS_MARKS = ["/var/lib/apt/periodic/update-success-stamp", "/var/lib/apt/lists"]


def lists_mtime(paths):
    """The mtime of the first of `paths` that exists, or None."""
    for path in paths:
        if os.path.exists(path):
            return os.stat(path).st_mtime
    return None


def apt_option_args(options):
    """`-o` arguments for apt-get and apt-cache, one per option."""
    args = []
    for option in options:
        args += ["-o", option]
    return args


def parse_apt_errors(output):
    """apt-get update's complaints (gpustack_apt_source: about one source; gpustack_apt_lists: about
    every source): [(uri or '', reason)], warnings."""
    errors, warnings = [], []
    lines = output.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^Err:\d+\s+(\S+)", line)
        if match:
            reason = []
            for follow in lines[i + 1 :]:
                if not follow.startswith(" "):
                    break
                reason.append(follow.strip())
            errors.append((match.group(1), " ".join(reason)))
            continue
        match = re.match(r"^([WE]):\s*(.*)$", line)
        if not match:
            continue
        text = match.group(2)
        if text.startswith("Some index files failed to download"):
            continue
        fetch = re.match(r"^Failed to fetch (\S+)\s+(.*)$", text)
        if fetch:
            if not any(fetch.group(2) == reason for _, reason in errors):
                errors.append((fetch.group(1), fetch.group(2)))
        elif match.group(1) == "E" or re.search(r"GPG error|NO_PUBKEY|signature", text):
            errors.append(("", text))
        else:
            warnings.append(text)
    return errors, warnings


def process(pid):
    """'pid N (command line)' of a running process (its command line cut at 160 characters), or
    'pid N' when it cannot be read: how gpustack names a lock's holder in its messages."""
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except (IOError, OSError):
        cmdline = ""
    return "pid %s (%s)" % (pid, cmdline[:160]) if cmdline else "pid %s" % pid


def which(name):
    for directory in os.environ.get("PATH", "").split(os.pathsep) + EXTRA_PATH:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def sha256(path):
    try:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(65536), b""):
                digest.update(block)
        return digest.hexdigest()
    except (IOError, OSError):
        return None


def parse_dpkg(text):
    """`Package Version Status-Abbrev` lines -> {package: version} of installed packages."""
    found = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2][:2] in ("ii", "hi"):  # installed, maybe held
            found[parts[0]] = parts[1]
    return found


def packages(names):
    """{package: version} of the installed packages among names (dpkg patterns or rpm names)."""
    if not names:
        return {}
    if which("dpkg-query"):
        _, out, _ = run(
            ["dpkg-query", "-W", "-f=${Package} ${Version} ${db:Status-Abbrev}\n"] + list(names)
        )
        return parse_dpkg(out)
    if which("rpm"):
        _, out, _ = run(["rpm", "-qa", "--qf", "%{NAME} %{VERSION}-%{RELEASE} ii\n"] + list(names))
        return parse_dpkg(out)
    return {}


def holds(versionlock="/etc/dnf/plugins/versionlock.list"):
    """Held packages: apt-mark showhold, or dnf's versionlock list."""
    if which("apt-mark"):
        rc, out, _ = run(["apt-mark", "showhold"])
        return sorted(set(out.split())) if rc == 0 else []
    if which("dnf"):
        # versionlock entries look like name-epoch:version-release.*
        lines = [x for x in (read(versionlock, "") or "").splitlines() if x.strip() and x[0] != "#"]
        return sorted(set(re.sub(r"-[0-9]+:.*$", "", line).strip() for line in lines))
    return []


def service_active(name):
    """True/False from systemd; None (unknown) where systemd is not the init system: a systemctl
    binary there answers "inactive" for a daemon started by other means (sd_booted(3): the
    directory /run/systemd/system exists only when systemd booted the host)."""
    if not which("systemctl") or not os.path.isdir("/run/systemd/system"):
        return None
    rc, _, _ = run(["systemctl", "is-active", "--quiet", name])
    return rc == 0


def service_states(units):
    """{unit: {"enabled": UnitFileState, "active": ActiveState}} in one systemctl call."""
    states = dict((unit, {"enabled": "", "active": ""}) for unit in units)
    if not units:
        return states
    _, out, _ = run(["systemctl", "show", "--property=Id,UnitFileState,ActiveState"] + units)
    blocks = out.split("\n\n") + [""] * len(units)
    for unit, block in zip(units, blocks[: len(units)]):  # padded above
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[unit] = {
            "enabled": props.get("UnitFileState", ""),
            "active": props.get("ActiveState", ""),
        }
    return states


def pinned_version(text):
    """The version of an apt preferences file gpustack wrote (`Pin: version X`)."""
    match = re.search(r"^Pin:\s*version\s+(\S+)", text or "", re.MULTILINE)
    return match.group(1) if match else None


def pins(text):
    """{package: version} of every `Package:`/`Pin: version` stanza of a gpustack pin file."""
    found = {}
    for stanza in re.split(r"\n\s*\n", text or ""):
        package = re.search(r"^Package:\s*(.+)$", stanza, re.MULTILINE)
        version = pinned_version(stanza)
        if package and version:
            for name in package.group(1).split():
                found[name] = version
    return found


def toml_has_runtime(text, name, binary):
    """Whether a (dumped) TOML text defines runtimes.<name> with BinaryName <binary>."""
    quoted = r"[\"']?%s[\"']?" % re.escape(name)
    header = re.compile(r"^\s*\[.*\.runtimes\.%s(\.options)?\]\s*$" % quoted)
    in_entry = has_entry = has_binary = False
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            in_entry = bool(header.match(stripped))
            has_entry = has_entry or in_entry
            continue
        if in_entry and re.match(r"BinaryName\s*=\s*[\"']%s[\"']" % re.escape(binary), stripped):
            has_binary = True
    return has_entry and has_binary


def toml_enable_cdi(text):
    """`enable_cdi` of a `containerd config dump` (the CRI plugin's; the dump has no other key of
    that name): True or False, None where containerd has no such setting (1.6)."""
    match = re.search(r"^\s*enable_cdi\s*=\s*(true|false)\s*$", text or "", re.MULTILINE)
    return None if match is None else match.group(1) == "true"


def first_version(text):
    match = re.search(r"v?(\d+\.\d+(?:\.\d+)?(?:[-+~][0-9A-Za-z.+~-]*)?)", text or "")
    return match.group(1) if match else None


_DUMPS = {}


def containerd_dump(config):
    """(rc, stdout, stderr) of `containerd config dump` for a configuration file, asked once per
    module run (the stamps, the wiring and the loaded-state checks all read it; a module that
    writes the configuration does so before it reads)."""
    if config not in _DUMPS:
        _DUMPS[config] = run(["containerd", "--config", config, "config", "dump"])
    return _DUMPS[config]


def effective_dump(config):
    """containerd_dump of the effective configuration: the main file's, or without one
    containerd's built-in defaults (`config dump` needs a file: /dev/null stands for none)."""
    return containerd_dump(config if os.path.exists(config) else "/dev/null")
