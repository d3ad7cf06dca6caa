"""Floor policies that know nothing of the task: a good env scores them low.

``NoOpAgent`` says the same uninformative thing every turn. ``MessageOnlyAgent``
never calls a tool: it repeats what it was told and claims the job is done,
which catches envs whose answer is already in the prompt.
"""

from __future__ import annotations

from typing import Any


class NoOpAgent:
    name = "noop"
    model = None
    adapter = None

    def __init__(self, **_: Any):
        pass

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        pass

    def act(self, observation: str) -> str:
        return "OK."

    def usage(self) -> dict[str, int | None]:
        return {"prompt_tokens": None, "completion_tokens": None}


class MessageOnlyAgent(NoOpAgent):
    name = "message_only"

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        self._first = observation

    def act(self, observation: str) -> str:
        return f"Done: {self._first} Confirmed, the answer is in your message. Is there anything else?"
