"""OracleAgent: plays the environment's own solution (a target's gold actions,
a synthesized env's ``oracle()``). Privileged: it reads the env, so its scores
measure the env, never an agent."""

from __future__ import annotations

import random
from typing import Any

from trace_gym.errors import TraceGymError
from trace_gym.seeding import derive_seed


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
        solutions = getattr(env.unwrapped, "oracle_actions", None)
        actions = solutions() if callable(solutions) else None
        if actions is None:
            raise TraceGymError(
                f"{env.spec.id if env.spec else type(env.unwrapped).__name__} has no oracle: the oracle agent "
                "plays a target's oracle_actions() (docs/targets.md)"
            )
        self._script = list(actions)
        self._stop = info.get("stop_token", self._stop)

    def act(self, observation: str) -> str:
        return self._script.pop(0) if self._script else self._stop

    def usage(self) -> dict[str, int | None]:
        return {"prompt_tokens": None, "completion_tokens": None}


class PartialOracleAgent(OracleAgent):
    """Plays a seeded prefix of the env's solution, then gives up.

    The validator uses it to see whether the reward is graded: partial work
    should earn partial credit, which GRPO needs to tell rollouts apart.
    """

    name = "partial_oracle"

    def __init__(self, seed: int = 0, **_: Any):
        super().__init__()
        self._seed = seed

    def reset(self, observation: str, info: dict[str, Any], env: Any = None) -> None:
        super().reset(observation, info, env)
        rng = random.Random(derive_seed("partial", self._seed, info.get("episode_seed")))
        tool_calls = [a for a in self._script if a.lstrip().startswith(("<tool_call>", "{"))]
        keep = rng.randint(0, max(len(tool_calls) - 1, 0))
        self._script = tool_calls[:keep] + ["I'm sorry, I could not finish this."]
