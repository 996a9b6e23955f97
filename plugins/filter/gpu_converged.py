# -*- coding: utf-8 -*-
"""Keep secrets out of converged stamps: role inputs are recorded and compared redacted.

A password input, the content of a password file and the user:password part of a URL are
replaced by a salted, slow digest (PBKDF2-HMAC-SHA256): a changed secret still changes the
recorded input (so the fast path still runs the role), the stamp never holds the secret.
Runs on the controller (filters do), for the recorded and the probed inputs alike.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import re

try:
    from functools import lru_cache
except ImportError:  # pragma: no cover - Python 2 controllers are not supported
    lru_cache = None

ITERATIONS = 100000
USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#]*)@")


def _digest(name, value):
    salt = ("gpustack-converged-stamp:" + name).encode("utf-8")
    raw = hashlib.pbkdf2_hmac("sha256", value.encode("utf-8"), salt, ITERATIONS)
    return "<secret pbkdf2-sha256:%s>" % raw.hex()[:32]


if lru_cache is not None:  # one computation per secret and name, however many hosts
    _digest = lru_cache(maxsize=256)(_digest)


def _file_content(path):
    try:
        with open(path, "rb") as fh:
            lines = fh.read().decode("utf-8", "replace").splitlines()
        return lines[0] if lines else ""
    except (IOError, OSError):
        return None


def _redact_urls(name, text):
    """`scheme://user:pw@host/p` -> `scheme://host/p (credentials <secret ...>)`: no longer
    URL-shaped credentials, so the CLI's masking of events and output leaves the digest alone
    (it would mask every digest alike, and a changed password would go unnoticed)."""
    digests = []

    def repl(match):
        digests.append(_digest(name + ":url", match.group("userinfo")))
        return match.group("scheme")

    clean = USERINFO.sub(repl, text)
    return "%s (credentials %s)" % (clean, " ".join(digests)) if digests else text


def redact_value(name, value):
    if isinstance(value, dict):
        return dict((k, redact_value(name, v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [redact_value(name, v) for v in value]
    if not isinstance(value, str) or not value or value == "__unset__":
        return value
    if name.endswith("_password"):
        return _digest(name, value)
    if name.endswith("_password_file"):
        content = _file_content(value)
        shown = "unreadable" if content is None else _digest(name, content)
        return "%s (content %s)" % (value, shown)
    return _redact_urls(name, value)


def redact_inputs(inputs):
    """{name: value} -> the same with every secret replaced by its digest."""
    return dict((name, redact_value(name, value)) for name, value in (inputs or {}).items())


def decide(facts, content):
    """The converged decision for one host, in the play (install and plan's fast path): the
    probe's facts -> {converged, reasons, published}. The rules are gpustack's own
    (gpustack/fleet/converged.py); the CLI that passes the content hash provides them."""
    try:
        from gpustack.fleet import converged
    except ImportError as err:
        from ansible.errors import AnsibleFilterError

        raise AnsibleFilterError(
            "gpu_converged_decide needs the gpustack package on the controller "
            "(only `gpustack install` and `gpustack plan` turn the converged check on)"
        ) from err
    decision = converged.decide("", facts or {}, content)
    return dict(decision.to_dict(), published=decision.published)


class FilterModule(object):
    def filters(self):
        return {"gpu_converged_redact": redact_inputs, "gpu_converged_decide": decide}
