"""Agent policies (installed as ``trace_gym.agents``).

An agent (``agents.base.Agent``) has ``name``, ``model`` and ``adapter`` (None
where it has no model), ``reset(observation, info, env)`` and
``act(observation) -> str``: it reads text and writes the raw text of its next
action, exactly what a model would write. ``make_agent`` builds one by name.
"""

from __future__ import annotations

import importlib
from typing import Any

from trace_gym.errors import TraceGymError

from .base import Agent
from .floor import MessageOnlyAgent, NoOpAgent
from .oracle import OracleAgent, PartialOracleAgent
from .planted import PlantedDeficitAgent
from .random_agent import RandomAgent

AGENTS = {
    "oracle": OracleAgent,
    "partial_oracle": PartialOracleAgent,
    "random": RandomAgent,
    "noop": NoOpAgent,
    "message_only": MessageOnlyAgent,
    "planted": PlantedDeficitAgent,
}
# Built lazily: importing them loads model code.
LAZY_AGENTS = {
    "llm": ("trace_gym.agents.llm_agent", "LLMAgent"),
    "routed": ("trace_gym.routing", "RoutedAgent"),  # built by the pipeline's evaluate stage, with its router
}


def __getattr__(name: str) -> Any:
    if name in ("LLMAgent", "AgentGaveUp"):
        from . import llm_agent  # on first use: it loads model code

        return getattr(llm_agent, name)
    raise AttributeError(name)


__all__ = [
    "LLMAgent",
    "Agent",
    "OracleAgent",
    "PartialOracleAgent",
    "RandomAgent",
    "NoOpAgent",
    "MessageOnlyAgent",
    "PlantedDeficitAgent",
    "AGENTS",
    "make_agent",
]


def make_agent(name: str, **kwargs: Any) -> Agent:
    if name in LAZY_AGENTS:
        module, cls = LAZY_AGENTS[name]
        return getattr(importlib.import_module(module), cls)(**kwargs)
    if name not in AGENTS:
        raise TraceGymError(f"unknown agent '{name}'; choose one of {', '.join(sorted([*AGENTS, *LAZY_AGENTS]))}")
    return AGENTS[name](**kwargs)
