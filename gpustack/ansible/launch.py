"""ansible-playbook as gpustack runs it: what every run did again, done once.

runner.py starts this under childguard.py instead of the `ansible-playbook` script. Before
ansible-core's own CLI runs, in this process (inherited by every worker it forks):

* payloads.py: the AnsiballZ payloads of gpustack's modules kept between runs, with bytecode;
* jinja_cache.py: compiled templates kept between workers and runs (ansible-core 2.19);
* preload.py: the plugins each worker loaded again, loaded once per play before they fork;
* inline.py: a false condition, and a task that never leaves the controller, run in this
  process instead of a forked worker.

Each is best effort: where this ansible-core lacks what it wraps, Ansible runs as it is.

Usage (by runner.py only): python -m gpustack.ansible.launch ARGS...  (ansible-playbook's)
"""

from __future__ import annotations

import sys

from gpustack import paths
from gpustack.ansible import inline, jinja_cache, payloads, preload


def main(argv: list[str]) -> int:
    payloads.install(paths.content_root())
    jinja_cache.install()
    preload.install()
    inline.install()
    from ansible.cli.playbook import main as playbook_main

    sys.argv = ["ansible-playbook", *argv]
    playbook_main()  # exits with ansible-playbook's code
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
