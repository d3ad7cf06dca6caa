"""Freeze a target's tool schemas into the registry (``tools.json``).

Synthesized envs are validated against these frozen copies, so that
validation never needs the target's package; a test keeps each frozen copy
equal to what the live package serves.
"""

from __future__ import annotations

from pathlib import Path

from .registry import get_entry
from .tools import ToolSchema, dump_frozen_tools


def live_tools(env_id: str) -> list[ToolSchema]:
    """The tools the target's package serves now (makes the env)."""
    from .registry import make

    env = make(env_id)
    try:
        return list(env.unwrapped.tools)
    finally:
        env.close()


def freeze_tools(env_id: str) -> Path:
    entry = get_entry(env_id)
    if entry.kind != "target":
        raise ValueError(f"{env_id} is not a target; only targets' schemas are frozen")
    dump_frozen_tools(live_tools(env_id), entry.tools_path)
    return entry.tools_path
