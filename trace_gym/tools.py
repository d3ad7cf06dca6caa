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
from pathlib import Path
from typing import Any, Iterable

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
    """Read a frozen tools.json (a list of OpenAI function schemas)."""
    tools = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(tools, list):
        raise ValueError(f"{path}: expected a JSON list of tool schemas")
    for schema in tools:
        tool_name(schema)
    return tools


def dump_frozen_tools(tools: Iterable[ToolSchema], path: Path) -> None:
    """Write tools sorted by name, pretty-printed for review in diffs."""
    ordered = sorted(tools, key=tool_name)
    Path(path).write_text(
        json.dumps(ordered, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


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
