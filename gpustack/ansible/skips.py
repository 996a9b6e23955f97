"""Tasks whose `when` is false skipped in ansible-playbook's main process, without a worker.

ansible-playbook forks a worker process for every task and host, and the worker is where the
task's `when` is evaluated (TaskExecutor): a skipped task costs a fork like any other. On the
controller that fork is most of a skip's cost: about 3,000 page faults and 6 ms of system time
per host on the lab machine, where evaluating the condition takes well under a millisecond
(docs/performance.md, "twenty-first session"). A first install of 2 hosts skips about 90 tasks
per host, a converged `install --full` more.

Installed by launch.py: the strategy's `_queue_task` first does in the main process what the
worker would do up to the condition (TaskExecutor.run and _execute_internal: the task squashed,
the search path, the play context's overrides, the condition in a deferred-warning context), on
a copy of the task. Where the condition is false, the worker's very result (a skip, its
`false_condition`, `_ansible_no_log`) goes onto the results queue the worker would have used,
after the same `v2_runner_on_start` callback: registering, callbacks, handlers and stats see
what they saw before. Everything else goes to a worker as before: a task with a loop (each
item's condition), a delegated task, a condition that raised or warned, a play context that
failed, and every task whose condition is true.

Only for the ansible-core series whose internals this was written against (SERIES).
"""

from __future__ import annotations

from typing import Any

SERIES = ("2.19.",)
SKIP_REASON = "Conditional result was False"  # TaskExecutor's words


def install() -> bool:
    """Wrap StrategyBase._queue_task; False where this ansible-core is another series."""
    try:
        from ansible.executor.task_result import _RawTaskResult
        from ansible.plugins.strategy import StrategyBase
        from ansible.release import __version__
    except ImportError:
        return False
    if not __version__.startswith(SERIES) or not hasattr(StrategyBase, "_queue_task"):
        return False
    original = StrategyBase._queue_task
    if getattr(original, "gpustack_skips", False):
        return True

    def _queue_task(self, host, task, task_vars, play_context):
        skipped = skip(self._loader, host, task, task_vars, play_context)
        if skipped is None:
            return original(self, host, task, task_vars, play_context)
        squashed, result = skipped
        # What _queue_task and the worker do around TaskExecutor, minus the fork.
        self._queued_task_cache[(host.name, task._uuid)] = {
            "host": host,
            "task": task,
            "task_vars": task_vars,
            "play_context": play_context,
        }
        self._tqm.send_callback("v2_runner_on_start", host, task)
        self._final_q.send_task_result(
            _RawTaskResult(
                host=host, task=squashed, return_data=result, task_fields=squashed.dump_attrs()
            )
        )
        self._pending_results += 1

    _queue_task.gpustack_skips = True
    StrategyBase._queue_task = _queue_task
    return True


def skip(loader, host, task, task_vars: dict, play_context) -> tuple[Any, dict] | None:
    """(the squashed task, the worker's skip result) where `task` is skipped on `host`; None
    where a worker must run it (or decide)."""
    if not task.when or task.loop is not None or task.loop_with or task.delegate_to:
        return None
    from ansible._internal import _display_utils, _task
    from ansible._internal._templating._engine import TemplateEngine

    try:
        squashed = task.copy(exclude_parent=True, exclude_tasks=True)
        squashed._parent = task._parent  # read through, as the worker's squash does; not copied
        squashed.squash()
        squashed.delegate_to = None  # as _calculate_delegate_to leaves an undelegated task
        with _task.TaskContext(squashed):
            job_vars = dict(task_vars)
            search_path = squashed.get_search_path()
            if loader.get_basedir() not in search_path:
                search_path.append(loader.get_basedir())
            job_vars["ansible_search_path"] = search_path
            templar = TemplateEngine(loader=loader, variables=job_vars)
            with _display_utils.DeferredWarningContext(variables=job_vars) as warnings:
                tempvars = job_vars.copy()
                context = play_context.set_task_and_variable_override(
                    task=squashed, variables=job_vars, templar=templar
                )
                context.post_validate(templar=templar)
                if not context.remote_addr:
                    context.remote_addr = host.address
                context.update_vars(tempvars)
                condition: dict[str, Any] = {}
                if squashed._resolve_conditional(squashed.when, tempvars, result_context=condition):
                    return None
                result = dict(changed=False, skipped=True, skip_reason=SKIP_REASON) | condition
                squashed.update_result_no_log(templar, result)
            if warnings.get_warnings() or warnings.get_deprecation_warnings():
                return None  # the worker says them with its result
    except Exception:  # the worker raises it, or saves it for a condition that holds
        return None
    return squashed, result
