"""Typed checks of the role inputs a user passes with -e, before any host is contacted."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

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

    @field_validator("nvidia_driver_mirror_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> str:
        text = str(value).strip()
        if text and not re.match(r"^(https?|file)://", text):
            raise ValueError(f"{text!r} is not an http(s):// or file:// URL")
        return text


def check_extra_vars(extravars: dict[str, Any], where: str = "-e") -> None:
    """Raise BadInput for the first invalid gpustack input among the extra vars (or `where`)."""
    for name in ("gpustack_require_gpu", "nvidia_driver_open_kernel_modules"):
        if name in extravars and str(extravars[name]).lower() not in _BOOL:
            raise BadInput(f"{where} {name}={extravars[name]}: not a boolean", "use true or false")
    try:
        inputs = DriverInputs.model_validate(extravars)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = err["loc"][0]
        message = err["msg"].removeprefix("Value error, ")
        raise BadInput(
            f"{where} {name}: {message}", _HINTS.get(str(name), "see docs/variables.md")
        ) from None
    if inputs.nvidia_driver_source == "mirror" and not inputs.nvidia_driver_mirror_url:
        raise BadInput(
            "nvidia_driver_source=mirror needs nvidia_driver_mirror_url",
            "add -e nvidia_driver_mirror_url=https://mirror.example/cuda/repos",
        )
    if (
        inputs.nvidia_driver_version
        and inputs.nvidia_driver_branch
        and not re.sub(r"^[0-9]+:", "", inputs.nvidia_driver_version).startswith(
            inputs.nvidia_driver_branch + "."
        )
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
    "nvidia_driver_mirror_url": "e.g. https://mirror.example/cuda/repos",
}
