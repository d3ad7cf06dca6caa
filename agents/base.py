"""The agent protocol every policy implements."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Agent(Protocol):
    name: str
    model: str | None
    adapter: str | None

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        """Start an episode. ``env`` is given to privileged agents (the oracle)."""

    def act(self, observation: str) -> str:
        """The raw text of the next action."""

    def usage(self) -> dict[str, int | None]:
        """Tokens spent in this episode: ``prompt_tokens``, ``completion_tokens``."""
