"""Typed checks of the role inputs a user passes with -e, before any host is contacted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from gpustack import credentials
from gpustack.driver_version import on_branch
from gpustack.errors import BadInput

_VERSION = re.compile(r"^([0-9]+:)?[0-9]+(\.[0-9]+)+([-+~.][0-9A-Za-z.+~-]*)?$")
_BOOL = ("true", "false", "yes", "no", "1", "0", "on", "off")


class DriverInputs(BaseModel):
    """The nvidia_driver inputs that can be wrong in ways a user should hear about at once."""

    model_config = ConfigDict(extra="ignore")

    nvidia_driver_source: Literal["cuda_repo", "distro", "mirror"] = "cuda_repo"
    nvidia_driver_branch: str = ""
    nvidia_driver_version: str = ""
    nvidia_driver_reboot: Literal["never", "if_needed", "always"] = "never"
    nvidia_driver_mirror_url: str = ""

    @field_validator("nvidia_driver_branch", mode="before")
    @classmethod
    def _branch(cls, value: Any) -> str:
        text = str(value).strip()
        if text and not text.isdigit():
            raise ValueError(f"{text!r} is not a driver branch (digits, e.g. 580)")
        return text

    @field_validator("nvidia_driver_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> str:
        text = str(value).strip()
        if text and not _VERSION.match(text):
            raise ValueError(f"{text!r} is not a package version (e.g. 535.309.01-0+deb12u1)")
        return text


def check_extra_vars(extravars: dict[str, Any], where: str = "-e") -> None:
    """Raise BadInput for the first invalid gpustack input among the extra vars (or `where`)."""
    credentials.register_inputs(extravars)
    check_sources(extravars, where)
    for name in ("gpustack_require_gpu",):
        if name in extravars and str(extravars[name]).lower() not in _BOOL:
            raise BadInput(f"{where} {name}={extravars[name]}: not a boolean", "use true or false")
    try:
        inputs = DriverInputs.model_validate(extravars)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = err["loc"][0]
        message = err["msg"].removeprefix("Value error, ")
        raise BadInput(
            f"{where} {name}: {credentials.scrub(message)}",
            _HINTS.get(str(name), "see docs/variables.md"),
        ) from None
    if inputs.nvidia_driver_source == "mirror" and not inputs.nvidia_driver_mirror_url:
        raise BadInput(
            "nvidia_driver_source=mirror needs nvidia_driver_mirror_url",
            "add -e nvidia_driver_mirror_url=https://mirror.example/cuda/repos",
        )
    if (
        inputs.nvidia_driver_version
        and inputs.nvidia_driver_branch
        and not on_branch(inputs.nvidia_driver_version, inputs.nvidia_driver_branch)
    ):
        raise BadInput(
            f"nvidia_driver_version {inputs.nvidia_driver_version} is not on branch "
            f"{inputs.nvidia_driver_branch}",
            "give one of them, or make them agree",
        )


_HINTS = {
    "nvidia_driver_source": "choose cuda_repo, distro or mirror",
    "nvidia_driver_reboot": "choose never, if_needed or always",
    "nvidia_driver_branch": "e.g. -e nvidia_driver_branch=580",
    "nvidia_driver_version": "the exact package version, e.g. 535.261.03-1",
}


# Repository and key URLs of the roles, and the schemes each accepts.
REPO_URLS = (
    "nvidia_driver_mirror_url",
    "nvidia_driver_cuda_repo_url",
    "nvidia_container_toolkit_mirror_url",
    "nvidia_container_toolkit_repo_url",
)
KEY_URLS = (
    "nvidia_driver_mirror_key_url",
    "nvidia_container_toolkit_key_url",
    "nvidia_container_toolkit_mirror_key_url",
)
MIRROR_ROLES = ("nvidia_driver", "nvidia_container_toolkit")
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.?)+$|^\[[0-9A-Fa-f:.]+\]$")
_URL_EXAMPLE = {
    "nvidia_driver": "https://mirror.example/cuda/repos",
    "nvidia_container_toolkit": "https://mirror.example/libnvidia-container/stable/deb",
}


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a repository or key URL (None when it can): scheme, host, port, path."""
    if re.search(r"\s", url):
        return "contains white space"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https", "file") or not url.lower().startswith(scheme + "://"):
        return "is not an http(s):// or file:// URL"
    if parts.query or parts.fragment:
        return "must not have a query (?...) or fragment (#...)"
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return "is a file:// URL with a host or credentials (write file:///absolute/path)"
        if not parts.path.startswith("/") or parts.path.strip("/") == "":
            return "is a file:// URL without an absolute path (write file:///absolute/path)"
        return None
    host = parts.netloc.rpartition("@")[2]
    hostname = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
    if not hostname:
        return "has no host name"
    if not _HOST.match(hostname):
        return f"has an invalid host name {hostname!r}"
    try:
        port = parts.port
    except ValueError:
        return "has an invalid port"
    if port == 0:
        return "has an invalid port"
    return None


