# -*- coding: utf-8 -*-
"""Pure helpers of the apt_signed_repo role: split credentials out of repository URLs.

Free of Ansible imports at module level so unit tests can load this file directly.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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


class FilterModule(object):
    def filters(self):
        return {
            "apt_signed_repo_credentials": credentials,
        }
