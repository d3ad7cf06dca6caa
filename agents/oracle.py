"""OracleAgent: plays the environment's own solution (a target's gold actions,
a synthesized env's ``oracle()``). Privileged: it reads the env, so its scores
measure the env, never an agent."""

from __future__ import annotations

from typing import Any

from trace_gym.errors import TraceGymError


class OracleAgent:
    name = "oracle"
    model = None
    adapter = None

    def __init__(self, **_: Any):
        self._script: list[str] = []
        self._stop = "###STOP###"

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        if env is None:
            raise TraceGymError("the oracle agent needs the env (it plays the env's own solution)")
        actions = env.unwrapped.oracle_actions()
        if actions is None:
            raise TraceGymError(f"{env.spec.id if env.spec else type(env.unwrapped).__name__} has no oracle")
        self._script = list(actions)
        self._stop = info.get("stop_token", self._stop)

    def act(self, observation: str) -> str:
        return self._script.pop(0) if self._script else self._stop

    def usage(self) -> dict[str, int | None]:
        return {"prompt_tokens": None, "completion_tokens": None}
