"""Freeze a target's tool interface into the registry: the schemas the agent
sees (``tools.json``) and the shapes of what each tool returns (``results.json``,
see :mod:`trace_gym.result_shapes`).

Synthesized envs are validated against these frozen copies, so that
validation never needs the target's package; a test keeps each frozen copy
equal to what the live package serves.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .env import check_target_reset
from .errors import TraceGymError
from .registry import EnvKind, get_entry, make, make_train
from .result_shapes import DescribesResults, dump_result_shapes
from .rollout import replay_oracle
from .tools import ToolSchema, dump_frozen_tools


def live_tools(env_id: str) -> list[ToolSchema]:
    """The tools the target serves now (makes the env): its ``tools``, or what a
    reset hands the agent in ``info["tools"]`` (a plain Gymnasium target)."""

    def tools(env):
        if isinstance(getattr(env.unwrapped, "tools", None), list):
            return list(env.unwrapped.tools)

        observation, info = env.reset(seed=0)
        check_target_reset(env.unwrapped, observation, info)
        if not info["tools"]:
            raise TraceGymError(f"{env_id} gives no tools: reset() must put its OpenAI tool schemas in info['tools']")
        return list(info["tools"])

    return _from_live_target(env_id, tools)


def live_result_shapes(env_id: str) -> dict[str, Any]:
    """The result shapes the target declares now (``result_shapes()``), or, for a
    target that declares none, those its tools showed while its reference solutions
    were played (``oracle_actions()`` on up to ``OBSERVED_TASKS`` tasks of its train
    split: held-out tasks are evaluation's alone)."""

    def shapes(env):
        if isinstance(env.unwrapped, DescribesResults):
            return env.unwrapped.result_shapes()
        if not callable(getattr(env.unwrapped, "oracle_actions", None)):
            raise TraceGymError(
                f"{env_id} cannot describe what its tools return: give it result_shapes() or "
                "oracle_actions() (docs/targets.md); nothing was written"
            )
        return None

    declared = _from_live_target(env_id, shapes)
    if declared is not None:
        return declared
    env, _ = make_train(env_id)
    try:
        return observed_result_shapes(env.unwrapped, env_id)
    finally:
        env.close()


OBSERVED_TASKS = 20


def observed_result_shapes(env: Any, env_id: str) -> dict[str, Any]:
    """Result shapes inferred from what each tool answered in reference solutions: JSON
    answers as the schema of the values seen (every field seen each time required),
    others as text; the error prefix from an answer to a call of no tool."""
    tasks = [str(t) for t in (getattr(env.unwrapped, "task_ids", None) or [])][:OBSERVED_TASKS]
    seen: dict[str, list[Any]] = {}
    for n, task in enumerate(tasks or [None] * OBSERVED_TASKS):
        env.reset(seed=n, options={"task_id": task} if task is not None else None)
        for parsed, observation, _ in replay_oracle(env):
            if parsed.is_tool_call and len(parsed.tool_calls) == 1:
                seen.setdefault(parsed.tool_calls[0].name, []).append(observation)
    if not seen:
        raise TraceGymError(
            f"{env_id}: its reference solutions called no tool, so nothing shows what its tools return; "
            "give it result_shapes(); nothing was written"
        )
    env.reset(seed=0, options={"task_id": tasks[0]} if tasks else None)
    refusal, *_ = env.step('{"name": "trace_gym_no_such_tool", "arguments": {}}')
    prefix = refusal.split(":", 1)[0] + ": " if ":" in refusal[:40] else "Error: "
    out = {}
    for tool, answers in sorted(seen.items()):
        answers = [a for a in answers if not a.startswith(prefix)]
        values = []
        for answer in answers:
            try:
                values.append(json.loads(answer))
            except json.JSONDecodeError:
                values = None
                break
        if values:
            schema = _schema_of(values[0])
            for value in values[1:]:
                schema = _merge(schema, _schema_of(value))
            out[tool] = {"format": "json", "schema": schema}
        else:
            out[tool] = {"format": "text", "schema": {"type": "string"}}
    return {"error_prefix": prefix, "tools": out, "observed": True}


def _schema_of(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {k: _schema_of(v) for k, v in value.items()},
            "required": sorted(value),
            "additionalProperties": False,
            "x-observed": True,
        }
    if isinstance(value, list):
        items = [_schema_of(v) for v in value]
        merged = items[0] if items else {}
        for item in items[1:]:
            merged = _merge(merged, item)
        return {"type": "array", "items": merged}
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}[type(value)]
    return {"type": kind}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One schema both values fit."""
    if not a:
        return b
    if not b:
        return a
    if a.get("type") == b.get("type") == "object":
        props = dict(a["properties"])
        for k, v in b["properties"].items():
            props[k] = _merge(props[k], v) if k in props else v
        return {
            "type": "object",
            "properties": props,
            "required": sorted(set(a["required"]) & set(b["required"])),
            "additionalProperties": False,
            "x-observed": True,
        }
    if a.get("type") == b.get("type") == "array":
        return {"type": "array", "items": _merge(a.get("items") or {}, b.get("items") or {})}
    if a == b:
        return a
    kinds = sorted(
        {
            *(a["type"] if isinstance(a.get("type"), list) else [a.get("type")]),
            *(b["type"] if isinstance(b.get("type"), list) else [b.get("type")]),
        }
        - {None}
    )
    return {"type": kinds}


def freeze_tools(env_id: str) -> list[Path]:
    """Write ``tools.json`` and ``results.json`` of a target from its live package:
    both or neither. Both are read and written aside first; if the second cannot take
    its place, the first is put back as it was."""
    entry = get_entry(env_id)
    if entry.kind != EnvKind.TARGET:
        raise TraceGymError(
            f"{env_id} is not a target; only targets' schemas are frozen (a synthesized env shows its target's)"
        )
    tools, shapes = live_tools(env_id), live_result_shapes(env_id)

    for leftover in entry.path.glob(".freeze-*"):  # what a killed freeze left
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=".freeze-", dir=entry.path))  # beside them: os.replace stays on one disk
    try:
        dump_frozen_tools(tools, staging / entry.tools_path.name)
        written = dump_result_shapes(shapes, staging)
        pairs = [(staging / entry.tools_path.name, entry.tools_path), (written, entry.path / written.name)]
        for _, destination in pairs:
            if destination.exists() and not destination.is_file():
                raise TraceGymError(f"{destination}: not a file, so it cannot be frozen over; nothing was written")
        old_tools = staging / "previous-tools.json"
        if entry.tools_path.exists():
            shutil.copy2(entry.tools_path, old_tools)
        os.replace(*pairs[0])
        try:
            os.replace(*pairs[1])
        except BaseException as exc:  # (Ctrl-C between the two as well)
            if old_tools.exists():
                os.replace(old_tools, entry.tools_path)
            else:
                entry.tools_path.unlink()
            if not isinstance(exc, OSError):
                raise
            raise TraceGymError(
                f"{pairs[1][1]}: cannot be written ({exc.strerror}); {entry.tools_path.name} left as it was"
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [entry.tools_path, entry.path / written.name]


def _from_live_target(env_id: str, read):
    env = make(env_id)
    try:
        return read(env.unwrapped)
    finally:
        env.close()
