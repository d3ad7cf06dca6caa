"""The static gate: what env.py may contain, checked before anything runs.

Two parts, each finding with its line:
1. RestrictedPython's compile (``compile_env``, the kept library; the code it
   produces is what the worker runs, shipped to it marshalled, so env code is
   compiled once, here, and only ever run with the language layer's guards):
   no names or attributes starting with ``__``, no frame/code/traceback
   attributes from its list, no ``match`` statements (class patterns read
   attributes by keyword), no dunder method definitions beyond ``__init__`` and
   comparisons, no ``async``, no ``metaclass=``. Its findings say "RestrictedPython".
2. What RestrictedPython does not cover, kept from the first gate:
   - the standard library by allowlist (``language.MODULES``, the one policy the
     module proxies enforce at run time): imports, ``from m import name`` and
     ``m.name`` of a module bound by ``import m``, absolute, no ``*``
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
import copy
import functools
import re
from dataclasses import dataclass

from RestrictedPython.transformer import IOPERATOR_TO_STR, RestrictingNodeTransformer, copy_locations

from trace_gym.errors import TraceGymError

from .language import INTROSPECTION_NAMES, INTROSPECTION_PREFIXES, MODULES, PRIVATE_NAME, RESERVED_NAMES

ALLOWED_IMPORTS = frozenset(MODULES)  # the language layer's allowlist: one policy for both
FORBIDDEN_NAMES = frozenset(
    {
        "exec",
        "eval",
        "compile",
        "open",
        "getattr",
        "setattr",
        "delattr",
        "__import__",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "input",
        "help",
        "memoryview",
        "exit",
        "quit",
        "__builtins__",
        "__loader__",
        "__spec__",
    }
)
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


# --- RestrictedPython's compile, with the policy of the env contract ---------------------
class EnvTransformer(RestrictingNodeTransformer):
    """RestrictedPython's policy, with single-underscore names and simple augmented
    assignments allowed (the runtime guards decide about private attributes)."""

    def check_name(self, node, name, allow_magic_methods=False):
        if name and PRIVATE_NAME.fullmatch(name) and name not in RESERVED_NAMES:
            return
        super().check_name(node, name, allow_magic_methods=allow_magic_methods)

    def visit_Attribute(self, node):
        attr = node.attr
        if not (PRIVATE_NAME.fullmatch(attr) and attr not in RESERVED_NAMES):
            return super().visit_Attribute(node)
        node.attr = "p" + attr  # past the parent's leading-underscore refusal, restored below
        new = super().visit_Attribute(node)
        if isinstance(new, ast.Call):
            name = ast.Constant(attr)
            copy_locations(name, node)
            new.args[1] = name
        else:
            new.attr = attr
        return new

    def visit_AnnAssign(self, node):
        """``x: int = 0`` (dataclass fields): checked and transformed like an assignment."""
        if node.simple and isinstance(node.target, ast.Name):
            self.check_name(node, node.target.id)
        return self.node_contents_visit(node)

    def visit_AugAssign(self, node):
        target = node.target
        simple_attr = isinstance(target, ast.Attribute) and _plain(target.value)
        simple_item = isinstance(target, ast.Subscript) and _plain(target.value) and _plain(target.slice)
        if not (simple_attr or simple_item):
            return super().visit_AugAssign(node)
        load = copy.deepcopy(target)
        load.ctx = ast.Load()
        operation = ast.Constant(IOPERATOR_TO_STR[type(node.op)])
        call = ast.Call(ast.Name("_inplacevar_", ast.Load()), [operation, self.visit(load), self.visit(node.value)], [])
        assign = ast.Assign(targets=[self.visit(target)], value=call)
        for child in ast.walk(assign):
            if "lineno" in child._attributes and getattr(child, "lineno", None) is None:
                copy_locations(child, node)
        return assign


def _plain(node) -> bool:
    """A name, a constant or a dotted name: evaluating it twice changes nothing."""
    return isinstance(node, (ast.Name, ast.Constant)) or (isinstance(node, ast.Attribute) and _plain(node.value))


@functools.lru_cache(maxsize=64)
def compile_env(source: str):
    """(code, errors): env.py transformed by RestrictedPython's policy and compiled
    (as ``env.py``, the name the worker's tracebacks look for), or its refusals;
    cached, as the same env starts many workers. Compiled with ``dont_inherit``:
    no ``__future__`` flag of trace-gym's or RestrictedPython's modules leaks in
    (postponed annotations would break dataclasses in the worker)."""
    try:
        tree = ast.parse(source, filename="env.py")
        errors: list[str] = []
        EnvTransformer(errors=errors, warnings=[], used_names={}).visit(tree)
        if errors:
            return None, tuple(errors)
        return compile(tree, "env.py", "exec", dont_inherit=True), ()
    except SyntaxError as exc:
        return None, (f"Line {exc.lineno or 1}: SyntaxError: {exc.msg}",)
    except (RecursionError, MemoryError, ValueError) as exc:  # hostile nesting must not crash the host
        return None, (f"Line 1: the source nests too deeply to be compiled ({type(exc).__name__})",)


def check_source(source: str, filename: str = "env.py") -> list[Finding]:
    """Every rule broken by ``source``; empty if it may run."""
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        return [Finding(1, f"source is larger than {MAX_SOURCE_BYTES // 1024} KiB")]
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        return [Finding(exc.lineno or 1, f"syntax error: {exc.msg}")]
    except (RecursionError, MemoryError, ValueError) as exc:  # hostile nesting must not crash the host
        return [Finding(1, f"the source nests too deeply to be checked ({type(exc).__name__})")]
    findings: list[Finding] = []
    modules = _module_names(tree)
    for node in ast.walk(tree):
        findings.extend(_check_node(node))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            module = modules[node.value.id]
            if node.attr not in MODULES[module] and not node.attr.startswith("__"):
                findings.append(
                    Finding(
                        node.lineno,
                        f"'{module}.{node.attr}' is not on the sandbox's allowlist "
                        f"(from {module}: {', '.join(sorted(MODULES[module]))})",
                    )
                )
    findings.extend(_restricted_python_findings(source, filename))
    return sorted(set(findings), key=lambda f: (f.line, f.message))


_RP_LINE = re.compile(r"^Line (\d+): (.*)$", re.S)


def _restricted_python_findings(source: str, filename: str) -> list[Finding]:
    _, errors = compile_env(source)
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


_UNPACK = (ast.Tuple, ast.List, ast.Starred)


def _check_node(node: ast.AST) -> list[Finding]:
    line = getattr(node, "lineno", 1)
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                out.append(
                    Finding(
                        line, f"import of '{alias.name}' is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})"
                    )
                )
    elif isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if node.level:
            out.append(Finding(line, "relative imports are not allowed"))
        elif module not in ALLOWED_IMPORTS:
            out.append(
                Finding(line, f"import from '{module}' is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})")
            )
        for alias in node.names:
            if alias.name == "*":
                out.append(Finding(line, f"'from {module} import *' is not allowed"))
            elif alias.name.startswith("_"):
                out.append(Finding(line, f"importing private name '{alias.name}' is not allowed"))
            elif module in MODULES and alias.name not in MODULES[module]:
                out.append(
                    Finding(
                        line,
                        f"'{module}.{alias.name}' is not on the sandbox's allowlist "
                        f"(from {module}: {', '.join(sorted(MODULES[module]))})",
                    )
                )
    elif isinstance(node, ast.Assign) and len(node.targets) > 1 and any(isinstance(t, _UNPACK) for t in node.targets):
        # RestrictedPython unpacks through the iteration guard by repeating the value per target
        # (`a, b = c = f()` would call f twice), so the code would not do what it says
        out.append(Finding(line, "a chained assignment that unpacks runs its value once per target here; split it"))
    elif isinstance(node, ast.Name):
        if node.id in FORBIDDEN_NAMES:
            out.append(Finding(line, f"'{node.id}' is not allowed"))
    elif isinstance(node, ast.Attribute):
        out.extend(_check_attribute(node, line))
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        if _DUNDER.search(node.value):
            out.append(Finding(line, "a string that spells a dunder name is not allowed"))
    return out


def _module_names(tree: ast.AST) -> dict[str, str]:
    """Names the source binds to allowed modules with ``import m`` / ``import m as n``
    (an assignment may rebind one; the proxies check every read at run time anyway)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and "." not in alias.name:
                    names[alias.asname or alias.name] = alias.name
    return names


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
