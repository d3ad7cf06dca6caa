"""What a target's tools return, frozen beside its ``tools.json``, and the check
that a tool result has that shape.

``results.json`` of a target folder holds, per tool, the format of the result
text the target sends (``json``: a JSON document; ``text``: the tool's string,
as is; ``free``: a free-form value, a JSON object or text) and the JSON Schema of its value, made from the target's own return type
(for τ²: the pydantic model or type a tool function is annotated to return, as
``tau2.environment.Environment.to_json_str`` serialises it), plus the prefix
the target puts before an error message. It is written by
``trace-gym envs freeze-tools`` and compared with the live package by a test;
never by hand.

:func:`result_problems` judges one result text against a tool's shape the way
the target's serialiser makes results: every field the model has is written
(tau2 dumps all fields, ``None`` as ``null``), no other field, JSON types
exact. This module reads only JSON: validation needs no target package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .errors import ManifestError

RESULTS_FILE = "results.json"
MAX_PROBLEMS = 3


@runtime_checkable
class DescribesResults(Protocol):
    def result_shapes(self) -> dict[str, Any]:
        """What each tool returns: ``{"error_prefix": ..., "tools": {name: {"format", "schema"}}}``."""


def results_path(target_folder: Path) -> Path:
    return Path(target_folder) / RESULTS_FILE


def load_result_shapes(target_folder: Path) -> dict[str, Any] | None:
    """The frozen result shapes of a target folder, or None if it has none."""
    path = results_path(target_folder)
    if not path.exists():
        return None
    fix = "freeze the target again with `trace-gym targets freeze ID`"
    try:
        shapes = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable ({exc}); {fix}") from None
    if (
        not isinstance(shapes, dict)
        or not isinstance(shapes.get("tools"), dict)
        or not isinstance(shapes.get("error_prefix"), str)
    ):
        raise ManifestError(
            f"{path}: expected {{'error_prefix': str, 'tools': {{name: {{'format', 'schema'}}}}}}; {fix}"
        )
    return shapes


def dump_result_shapes(shapes: dict[str, Any], target_folder: Path) -> Path:
    path = results_path(target_folder)
    path.write_text(json.dumps(shapes, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def result_problems(shapes: dict[str, Any], tool: str, text: str) -> list[str]:
    """Why ``text`` is not what the target's ``tool`` could answer (empty: it could).

    An answer is either an error in the target's style (its prefix, then a
    one-line message) or a result of the tool's frozen shape."""
    prefix = shapes["error_prefix"]
    if text.startswith(prefix):
        message = text[len(prefix) :]
        if not message.strip():
            return [f"an error with no message after {prefix!r}"]
        return []
    shape = shapes["tools"].get(tool)
    if shape is None:
        return [f"the target has no frozen result shape for '{tool}'"]
    if shape["format"] in ("text", "free"):
        return []  # the target sends this tool's own string as is, or a value with no fixed fields
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return [
            f"not JSON and not an error ({prefix!r}...): the target answers {tool} with a JSON document, got {text[:60]!r}"
        ]
    problems: list[str] = []
    _check(value, shape["schema"], shape["schema"].get("$defs", {}), "result", problems)
    return problems[:MAX_PROBLEMS]


def _check(value: Any, schema: dict[str, Any], defs: dict[str, Any], where: str, problems: list[str]) -> None:
    if len(problems) >= MAX_PROBLEMS:
        return
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = schema[key]
            if not any(_fits(value, option, defs) for option in options):
                kinds = ", ".join(_describe(o, defs) for o in options)
                problems.append(f"{where}: {_short(value)} is none of {kinds}")
            return
    for part in schema.get("allOf", []):
        _check(value, part, defs, where, problems)
    if "const" in schema and value != schema["const"]:
        problems.append(f"{where}: {_short(value)} should be {schema['const']!r}")
        return
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {_short(value)} is not one of {schema['enum']}")
        return
    kind = schema.get("type")
    if kind is not None and not _type_ok(value, kind):
        problems.append(f"{where}: expected {kind}, got {_json_kind(value)} {_short(value)}")
        return
    if isinstance(value, dict):
        _check_object(value, schema, defs, where, problems)
    elif isinstance(value, list):
        _check_array(value, schema, defs, where, problems)


