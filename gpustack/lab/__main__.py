"""`python3 -m gpustack.lab`: chroot nodes on a host where gpustack's dependencies are not
installed (a GPU host without network), with the host's Python and this checkout alone:

    PYTHONPATH=CHECKOUT python3 -m gpustack.lab up --name N --rootfs node.tar.xz [--bind S:D[:ro]]
    PYTHONPATH=CHECKOUT python3 -m gpustack.lab down --name N

The lab package uses the standard library only; `gpustack lab up --boot chroot` is the same code.
"""

from __future__ import annotations

import argparse
import sys

from gpustack.errors import GpustackError
from gpustack.lab import nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m gpustack.lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="boot (or reuse) the chroot node; write its inventory")
    up.add_argument("--name", default="lab")
    up.add_argument("--os", default="debian12")
    up.add_argument("--rootfs", help="a directory or a .tar.xz (default: built with debootstrap)")
    up.add_argument("--bind", action="append", default=[], help="SRC:DEST[:ro|rw]; repeatable")
    up.add_argument("--inventory")
    down = commands.add_parser("down", help="stop the chroot node and remove it")
    down.add_argument("--name", default="lab")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            path = nodes.up(args.name, 1, args.os, args.inventory, boot="chroot",
                            rootfs_source=args.rootfs, binds=args.bind)  # fmt: skip
            print(f"Lab {args.name}: 1 node(s) up. Inventory: {path}")
        else:
            nodes.down(args.name)
            print(f"Lab {args.name} removed.")
    except GpustackError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"Hint: {exc.hint}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
