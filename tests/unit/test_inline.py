"""Tasks ansible-playbook's main process runs itself (gpustack/ansible/inline.py): false conditions
and controller-side actions. What callbacks, registered variables, facts and handlers see is what
they saw when a worker ran them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.release import __version__ as ANSIBLE_VERSION

from gpustack.ansible import inline

pytestmark = pytest.mark.skipif(
    not ANSIBLE_VERSION.startswith(inline.SERIES),
    reason="installed only for the ansible-core series it was written against",
)

# Records every runner result (host, task, kind, result, the task fields callbacks read) and the
# main process's pid; the `pidnote` filter records the pid of the process evaluating it.
CALLBACK = """
import json, os
from ansible.plugins.callback import CallbackBase

class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.rows = []

    def _row(self, kind, result):
        fields = {k: result.task_fields.get(k) for k in ("when", "no_log", "ignore_errors", "delegate_to")}
        self.rows.append(dict(kind=kind, host=result.host.name, task=result.task.get_name(),
                              result=json.loads(json.dumps(dict(result.result), default=str)),
                              fields=json.loads(json.dumps(fields, default=str))))

    def v2_runner_on_start(self, host, task):
        self.rows.append(dict(kind="start", host=host.name, task=task.get_name()))

    def v2_runner_on_ok(self, result):
        self._row("ok", result)

    def v2_runner_on_skipped(self, result):
        self._row("skipped", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._row("failed", result)

    def v2_runner_item_on_ok(self, result):
        self._row("item_ok", result)

    def v2_runner_item_on_skipped(self, result):
        self._row("item_skipped", result)

    def v2_playbook_on_stats(self, stats):
        with open(os.environ["RECORD"], "w") as fh:
            json.dump(dict(pid=os.getpid(), rows=self.rows,
                           stats={h: stats.summarize(h) for h in sorted(stats.processed)}), fh)
"""

FILTER = """
import os

def pidnote(value):
    with open(os.environ["PIDS"], "a") as fh:
        fh.write("%d\\n" % os.getpid())
    return False

class FilterModule:
    def filters(self):
        return {"pidnote": pidnote}
"""

PLAY = """
- hosts: all
  gather_facts: false
  vars:
    flag: false
  tasks:
    - name: plain skip, registered
      ansible.builtin.debug: {msg: x}
      when: flag
      register: plain
    - name: the condition evaluated where
      ansible.builtin.debug: {msg: x}
      when: "'x' | pidnote"
    - name: on one host only
      ansible.builtin.debug: {msg: ran}
      when: inventory_hostname == 'h2'
    - name: a connection variable from the play context
      ansible.builtin.debug: {msg: ran}
      when: ansible_host == '127.0.0.2'
    - name: a block's condition
      when: flag
      block:
        - name: first in block
          ansible.builtin.debug: {msg: x}
        - name: second in block
          ansible.builtin.debug: {msg: y}
          when: true
    - name: a loop's items
      ansible.builtin.debug: {msg: "{{ item }}"}
      loop: [1, 2]
      when: item > 1
    - name: delegated
      ansible.builtin.debug: {msg: x}
      delegate_to: h1
      when: flag
    - name: secret
      ansible.builtin.debug: {msg: x}
      no_log: true
      when: flag
    - name: an include
      ansible.builtin.include_tasks: other.yml
      when: flag
    - name: once
      ansible.builtin.debug: {msg: x}
      run_once: true
      when: flag
    - name: an undefined variable
      ansible.builtin.debug: {msg: x}
      when: nothing_here
      ignore_errors: true
    - name: what was registered
      ansible.builtin.assert:
        that:
          - plain is skipped
          - plain.false_condition == 'flag'
    - name: a fact, from the controller
      ansible.builtin.set_fact:
        noted: "{{ inventory_hostname ~ '-' ~ ('x' | pidnote) }}"
        kept: 1
        cacheable: true
      register: fact_result
    - name: a failing assertion
      ansible.builtin.assert:
        that: [noted == 'nobody']
        fail_msg: not {{ noted }}
      ignore_errors: true
    - name: a fail, per host
      ansible.builtin.fail:
        msg: failing on {{ inventory_hostname }}
      when: inventory_hostname == 'h1'
      ignore_errors: true
    - name: debug a variable
      ansible.builtin.debug:
        var: fact_result
    - name: a hidden debug
      ansible.builtin.debug:
        msg: "{{ noted }}"
      no_log: true
    - name: variables from a file
      ansible.builtin.include_vars:
        file: extra.yml
    - name: an include that runs
      ansible.builtin.include_tasks: other.yml
      when: from_file == 'yes'
    - name: a role with an argument spec
      ansible.builtin.include_role:
        name: specced
      vars:
        specced_size: 3
    - name: a block whose keyword depends on the host
      no_log: "{{ inventory_hostname == 'h1' }}"
      block:
        - name: hidden on h1 only
          ansible.builtin.debug:
            msg: shown on {{ inventory_hostname }}
    - name: changed on demand
      ansible.builtin.debug:
        msg: "{{ kept + specced_doubled | int }}"
      changed_when: true
      notify: a handler that runs
    - name: notify
      ansible.builtin.command: "true"
      changed_when: true
      notify: a handler
  handlers:
    - name: a handler
      ansible.builtin.debug: {msg: handler}
      when: flag
    - name: a handler that runs
      ansible.builtin.set_fact:
        handled: true
"""


def _run(tmp_path: Path, name: str, launcher: list[str]) -> dict:
    (tmp_path / "callback").mkdir(exist_ok=True)
    (tmp_path / "callback" / "record.py").write_text(CALLBACK)
    (tmp_path / "filter").mkdir(exist_ok=True)
    (tmp_path / "filter" / "pidnote.py").write_text(FILTER)
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "other.yml").write_text("- ansible.builtin.debug: {msg: included}\n")
    (tmp_path / "extra.yml").write_text("from_file: 'yes'\n")
    role = tmp_path / "roles" / "specced"
    (role / "meta").mkdir(parents=True, exist_ok=True)
    (role / "tasks").mkdir(exist_ok=True)
    (role / "meta" / "argument_specs.yml").write_text(
        "argument_specs:\n  main:\n    options:\n      specced_size: {type: int, required: true}\n"
    )
    (role / "tasks" / "main.yml").write_text(
        "- ansible.builtin.set_fact:\n    specced_doubled: '{{ specced_size * 2 }}'\n"
    )
    (tmp_path / "inv.ini").write_text(
        f"h1 ansible_connection=local ansible_python_interpreter={sys.executable}\n"
        f"h2 ansible_connection=local ansible_host=127.0.0.2"
        f" ansible_python_interpreter={sys.executable}\n"
    )
    record, pids = tmp_path / f"{name}.json", tmp_path / f"{name}.pids"
    env = {
        **os.environ,
        "RECORD": str(record),
        "PIDS": str(pids),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(tmp_path / "callback"),
        "ANSIBLE_CALLBACKS_ENABLED": "record",
        "ANSIBLE_FILTER_PLUGINS": str(tmp_path / "filter"),
    }
    done = subprocess.run([*launcher, "-i", str(tmp_path / "inv.ini"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(record.read_text())
    data["pids"] = [int(p) for p in pids.read_text().split()]
    data["stdout"] = done.stdout
    return data


def _comparable(rows: list[dict]) -> list[dict]:
    """The rows in a stable order (the hosts' results arrive in either order), times left out."""
    for row in rows:
        for key in ("start", "end", "delta"):
            row.get("result", {}).pop(key, None)
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def test_callbacks_see_the_same_results_and_the_main_process_ran_them(tmp_path):
    plain = _run(tmp_path, "plain", [sys.executable, "-m", "ansible.cli.playbook"])
    ours = _run(tmp_path, "ours", [sys.executable, "-m", "gpustack.ansible.launch"])

    assert _comparable(ours["rows"]) == _comparable(plain["rows"])
    assert ours["stats"] == plain["stats"]
    kinds = {(r["host"], r["task"]): r["kind"] for r in plain["rows"] if r["kind"] != "start"}
    expected = {
        ("h1", "plain skip, registered"): "skipped",
        ("h2", "on one host only"): "ok",
        ("h1", "on one host only"): "skipped",
        ("h2", "a connection variable from the play context"): "ok",
        ("h1", "an undefined variable"): "failed",
        ("h1", "what was registered"): "ok",
        ("h1", "an include"): "skipped",
        ("h1", "a failing assertion"): "failed",
        ("h1", "a fail, per host"): "failed",
        ("h2", "a fail, per host"): "skipped",
        ("h1", "a handler that runs"): "ok",
        ("h1", "a handler"): "skipped",
        ("h1", "second in block"): "skipped",
    }
    assert {key: kinds.get(key) for key in expected} == expected
    assert '"msg": "handler"' not in plain["stdout"]
    assert plain["stdout"].count('"msg": "included"') == 2  # the include that runs, on each host
    assert plain["stdout"].count('"msg": 7') == 2  # kept + specced_doubled, through the role
    for task in ("secret", "a hidden debug"):
        rows = [r for r in ours["rows"] if r["task"] == task and r["kind"] != "start"]
        assert len(rows) == 2 and all(r["result"].get("_ansible_no_log") for r in rows)
    hidden = {r["host"]: r["result"].get("_ansible_no_log") for r in ours["rows"]
              if r["task"] == "hidden on h1 only" and "result" in r}  # fmt: skip
    assert hidden == {"h1": True, "h2": False}  # per host, as each worker templated it
    facts = [
        r["result"]
        for r in ours["rows"]
        if r["task"] == "a fact, from the controller" and "result" in r
    ]
    assert {f["ansible_facts"]["noted"] for f in facts if "ansible_facts" in f} == {
        "h1-False",
        "h2-False",
    }

    # Without the hook each host's worker evaluated the filter (a condition, a set_fact); with it,
    # the main process.
    assert len(plain["pids"]) == 4 and plain["pid"] not in plain["pids"]
    assert ours["pids"] == [ours["pid"]] * 4


def test_not_installed_outside_its_ansible_series(monkeypatch):
    import ansible.release
    from ansible.plugins.strategy import StrategyBase

    before = StrategyBase._queue_task
    monkeypatch.setattr(ansible.release, "__version__", "2.99.0")
    assert inline.install() is False
    assert StrategyBase._queue_task is before