def _prefix(name: str) -> str:
    return next((r for r in MIRROR_ROLES if name.startswith(r + "_")), "nvidia_driver")


def check_sources(variables: dict[str, Any], where: str = "-e") -> None:
    """Repository/key URLs and mirror credentials, before any host is contacted."""
    for name in (*REPO_URLS, *KEY_URLS):
        value = variables.get(name)
        if value in (None, "") or not isinstance(value, str) or "{{" in value:
            continue
        problem = url_problem(value.strip())
        if problem:
            role = _prefix(name)
            raise BadInput(
                f"{where} {name}: {credentials.mask_url(value.strip())!r} {problem}",
                f"e.g. {_URL_EXAMPLE[role]} or file:///srv/mirror; credentials: "
                f"{role}_mirror_username and {role}_mirror_password_file (docs/air-gapped.md)",
            )
    if str(variables.get("nvidia_container_toolkit_source", "")) == "mirror" and not variables.get(
        "nvidia_container_toolkit_mirror_url"
    ):
        raise BadInput(
            "nvidia_container_toolkit_source=mirror needs nvidia_container_toolkit_mirror_url",
            "add -e nvidia_container_toolkit_mirror_url="
            + _URL_EXAMPLE["nvidia_container_toolkit"],
        )
    for role in MIRROR_ROLES:
        _check_credentials(role, variables, where)


def _check_credentials(role: str, variables: dict[str, Any], where: str) -> None:
    def given(suffix: str) -> str:
        value = variables.get(f"{role}_mirror_{suffix}")
        return "" if value is None or "{{" in str(value) else str(value)

    url = given("url")
    username, password, password_file = given("username"), given("password"), given("password_file")
    hint = (
        f"set {role}_mirror_username with one of {role}_mirror_password_file, "
        f"GPUSTACK_{role.upper()}_MIRROR_PASSWORD or {role}_mirror_password (docs/air-gapped.md)"
    )
    if password and password_file:
        raise BadInput(
            f"{where} {role}_mirror_password and {role}_mirror_password_file are both set",
            "give the mirror password once",
        )
    if password_file:
        path = Path(password_file).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not readable text"
            raise BadInput(
                f"{where} {role}_mirror_password_file {password_file}: {reason}",
                "point it at a readable file on the controller whose first line is the password",
            ) from None
        password = lines[0] if lines else ""
        if not password:
            raise BadInput(
                f"{where} {role}_mirror_password_file {password_file}: the first line is empty",
                "write the password on the file's first line",
            )
    if credentials.has_credentials(url):
        if username or password:
            raise BadInput(
                f"{where} {role}_mirror_url carries credentials and {role}_mirror_username/"
                "_password are set too",
                f"give the credentials once; better without the URL: {hint}",
            )
        userinfo = urlsplit(url).netloc.rpartition("@")[0]
        username, _, password = userinfo.partition(":")
    if not (username or password):
        return
    if url.lower().startswith("file:"):
        raise BadInput(
            f"{where} {role}_mirror_url is a file:// URL: credentials cannot be used there",
            f"leave out the {role}_mirror_* credentials, or serve the mirror over http(s)",
        )
    if not username or not password:
        raise BadInput(
            f"{where} mirror credentials for {role} need a user name and a password",
            hint,
        )
    if re.search(r"\s", username + password):
        raise BadInput(
            f"{where} the {role} mirror user name or password contains white space",
            "apt's auth.conf cannot express it: use credentials without spaces or tabs",
        )
