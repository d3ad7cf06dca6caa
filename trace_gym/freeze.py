"""Freeze a target's tool interface into the registry: the schemas the agent
sees (``tools.json``) and the shapes of what each tool returns (``results.json``,
see :mod:`trace_gym.result_shapes`).

Synthesized envs are validated against these frozen copies, so that
validation never needs the target's package; a test keeps each frozen copy
equal to what the live package serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import TraceGymError
from .registry import get_entry
from .result_shapes import dump_result_shapes
from .tools import ToolSchema, dump_frozen_tools


def live_tools(env_id: str) -> list[ToolSchema]:
    """The tools the target's package serves now (makes the env)."""
    return _from_live_target(env_id, lambda env: list(env.tools))


def live_result_shapes(env_id: str) -> dict[str, Any]:
    """The result shapes the target's package declares now (makes the env)."""

    def shapes(env):
        if not hasattr(env, "result_shapes"):
            raise TraceGymError(f"{env_id} cannot describe what its tools return; its results are not frozen")
        return env.result_shapes()

    return _from_live_target(env_id, shapes)


def freeze_tools(env_id: str) -> list[Path]:
    """Write ``tools.json`` and ``results.json`` of a target from its live package."""
    entry = get_entry(env_id)
    if entry.kind != "target":
        raise TraceGymError(f"{env_id} is not a target; only targets' schemas are frozen (a synthesized env shows its target's)")
    dump_frozen_tools(live_tools(env_id), entry.tools_path)
    return [entry.tools_path, dump_result_shapes(live_result_shapes(env_id), entry.path)]


def _from_live_target(env_id: str, read):
    from .registry import make

    env = make(env_id)
    try:
        return read(env.unwrapped)
    finally:
        env.close()
