"""The static gate: what env.py may contain, checked before anything runs.

Two parts, each finding with its line:
1. RestrictedPython's compile (``language.compile_env``, the kept library):
   no names or attributes starting with ``__``, no frame/code/traceback
   attributes from its list, no ``match`` statements (class patterns read
   attributes by keyword), no dunder method definitions beyond ``__init__`` and
   comparisons, no ``async``, no ``metaclass=``. Its findings say "RestrictedPython".
2. What RestrictedPython does not cover, kept from the first gate:
   - imports only from the allowlist, absolute, no ``*``, no private names
     (RestrictedPython compiles any import; the worker's importer refuses later);
   - no string constant that spells a dunder (``"__class__"`` for format-string
     and runtime-name tricks; RestrictedPython does not look at strings);
   - no private attribute (``x._y``) except on ``self`` and ``cls`` (env code may
     use single-underscore names; the runtime guard checks ownership too);
   - no attribute with a frame, code, traceback, generator or coroutine prefix
     (``gi_``, ``f_``, ``tb_``, ``co_``...), nor ``mro`` or ``format_map``
     (RestrictedPython names a fixed list);
   - no ``exec``, ``eval``, ``compile``, ``open``, ``getattr``, ``setattr``,
     ``delattr``, ``globals``, ``locals``, ``vars``... by name (RestrictedPython
     leaves builtins to the runtime; an early, line-numbered refusal is clearer);
   - a size limit.

The gate is the first of three layers (then the language layer's guards and
module proxies in the worker, then the OS jail), so it may be strict: a
legitimate env never needs any of this.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from trace_gym.errors import TraceGymError

ALLOWED_IMPORTS = frozenset(
    {"random", "math", "json", "re", "datetime", "dataclasses", "collections", "collections.abc",
     "itertools", "functools", "string", "typing", "enum", "copy"}
)
FORBIDDEN_NAMES = frozenset(
    {"exec", "eval", "compile", "open", "getattr", "setattr", "delattr", "__import__", "globals", "locals",
     "vars", "breakpoint", "input", "help", "memoryview", "exit", "quit", "__builtins__", "__loader__",
     "__spec__"}
)
INTROSPECTION_PREFIXES = ("gi_", "ag_", "cr_", "f_", "tb_", "co_", "func_", "im_")
INTROSPECTION_NAMES = frozenset({"mro", "format_map"})
MAX_SOURCE_BYTES = 256 * 1024
_DUNDER = re.compile(r"__\w+__")


@dataclass(frozen=True)
class Finding:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class SandboxViolation(TraceGymError):
    """env.py broke a rule of the static gate; nothing was run."""

    def __init__(self, findings: list[Finding], filename: str = "env.py"):
        self.findings = findings
        listed = "; ".join(str(f) for f in findings[:10])
        more = f" (and {len(findings) - 10} more)" if len(findings) > 10 else ""
        super().__init__(f"{filename} refused by the static gate: {listed}{more}")


def check_source(source: str, filename: str = "env.py") -> list[Finding]:
    """Every rule broken by ``source``; empty if it may run."""
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        return [Finding(1, f"source is larger than {MAX_SOURCE_BYTES // 1024} KiB")]
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        return [Finding(exc.lineno or 1, f"syntax error: {exc.msg}")]
    findings: list[Finding] = []
    for node in ast.walk(tree):
        findings.extend(_check_node(node))
    findings.extend(_restricted_python_findings(source, filename))
    return sorted(set(findings), key=lambda f: (f.line, f.message))


_RP_LINE = re.compile(r"^Line (\d+): (.*)$", re.S)


def _restricted_python_findings(source: str, filename: str) -> list[Finding]:
    from .language import compile_env

    _, errors = compile_env(source, filename)
    out = []
    for error in errors:
        match = _RP_LINE.match(error)
        line, message = (int(match.group(1)), match.group(2)) if match else (1, error)
        out.append(Finding(line, f"RestrictedPython: {message}"))
    return out


def enforce(source: str, filename: str = "env.py") -> None:
    findings = check_source(source, filename)
    if findings:
        raise SandboxViolation(findings, filename)


def _check_node(node: ast.AST) -> list[Finding]:
    line = getattr(node, "lineno", 1)
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                out.append(Finding(line, f"import of '{alias.name}' is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})"))
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level:
            out.append(Finding(line, "relative imports are not allowed"))
        elif module not in ALLOWED_IMPORTS:
            out.append(Finding(line, f"import from '{module}' is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})"))
        for alias in node.names:
            if alias.name == "*":
                out.append(Finding(line, f"'from {module} import *' is not allowed"))
            elif alias.name.startswith("_"):
                out.append(Finding(line, f"importing private name '{alias.name}' is not allowed"))
    elif isinstance(node, ast.Name):
        if node.id in FORBIDDEN_NAMES:
            out.append(Finding(line, f"'{node.id}' is not allowed"))
    elif isinstance(node, ast.Attribute):
        out.extend(_check_attribute(node, line))
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        if _DUNDER.search(node.value):
            out.append(Finding(line, "a string that spells a dunder name is not allowed"))
    return out


def _check_attribute(node: ast.Attribute, line: int) -> list[Finding]:
    attr = node.attr
    if attr.startswith("__"):
        return []  # RestrictedPython's
    if attr.startswith(INTROSPECTION_PREFIXES) or attr in INTROSPECTION_NAMES:
        return [Finding(line, f"introspection attribute '.{attr}' is not allowed")]
    if attr.startswith("_"):
        base = node.value
        if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
            return [Finding(line, f"private attribute '.{attr}' is only allowed on self")]
    return []
