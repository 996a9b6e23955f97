# -*- coding: utf-8 -*-
"""Fetch an APT repository's signing key on the node, and say in one line why it failed.

Used by gpustack_apt_source, which fetches the key itself (on every run) so that nothing is
written before the fetch succeeded.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible.module_utils.urls import open_url

# (cause, pattern over the status and message, hint); first match wins. "HTTP" causes show the
# status code when there is one.
FETCH_CAUSES = (
    ("HTTP", r"\b40[13]\b|Unauthori[sz]ed|Forbidden",
     "the mirror refused the credentials: check the user name and password{inputs}"),
    ("not found", r"\b404\b|Not Found|No such file",
     "no key at that URL: check the key URL"),
    ("DNS", r"Name or service not known|resolution|resolve|getaddrinfo|nodename",
     "the node cannot resolve the host name: check the name or the node's DNS (/etc/resolv.conf)"),
    ("TLS", r"SSL|CERTIFICATE|certificate|TLS|handshake",
     "the TLS handshake did not succeed: install the mirror's CA certificate on the node "
     "(update-ca-certificates) or fix the certificate"),
    ("connection", r"refused|timed out|unreachable|No route|Connection|connect",
     "the node cannot reach the host: is the server running, the port right, a firewall or "
     "proxy in the way?"),
    ("HTTP", r"\b5[0-9][0-9]\b", "the server answered with an error: check its logs"),
)  # fmt: skip


def fetch_failure(result, url, hint_inputs=""):
    """One line for a failed fetch of a signing key ({status_code, response, msg}): the cause
    (HTTP status, DNS, TLS, connection) in words, what changed (nothing) and a hint."""
    result = result or {}
    status = result.get("status_code")
    status = status if isinstance(status, int) and status > 0 else None
    said = " ".join(
        " ".join(str(result.get(k)) for k in ("response", "msg") if result.get(k)).split()
    )
    said = said.replace("Request failed: ", "").replace(" Request failed", "").strip()
    probe = "%s %s" % (status or "", said)
    inputs = " (%s)" % hint_inputs if hint_inputs else ""
    for cause, pattern, hint in FETCH_CAUSES:
        if re.search(pattern, probe):
            if status and cause in ("HTTP", "not found"):
                cause = "HTTP %d" % status
            text = "cannot fetch the signing key from %s: %s (%s). Nothing was changed. Hint: %s"
            return text % (url, cause, said or "the request failed", hint.format(inputs=inputs))
    return (
        "cannot fetch the signing key from %s: %s. Nothing was changed. Hint: check that the "
        "URL serves the key and is reachable from the node" % (url, said or "the request failed")
    )


def fetch_key(url, username="", password="", timeout=30):
    """(data, None) or (None, {status_code, response, msg}) for fetch_failure. http(s):// and
    file://; credentials as basic auth (sent at once when given), the node's proxies and netrc
    as get_url uses them."""
    try:
        response = open_url(
            url, timeout=timeout, url_username=username or None, url_password=password or None,
            force_basic_auth=bool(username), http_agent="gpustack",
        )  # fmt: skip
        return response.read(), None
    except Exception as exc:  # HTTPError, URLError, timeouts, TLS: all reported alike
        status = getattr(exc, "code", None)
        if isinstance(status, int):
            return None, {"status_code": status, "response": str(exc)}
        return None, {"status_code": -1, "msg": str(exc) or type(exc).__name__}
