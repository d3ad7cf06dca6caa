"""Agent policies (installed as ``trace_gym.agents``).

An agent is anything with ``reset(observation, info, env)`` and
``act(observation) -> str``: it reads text and writes the raw text of its next
action, exactly what a model would write. ``make_agent`` builds one by name.
"""

from __future__ import annotations

from typing import Any

from .base import Agent
from .floor import MessageOnlyAgent, NoOpAgent
from .oracle import OracleAgent, PartialOracleAgent
from .random_agent import RandomAgent

AGENTS = {
    "oracle": OracleAgent,
    "partial_oracle": PartialOracleAgent,
    "random": RandomAgent,
    "noop": NoOpAgent,
    "message_only": MessageOnlyAgent,
}

__all__ = ["Agent", "OracleAgent", "PartialOracleAgent", "RandomAgent", "NoOpAgent", "MessageOnlyAgent", "AGENTS", "make_agent"]


def make_agent(name: str, **kwargs: Any) -> Agent:
    from trace_gym.errors import TraceGymError

    if name not in AGENTS:
        raise TraceGymError(f"unknown agent '{name}'; choose one of {', '.join(sorted(AGENTS))}")
    return AGENTS[name](**kwargs)
