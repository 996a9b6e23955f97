"""Compiled Jinja templates kept between ansible-playbook's workers and runs.

ansible-core 2.19 compiles every template and conditional it evaluates, each time: Jinja's parse,
code generation and Python's `compile` (`_internal/_templating/_engine.py`: `_compile_template`
and `_compile_expression` call the environment's `from_string` and `compile_expression`), in the
worker process forked for each task and host, so nothing compiled is ever reused. A first
install of 2 lab nodes compiled about 1,500 templates, about 2 s of the controller's CPU (about
10 ms per task and host; docs/performance.md).

Installed by launch.py in the ansible-playbook process before its workers fork: compiled code
of a template is looked up by everything its compilation depends on (the source text, whether
Ansible's lexer escapes backslashes in it, the environment's override fields such as the
delimiters, the environment's class, extensions, optimizer, autoescape, finalize and async
setting, and the versions of Jinja, ansible-core and Python in the directory's name); a miss
compiles as before and appends the code (marshal) to a spool file of the worker; the next
ansible-playbook loads every spool file before it forks. Only where the template's compilation is
a single plain one (no debugging of template sources, no template class of the caller's, one
code object made); anything else is compiled as before.

Only for the ansible-core series whose internals this was written against (SERIES): elsewhere
nothing is installed and Ansible compiles as it does.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
from functools import partial
from pathlib import Path

from gpustack.ansible import payloads

SERIES = ("2.19.",)
COMPACT_AT = 16  # spool files merged into one at the next start beyond this many
MAX_BYTES = 32 * 2**20  # beyond this (templates of many gpustack versions): start afresh


def _load(directory: Path) -> dict:
    """Every entry of every spool file; several files merged into one (atomically) where many;
    none where they grew beyond MAX_BYTES (the key does not change with gpustack's version, so
    templates of earlier roles stay until then)."""
    cache: dict = {}
    files = sorted(directory.glob("*.m"))
    with contextlib.suppress(OSError):
        if sum(path.stat().st_size for path in files) > MAX_BYTES:
            for path in files:
                path.unlink(missing_ok=True)
            return cache
    for path in files:
        with contextlib.suppress(OSError), path.open("rb") as fh:
            while True:
                try:
                    key, blob = marshal.load(fh)
                except (EOFError, ValueError, TypeError):
                    break  # end of file, or the tail of a record a killed worker left
                cache[key] = blob
    if len(files) > COMPACT_AT:
        with contextlib.suppress(OSError):
            merged = directory / f"merged-{os.getpid()}-{os.urandom(4).hex()}.m"
            part = merged.with_suffix(".part")
            with part.open("wb") as fh:
                for item in cache.items():
                    fh.write(marshal.dumps(item))
            os.replace(part, merged)
            for path in files:
                path.unlink(missing_ok=True)
    return cache


def install(root: Path | None = None) -> Path | None:
    """Wrap the environment's compile steps; the cache directory, or None (not installed)."""
    try:
        import jinja2
        from ansible._internal._templating import _jinja_bits as bits
        from ansible.release import __version__ as ansible_version
        from jinja2.environment import TemplateExpression
    except ImportError:
        return None
    environment = getattr(bits, "AnsibleEnvironment", None)
    context = getattr(bits, "_TemplateCompileContext", None)
    fields = getattr(bits, "_TEMPLATE_OVERRIDE_FIELD_NAMES", None)
    if not ansible_version.startswith(SERIES) or None in (environment, context, fields):
        return None
    versions = f"{jinja2.__version__}|{ansible_version}|{sys.version}".encode()
    directory = (root or payloads.cache_root("jinja")) / hashlib.sha256(versions).hexdigest()[:24]
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    payloads.prune(directory.parent, directory)
    cache = _load(directory)
    spool: dict = {"pid": None, "file": None}
    made: list = []  # code objects compiled by the call in progress (this process)

    def keep(key, code) -> None:
        blob = marshal.dumps(code)
        cache[key] = blob
        with contextlib.suppress(OSError, ValueError):
            if spool["pid"] != os.getpid():  # a forked worker: a file of its own
                spool["pid"] = os.getpid()
                path = directory / f"{os.getpid()}-{os.urandom(4).hex()}.m"
                spool["file"] = path.open("ab", buffering=0)
            spool["file"].write(marshal.dumps((key, blob)))

    def key_of(env, kind: str, source: str) -> tuple:
        current = context.current(optional=True)
        escape = bool(current and current.escape_backslashes)
        overrides = tuple(repr(getattr(env, field)) for field in fields)
        # what else Jinja's parser and code generator read from the environment
        shape = (type(env).__qualname__, tuple(sorted(env.extensions)), env.optimized,
                 repr(env.autoescape), getattr(env.finalize, "__qualname__", repr(env.finalize)),
                 env.is_async)  # fmt: skip
        return (kind, escape, overrides, shape, str(source))

    original_compile = environment._compile
    original_from_string = environment.from_string
    original_expression = environment.compile_expression

    def _compile(self, source, filename):
        code = original_compile(self, source, filename)
        made.append(code)
        return code

    def compiled(self, kind, source, build, undefined_to_none=None):
        """The compiled template (an expression's: wrapped as Jinja's compile_expression does)."""
        key = key_of(self, kind, source)
        blob = cache.get(key)
        if blob is None:
            made.clear()
            result = build()
            if len(made) == 1:
                keep(key, made[0])
            made.clear()
            return result
        code = marshal.loads(blob)
        template = self.template_class.from_code(self, code, self.make_globals(None), None)
        if undefined_to_none is None:
            return template
        return TemplateExpression(template, undefined_to_none)

    def plain(self, source) -> bool:
        return isinstance(source, str) and not self._debuggable_template_source

    def from_string(self, source, globals=None, template_class=None):
        if globals or template_class or not plain(self, source):
            return original_from_string(self, source, globals, template_class)
        return compiled(self, "template", source, partial(original_from_string, self, source))

    def compile_expression(self, source, undefined_to_none=True):
        if not plain(self, source):
            return original_expression(self, source, undefined_to_none)
        build = partial(original_expression, self, source, undefined_to_none)
        return compiled(self, "expression", source, build, undefined_to_none)

    environment._compile = _compile
    environment.from_string = from_string
    environment.compile_expression = compile_expression
    return directory
