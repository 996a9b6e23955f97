# -*- coding: utf-8 -*-
"""Pure helpers of the apt_signed_repo role: split credentials out of repository URLs.

Free of Ansible imports at module level so unit tests can load this file directly.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

try:
    from urllib.parse import unquote, urlsplit, urlunsplit
except ImportError:  # pragma: no cover - Python 2 controllers are not supported
    from urllib import unquote  # type: ignore

    from urlparse import urlsplit, urlunsplit  # type: ignore


def split_credentials(url):
    """(url without user:password@, username, password); both percent-decoded."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, "", ""
    userinfo, _, host = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, unquote(username), unquote(password)


def origin(url):
    parts = urlsplit(split_credentials(url)[0])
    return "%s://%s" % (parts.scheme.lower(), parts.netloc.lower())


def machine(url):
    """apt_auth.conf(5) machine token for a repository URL: protocol, host, port as written and
    the path up to the first apt variable such as $(ARCH), without a trailing slash. The
    protocol is always written: without it an entry matches https only."""
    parts = urlsplit(split_credentials(url)[0])
    path = parts.path.split("$(", 1)[0].rstrip("/")
    return "%s://%s%s" % (parts.scheme.lower(), parts.netloc, path)


def credentials(url, username="", password="", key_url=None):
    """What the role needs for `url` (or for `key_url`, the signing key that belongs to it).

    Explicit inputs win over credentials in the URL. A key URL gets the repository's
    credentials only when it is on the same origin (scheme, host, port) and carries none itself.
    """
    repo, url_user, url_password = split_credentials(url)
    username = username or url_user
    password = password or url_password
    if key_url is not None:
        key, key_user, key_password = split_credentials(key_url)
        if key.lower().startswith("file:"):
            username = password = ""
        elif key_user or key_password:
            username, password = key_user, key_password
        elif origin(key) != origin(repo):
            username = password = ""
        return {"url": key, "username": username, "password": password}
    if repo.lower().startswith("file:"):
        username = password = ""
    return {
        "url": repo,
        "username": username,
        "password": password,
        "machine": machine(repo) if (username or password) else "",
    }


# (cause, pattern over get_url's status and message, hint); first match wins. "HTTP" causes
# show the status code when there is one.
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
    """One line for a failed get_url of a signing key: the cause (HTTP status, DNS, TLS,
    connection) in words, what changed (nothing) and a hint."""
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


class FilterModule(object):
    def filters(self):
        return {
            "apt_signed_repo_credentials": credentials,
            "apt_signed_repo_fetch_failure": fetch_failure,
        }