def _check_object(value: dict, schema: dict[str, Any], defs: dict[str, Any], where: str, problems: list[str]) -> None:
    props = schema.get("properties")
    extra = schema.get("additionalProperties", props is None)
    if props is not None:
        # Every field the target has is written (tau2 dumps them all), unless the shape was
        # observed rather than declared: then only the fields seen in every answer must be.
        must = schema.get("required", list(props)) if schema.get("x-observed") else list(props)
        missing = [name for name in must if name not in value]
        unknown = [name for name in value if name not in props]
        if missing or (unknown and extra is False):
            parts = []
            if missing:
                parts.append("missing " + ", ".join(f"'{m}'" for m in missing))
            if unknown and extra is False:
                parts.append("fields the target never writes: " + ", ".join(f"'{u}'" for u in unknown))
            problems.append(f"{where}: " + "; ".join(parts) + f" (the target writes: {', '.join(props)})")
        for name, sub in props.items():
            if name in value:
                _check(value[name], sub, defs, f"{where}.{name}", problems)
    names = schema.get("propertyNames", {}).get("enum")
    for key, item in value.items():
        if props is not None and key in props:
            continue
        if names is not None and key not in names:
            problems.append(f"{where}: key '{key}' is not one of {names}")
        if isinstance(extra, dict):
            _check(item, extra, defs, f"{where}[{key!r}]", problems)


def _check_array(value: list, schema: dict[str, Any], defs: dict[str, Any], where: str, problems: list[str]) -> None:
    prefix = schema.get("prefixItems", [])
    if (
        "minItems" in schema
        and len(value) < schema["minItems"]
        or "maxItems" in schema
        and len(value) > schema["maxItems"]
    ):
        problems.append(
            f"{where}: {len(value)} items, expected {schema.get('minItems', 0)} to {schema.get('maxItems', 'any')}"
        )
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else schema.get("items")
        if isinstance(sub, dict):
            _check(item, sub, defs, f"{where}[{i}]", problems)


def _fits(value: Any, schema: dict[str, Any], defs: dict[str, Any]) -> bool:
    problems: list[str] = []
    _check(value, schema, defs, "", problems)
    return not problems


_KINDS = {"string": str, "boolean": bool, "object": dict, "array": list, "null": type(None)}


def _type_ok(value: Any, kind: str | list[str]) -> bool:
    if isinstance(kind, list):
        return any(_type_ok(value, k) for k in kind)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _KINDS.get(kind, object))


def _json_kind(value: Any) -> str:
    for name, py in (
        ("null", type(None)),
        ("boolean", bool),
        ("integer", int),
        ("number", float),
        ("string", str),
        ("array", list),
        ("object", dict),
    ):
        if isinstance(value, py):
            return name
    return type(value).__name__


def _describe(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "const" in schema:
        return repr(schema["const"])
    return str(schema.get("type", "any"))


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 50 else text[:47] + "..."


def example_result(shapes: dict[str, Any], tool: str) -> Any:
    """A value of ``tool``'s result shape: every field the target writes, ``null``
    where the target allows it, empty strings, zeros and empty lists elsewhere
    (a skeleton for an env author to fill, e.g. the scaffold's)."""
    shape = shapes["tools"][tool]
    if shape["format"] == "text":
        return ""
    if shape["format"] == "free":
        return {}
    return _example(shape["schema"], shape["schema"].get("$defs", {}))


def _example(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in schema:
        return _example(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = schema[key]
            if any(o.get("type") == "null" for o in options):
                return None
            return _example(options[0], defs)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        return {name: _example(sub, defs) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [_example(sub, defs) for sub in schema.get("prefixItems", [])]
    return {"string": "", "integer": 0, "number": 0.0, "boolean": False, "null": None}.get(kind)
