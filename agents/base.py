"""The agent protocols every policy implements.

``Agent`` is what ``rollout.run_episode`` plays, one action at a time. An agent may
also ``observe`` each step's result, report ``info`` into its trajectory record and
meter its ``usage`` (``Observes``, ``Reports``, ``Meters``: the runner calls them where
present). ``LockStepAgent``
is what ``rollout.play_batched`` plays: many episodes in step, one batched generation
per turn from a shared backend, the agent splitting ``act`` into ``request`` and
``receive``. An agent that cannot go on raises ``trace_gym.errors.AgentGaveUp``.
"""

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


@runtime_checkable
class Meters(Protocol):
    def usage(self) -> dict[str, int | None]:
        """Tokens spent in this episode: ``prompt_tokens``, ``completion_tokens``."""


@runtime_checkable
class Observes(Protocol):
    def observe(self, observation: str, info: dict[str, Any]) -> None:
        """The result of the agent's last action (called after every step)."""


@runtime_checkable
class Reports(Protocol):
    def info(self) -> dict[str, Any]:
        """What the trajectory record keeps of the episode (``agent_info``), e.g. a route."""


@runtime_checkable
class LockStepAgent(Agent, Protocol):
    backend: Any
    """The model; every agent of one lock-step batch shares it."""
    tokens: Any
    """The episode's ``TokenEpisode`` from a token-level backend, else None."""

    def request(self) -> Any:
        """The next turn's ``GenerationRequest``."""

    def receive(self, completion: Any) -> str:
        """The raw text of the action in ``completion``, the answer to ``request``."""

    def end_episode(self) -> None:
        """The episode is over: release what the backend keeps for it."""
