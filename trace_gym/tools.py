"""Tool schemas in the OpenAI function format, and their canonical form.

A synthesized environment must present the target's tools byte for byte, so
schemas are compared in one canonical serialisation (sorted keys, no
whitespace, UTF-8), never as Python objects that could hide a difference in
key order or a float spelled two ways. This module has no heavy imports: the
registry uses it at ``import trace_gym`` time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .errors import ManifestError

ToolSchema = dict[str, Any]


def canonical_json(value: Any) -> str:
    """The one serialisation used for comparing and hashing schemas."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_tools(tools: Iterable[ToolSchema]) -> str:
    """Canonical form of a list of tool schemas, ordered by tool name."""
    return canonical_json(sorted(tools, key=tool_name))


def tools_hash(tools: Iterable[ToolSchema]) -> str:
    return hashlib.sha256(canonical_tools(tools).encode("utf-8")).hexdigest()


def tool_name(schema: ToolSchema) -> str:
    """The name of a schema in OpenAI format ``{"type": "function", "function": {...}}``."""
    try:
        return schema["function"]["name"]
    except (KeyError, TypeError):
        raise ValueError(f"not an OpenAI function schema: {str(schema)[:200]}") from None


def tool_parameters(schema: ToolSchema) -> dict[str, Any]:
    return schema["function"].get("parameters") or {"type": "object", "properties": {}}


def load_frozen_tools(path: Path) -> list[ToolSchema]:
    """Read a frozen tools.json (a list of OpenAI function schemas); a file that is
    missing or not such a list is a ``ManifestError`` naming the file and the fix."""
    fix = "freeze the target with `trace-gym targets freeze ID` (docs/targets.md)"
    try:
        tools = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: not found: the target's tools are not frozen; {fix}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable ({exc}); {fix}") from None
    problem = schemas_problem(tools)
    if problem is not None:
        raise ManifestError(f"{path}: {problem}; {fix}")
    return tools


def schemas_problem(tools: Any) -> str | None:
    """Why ``tools`` is not a list of OpenAI function schemas; None when it is."""
    if not isinstance(tools, list):
        return "expected a JSON list of tool schemas"
    for schema in tools:
        try:
            tool_name(schema)
        except ValueError as exc:
            return str(exc)
    return None


def dump_frozen_tools(tools: Iterable[ToolSchema], path: Path) -> None:
    """Write tools sorted by name, pretty-printed for review in diffs."""
    ordered = sorted(tools, key=tool_name)
    Path(path).write_text(json.dumps(ordered, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def select_tools(tools: Iterable[ToolSchema], names: Iterable[str]) -> list[ToolSchema]:
    """The schemas of ``names``, in that order; an unknown name is an error."""
    by_name = {tool_name(t): t for t in tools}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"not tools of the target: {', '.join(missing)}")
    return [by_name[n] for n in names]


def check_arguments(schema: ToolSchema, arguments: dict[str, Any]) -> list[str]:
    """Problems with ``arguments`` against the schema's parameters, as sentences.

    Checks what an agent most often gets wrong: unknown and missing parameters
    and JSON types. It is not a full JSON-Schema validator, on purpose: the
    target itself decides about values.
    """
    params = tool_parameters(schema)
    props: dict[str, Any] = params.get("properties", {}) or {}
    problems = []
    for name in params.get("required", []) or []:
        if name not in arguments:
            problems.append(f"missing required argument '{name}'")
    for name, value in arguments.items():
        if name not in props:
            allowed = ", ".join(sorted(props)) or "none"
            problems.append(f"unknown argument '{name}' (parameters: {allowed})")
            continue
        expected = props[name].get("type")
        if expected and not _json_type_matches(value, expected):
            problems.append(f"argument '{name}' should be {expected}, got {type(value).__name__}")
    return problems


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _json_type_matches(value: Any, expected: str | list[str]) -> bool:
    kinds = [expected] if isinstance(expected, str) else list(expected)
    for kind in kinds:
        py = _JSON_TYPES.get(kind)
        if py is None:
            return True  # a type we do not model: leave it to the target
        if isinstance(value, bool) and kind in ("integer", "number"):
            continue
        if isinstance(value, py):
            return True
    return False


# Name-based classification of tools, for benchmarks that name them the τ² way.
READ_PREFIXES = ("get_", "find_", "list_", "calculate", "search_")
NOT_STATE_CHANGING = ("transfer_to_human_agents",)  # hands over; changes no record


def is_read(tool: str) -> bool:
    """A tool that only reads (get_/find_/list_/search_, calculate)."""
    return tool.startswith(READ_PREFIXES)


def changes_state(tool: str) -> bool:
    """A tool that writes: neither a read nor a hand-over to a human."""
    return not is_read(tool) and tool not in NOT_STATE_CHANGING


@dataclass(frozen=True)
class CallErrorStyle:
    """How a target words a call it cannot run. τ²-bench answers with Python's own
    TypeError text behind its toolkit's class name (``prefix``, e.g. ``RetailTools.``)."""

    prefix: str = ""
    unknown_tool: str = "Error: Tool '{name}' not found."
    unexpected_argument: str = "Error: {prefix}{name}() got an unexpected keyword argument '{argument}'"
    missing_arguments: str = "Error: {prefix}{name}() missing {count} required positional argument{plural}: {arguments}"
    # ToolSandbox binds arguments with inspect.Signature.bind: a missing argument is
    # reported before an unexpected one, and only the first missing one is named.
    missing_first: bool = False
    first_missing_only: bool = False
    tool_exception: str = "Error: {message}"
    """An exception raised inside a tool: τ²-bench answers ``Error: <str(exception)>``."""


def call_error(tools: Iterable[ToolSchema], name: str, arguments: dict[str, Any], style: CallErrorStyle) -> str | None:
    """The target's answer to a call that names no tool, or an argument the tool
    does not take or misses one it needs; None when the names are right.

    Synthesized envs get only calls whose names fit the schemas, so that none of
    them repeats this check (values are still theirs to judge)."""
    by_name = {tool_name(t): t for t in tools}
    if name not in by_name:
        return style.unknown_tool.format(name=name, prefix=style.prefix)
    params = tool_parameters(by_name[name])
    known = params.get("properties", {}) or {}
    unexpected = [a for a in arguments if a not in known]
    missing = [a for a in params.get("required", []) or [] if a not in arguments]
    if unexpected and not (missing and style.missing_first):
        return style.unexpected_argument.format(name=name, argument=unexpected[0], prefix=style.prefix)
    if missing:
        missing = missing[:1] if style.first_missing_only else missing
        quoted = [f"'{a}'" for a in missing]
        listed = (
            quoted[0]
            if len(quoted) == 1
            else (" and ".join(quoted) if len(quoted) == 2 else ", ".join(quoted[:-1]) + ", and " + quoted[-1])
        )
        return style.missing_arguments.format(
            name=name,
            prefix=style.prefix,
            count=len(missing),
            plural="" if len(missing) == 1 else "s",
            arguments=listed,
        )
    return None
