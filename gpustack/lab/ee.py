"""The execution environment's base image, made here: Debian's archive is reachable, container
registries are not. A debootstrapped Debian 12 root with Python and pip, imported into podman's
store once and kept there (docs/collection.md, "Execution environment").

    python -m gpustack.lab.ee base      # prints the image, building it first if needed
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from gpustack.errors import GpustackError
from gpustack.lab.images import (
    OS_SPECS,
    apt_cache_dir,
    apt_sources,
    cache_lock,
    import_rootfs,
    mirror_url,
)
from gpustack.lab.nodes import ULIMITS
from gpustack.lab.podman import LABEL, oci_runtime, run

BASE_SPEC = OS_SPECS["debian12"]
# Debian's python3 refuses `ensurepip` (ansible-builder's way to install pip; its definition
# skips that, options.skip_pip_install): the base brings Debian's pip. The EE's own system
# packages (openssh-client) come from ee/bindep.txt.
BASE_PACKAGES = ["python3", "python3-pip", "ca-certificates"]
BASE_REPOSITORY = "localhost/gpustack-ee-base"
# Certificate authorities this machine adds to Debian's (a TLS-intercepting proxy's, say): pip
# in the image's build stages must trust what pip here trusts.
LOCAL_CAS = Path("/usr/local/share/ca-certificates")


def local_cas() -> dict[str, str]:
    found = sorted(LOCAL_CAS.glob("**/*.crt")) if LOCAL_CAS.is_dir() else []
    return {str(path.relative_to(LOCAL_CAS)): path.read_text() for path in found}


def base_script() -> str:
    """Shell run inside the debootstrapped root: Debian's sources with updates and security;
    this machine's local CAs (copied in before) trusted."""
    return f"""set -e
rm -f /etc/apt/sources.list
cat > /etc/apt/sources.list.d/debian.sources <<'EOS'
{apt_sources(BASE_SPEC)}EOS
update-ca-certificates
apt-get clean
rm -rf /var/lib/apt/lists/*
"""


def engine_options() -> list[str]:
    """What podman needs on this machine for the image's build steps and its containers, as lab
    nodes do: the OCI runtime the cgroup layout asks for, and rlimits it can set."""
    runtime = oci_runtime()
    return [*(["--runtime", runtime] if runtime else []), *ULIMITS]


def base_recipe_hash() -> str:
    text = json.dumps([BASE_SPEC.suite, BASE_PACKAGES, mirror_url(), base_script(), local_cas()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def base_image_name() -> str:
    return f"{BASE_REPOSITORY}:{BASE_SPEC.suite}-{base_recipe_hash()}"


def ensure_base_image(log=print) -> str:
    """Build the base image once; later calls find it in podman's store. It is also tagged
    BASE_REPOSITORY:bookworm, the base execution-environment.yml names by default."""
    image = base_image_name()
    with cache_lock("ee-base"):
        if run(["podman", "image", "exists", image], check=False).returncode != 0:
            _build_base(image, log)
        run(["podman", "tag", image, f"{BASE_REPOSITORY}:{BASE_SPEC.suite}"])
        _remove_stale_images(image)
    return image


def _build_base(image: str, log) -> None:
    log(f"Building the execution environment's base image {image} with debootstrap…")
    with tempfile.TemporaryDirectory(
        prefix="gpustack-ee-base-", dir=os.environ.get("GPUSTACK_LAB_BUILD_DIR")
    ) as tmp:
        root = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
             f"--cache-dir={apt_cache_dir()}", BASE_SPEC.suite, str(root), mirror_url()],
            timeout=1800)  # fmt: skip
        for name, text in local_cas().items():
            target = root / "usr/local/share/ca-certificates" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        run(["chroot", str(root), "/bin/sh", "-c", base_script()])
        label = f"LABEL {LABEL}.recipe={base_recipe_hash()}"
        import_rootfs(root, image, ["CMD=/bin/bash", label])


def _remove_stale_images(keep: str) -> None:
    """Base images of an older recipe are dead weight: drop them (if unused)."""
    listed = run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", BASE_REPOSITORY],
                 check=False)  # fmt: skip
    prefix = f"{BASE_REPOSITORY}:{BASE_SPEC.suite}-"
    for ref in listed.stdout.decode().split():
        if ref.startswith(prefix) and ref != keep:
            run(["podman", "rmi", ref], check=False)


def main(argv: list[str]) -> int:
    if argv != ["base"]:
        print("usage: python -m gpustack.lab.ee base", file=sys.stderr)
        return 2
    try:
        print(ensure_base_image(log=lambda line: print(line, file=sys.stderr)))
    except GpustackError as exc:
        print(f"Error: {exc.message}\nHint: {exc.hint}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
