"""RandomAgent: schema-valid random tool calls and messages, seeded.

A floor for every env: the validator's "not trivial" check and the
contrastive analysis both need a policy that knows the interface but not the
task. Argument strings are drawn from tokens seen in observations so far
(ids, names), so its calls sometimes hit real records, as a weak agent's do.
"""

from __future__ import annotations

import random
import re
from typing import Any

from trace_gym.actions import format_tool_call
from trace_gym.seeding import derive_seed
from trace_gym.tools import tool_name, tool_parameters

_TOKEN = re.compile(r"[#A-Za-z0-9_@.\-]{3,40}")
_MESSAGES = [
    "Could you tell me more about your request?",
    "I have processed that for you.",
    "Can you confirm your details?",
    "Let me check that.",
]


class RandomAgent:
    name = "random"
    model = None
    adapter = None

    def __init__(self, seed: int = 0, p_tool: float = 0.7, p_stop: float = 0.05, **_: Any):
        self._base_seed = seed
        self.p_tool = p_tool
        self.p_stop = p_stop
        self._rng = random.Random(seed)
        self._tools: list[dict[str, Any]] = []
        self._seen: list[str] = []
        self._stop: str | None = None

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        # Reseed per episode from the task so results do not depend on run order.
        self._rng = random.Random(derive_seed(self._base_seed, info.get("task_id"), info.get("episode_seed")))
        self._tools = list(info.get("tools") or [])
        self._stop = info.get("stop_token")
        self._seen = []
        self._observe(observation)

    def act(self, observation: str) -> str:
        self._observe(observation)
        roll = self._rng.random()
        if self._stop and roll < self.p_stop:
            return self._stop
        if self._tools and roll < self.p_stop + self.p_tool:
            schema = self._rng.choice(self._tools)
            return format_tool_call(tool_name(schema), self.arguments_for(tool_parameters(schema)))
        return self._rng.choice(_MESSAGES)

    def usage(self) -> dict[str, int | None]:
        return {"prompt_tokens": None, "completion_tokens": None}

    def _observe(self, text: str) -> None:
        self._seen.extend(_TOKEN.findall(text or "")[:200])
        self._seen = self._seen[-500:]

    def arguments_for(self, params: dict[str, Any]) -> dict[str, Any]:
        """Random arguments that fit a tool's JSON-schema parameters."""
        props = params.get("properties", {}) or {}
        return {name: self._value(spec) for name, spec in props.items() if name in (params.get("required") or props)}

    def _value(self, spec: dict[str, Any]) -> Any:
        kind = spec.get("type")
        if isinstance(kind, list):
            kind = self._rng.choice(kind)
        if "enum" in spec:
            return self._rng.choice(spec["enum"])
        if kind == "integer":
            return self._rng.randint(0, 100)
        if kind == "number":
            return round(self._rng.uniform(0, 1000), 2)
        if kind == "boolean":
            return self._rng.random() < 0.5
        if kind == "array":
            return [self._value(spec.get("items", {"type": "string"})) for _ in range(self._rng.randint(1, 2))]
        if kind == "object":
            return {}
        if self._seen and self._rng.random() < 0.8:
            return self._rng.choice(self._seen)
        return "".join(self._rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
