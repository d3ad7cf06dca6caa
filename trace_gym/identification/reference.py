"""The reference analyst: the gold-action rules for any target with reference solutions.

``gold`` reads τ²-bench's gold actions; this analyst reads whatever a target's
env gives as its solution of a task (``oracle_actions()``: action texts, the
tool calls and the messages that solve it) and labels every episode with the
same rules and the same dictionary of capabilities: which state-changing calls
the solution makes and with which arguments, whether a read precedes the first
write, whether every action parsed, and whether the numbers the solution's
messages state were said. No LLM: exact, free, reproducible, offline.

It needs only the target's public contract (docs/targets.md): the env is made
by its id, reset to the episode's task (or seed), and asked for its solution.
"""

from __future__ import annotations

from typing import Any

from trace_gym.actions import ActionKind, parse_action
from trace_gym.errors import TraceGymError
from trace_gym.registry import make
from trace_gym.trajectory import Trajectory
from trace_gym.validation import stated_numbers

from .gold import GOLD_CAPABILITIES, label_against
from .stats import Label


class ReferenceAnalyst:
    name = "reference"

    def __init__(self):
        self._envs: dict[str, Any] = {}
        self._solutions: dict[tuple, tuple[list[tuple[str, dict[str, Any]]], list[str]]] = {}
        self.calls = 0
        self.tokens = 0

    def capabilities(self) -> dict[str, str]:
        return dict(GOLD_CAPABILITIES)

    def solution(self, trajectory: Trajectory) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
        """The reference solution of the episode's task: its tool calls and its messages."""
        key = (trajectory.env_id, trajectory.task_id, None if trajectory.task_id is not None else trajectory.seed)
        if key not in self._solutions:
            env = self._env(trajectory.env_id)
            options = {"task_id": trajectory.task_id} if trajectory.task_id is not None else None
            env.reset(seed=trajectory.seed, options=options)
            actions = env.unwrapped.oracle_actions()
            if not actions:
                raise TraceGymError(
                    f"{trajectory.env_id} gave no reference solution for task {trajectory.task_id!r} "
                    "(oracle_actions() returned nothing)"
                )
            calls, messages = [], []
            for text in actions:
                parsed = parse_action(text)
                if parsed.kind == ActionKind.TOOL_CALLS:
                    calls += [(c.name, dict(c.arguments)) for c in parsed.tool_calls]
                elif parsed.kind == ActionKind.MESSAGE:
                    messages.append(parsed.content)
            self._solutions[key] = (calls, messages)
        return self._solutions[key]

    def _env(self, env_id: str) -> Any:
        if env_id not in self._envs:
            env = make(env_id)
            if not callable(getattr(env.unwrapped, "oracle_actions", None)):
                env.close()
                raise TraceGymError(
                    f"the reference analyst needs reference solutions: {env_id} has no oracle_actions() "
                    "(docs/targets.md); use an LLM analyst (openai:<model>)"
                )
            self._envs[env_id] = env
        return self._envs[env_id]

    def label(self, trajectory: Trajectory) -> list[Label]:
        calls, messages = self.solution(trajectory)

        return label_against(trajectory, calls, sorted(stated_numbers(" ".join(messages))))

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
