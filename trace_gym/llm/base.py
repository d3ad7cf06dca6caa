"""What every backend returns, and its one error type."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from trace_gym.errors import TraceGymError


class LLMError(TraceGymError):
    """A model could not answer: unreachable endpoint, bad key, unknown model..."""


@dataclass
class Completion:
    """One model turn. ``text`` is what the agent sends to the env: the model's
    text, or its native tool calls written as ``<tool_call>`` blocks."""

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{"id", "name", "arguments"}]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None

    @classmethod
    def from_tool_calls(cls, content: str | None, calls: list[dict[str, Any]], **usage: Any) -> "Completion":
        """Native tool calls as text; arguments that were not valid JSON are kept as
        written, so the env's parser reports them as the model's mistake."""
        def block(call: dict[str, Any]) -> str:
            arguments = call["arguments"]
            rendered = json.dumps(arguments, ensure_ascii=False) if isinstance(arguments, dict) else str(arguments)
            return f'<tool_call>{{"name": {json.dumps(call["name"])}, "arguments": {rendered}}}</tool_call>'

        blocks = "".join(block(c) for c in calls)
        return cls(text=((content or "").strip() + "\n" + blocks).strip() if calls else (content or ""), tool_calls=calls, **usage)


class LLMBackend(Protocol):
    name: str

    def generate(
        self,
        conversations: list[list[dict[str, Any]]],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        adapter: str | None = None,
    ) -> list[Completion]:
        """One completion per conversation (OpenAI chat messages)."""
