"""Tasks ansible-playbook's main process runs itself instead of forking a worker for them.

ansible-playbook forks a worker process for every task and host; the worker evaluates the task's
`when` and runs its action. For a task that never leaves the controller the fork is most of the
cost: about 3,000 page faults and 6 ms of system time per host on the lab machine, shared by the
worker and the main process (whose pages the worker shares), where a false condition takes well
under a millisecond and a `set_fact` about 3 ms (docs/performance.md, "twenty-first session").

Installed by launch.py, the strategy's `_queue_task` keeps two kinds of task in the main process:

* **a false condition**: what the worker would do up to the condition (TaskExecutor.run and
  _execute_internal: the task squashed, the search path, the play context's connection
  variables, the condition in a deferred-warning context), on a copy of the task; where it is
  false, the worker's skip result (its `false_condition`, `_ansible_no_log`);
* **a controller-side action** (CONTROLLER_ACTIONS: `set_fact`, `assert`, `debug`, `fail`,
  `validate_argument_spec`, `include_vars`, and the `include_tasks`/`include_role` a worker only
  answers with their arguments): the worker's own TaskExecutor, run here on a copy of the task and
  of its variables. These actions never open the connection (ansible-core's
  `_requires_connection = False`); TaskExecutor still builds its connection object, unopened.

Either way the result goes onto the results queue the worker would have used, after the same
`v2_runner_on_start` callback: registering, facts, callbacks, handlers and stats see what they saw
before. A worker still runs every task with a loop, `delegate_to`, `until`/`retries`, `async` or a
timeout, a condition that raised or warned (before a controller-side action: that action, here),
and every other action. The main process's own time per host is less than with a worker (the
fork and its page faults: 4.0 ms of its CPU per `set_fact` and host with workers, 2.9 ms without),
so a large fleet's plays are not slowed where the main process is the bottleneck.

Only for the ansible-core series whose internals this was written against (SERIES).
"""

from __future__ import annotations

from typing import Any

SERIES = ("2.19.",)
SKIP_REASON = "Conditional result was False"  # TaskExecutor's words
# ansible.builtin actions with `_requires_connection = False` and no prompt, resolved when the task
# was parsed (a local action plugin of the same short name resolves to another name).
CONTROLLER_ACTIONS = frozenset(
    f"ansible.builtin.{name}"
    for name in ("set_fact", "assert", "debug", "fail", "validate_argument_spec", "include_vars")
)


def install() -> bool:
    """Wrap StrategyBase._queue_task; False where this ansible-core is another series."""
    try:
        from ansible import constants
        from ansible.executor.task_result import _RawTaskResult
        from ansible.plugins import loader as plugin_loader
        from ansible.plugins.strategy import StrategyBase
        from ansible.release import __version__
    except ImportError:
        return False
    if not __version__.startswith(SERIES) or not hasattr(StrategyBase, "_queue_task"):
        return False
    original = StrategyBase._queue_task
    if getattr(original, "gpustack_inline", False):
        return True
    includes = frozenset(constants._ACTION_INCLUDE_TASKS + constants._ACTION_INCLUDE_ROLE)

    def _queue_task(self, host, task, task_vars, play_context):
        if task.loop is not None or task.loop_with or task.delegate_to:
            return original(self, host, task, task_vars, play_context)
        done = skip(self._loader, host, task, task_vars, play_context) if task.when else None
        executor = None
        if done is None and controller_side(task, includes):
            try:
                executor = prepare(self, host, task, task_vars, play_context, plugin_loader)
            except Exception:  # a worker meets it the same way, in its own process
                executor = None
        if done is None and executor is None:
            return original(self, host, task, task_vars, play_context)
        # What _queue_task and the worker do around TaskExecutor, minus the fork.
        self._queued_task_cache[(host.name, task._uuid)] = {
            "host": host,
            "task": task,
            "task_vars": task_vars,
            "play_context": play_context,
        }
        self._tqm.send_callback("v2_runner_on_start", host, task)
        if executor is not None:
            done = run(executor)
        squashed, result = done
        self._final_q.send_task_result(
            _RawTaskResult(
                host=host, task=squashed, return_data=result, task_fields=squashed.dump_attrs()
            )
        )
        self._pending_results += 1

    _queue_task.gpustack_inline = True
    StrategyBase._queue_task = _queue_task
    return True


def _copy(task):
    """The task alone, its parents read through (as the worker's squash reads them), not copied:
    a copy with its parent block would copy every sibling task too (the condition changes none of
    them)."""
    copied = task.copy(exclude_parent=True, exclude_tasks=True)
    copied._parent = task._parent
    return copied


def controller_side(task, includes: frozenset[str]) -> bool:
    """A task whose action runs on the controller alone, without timers or retries."""
    if task.until or task.retries or task.async_val or task.timeout:
        return False
    return task.action in includes or task._resolved_action in CONTROLLER_ACTIONS


def prepare(strategy, host, task, task_vars: dict, play_context, plugin_loader):
    """The worker's TaskExecutor, for this process. It post-validates the task's parent blocks and
    includes and sets fields of its play context: it gets copies of those (not of the sibling
    tasks), and of the variables it adds to."""
    from ansible.executor.task_executor import TaskExecutor

    return TaskExecutor(
        host,
        task.copy(exclude_tasks=True),
        dict(task_vars),
        play_context.copy(),
        strategy._loader,
        plugin_loader.get_plugin_loader_namespace(),
        strategy._final_q,
        strategy._variable_manager,
    )


def run(executor) -> tuple[Any, dict]:
    """(the task it squashed, its result), as the worker runs it (TaskExecutor.run turns an
    exception into a failed result)."""
    from ansible._internal import _task

    with _task.TaskContext(executor._task):
        return executor._task, executor.run()


def skip(loader, host, task, task_vars: dict, play_context) -> tuple[Any, dict] | None:
    """(the squashed task, the worker's skip result) where `task` is skipped on `host`; None
    where its condition holds, raised or warned."""
    from ansible._internal import _display_utils, _task
    from ansible._internal._templating._engine import TemplateEngine

    try:
        squashed = _copy(task)
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
