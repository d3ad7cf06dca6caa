"""The env pool of a training run: the G x K episodes of an iteration played in
parallel env instances (sandbox workers for synthesized envs), reused across
iterations.

What it guarantees:
- an env whose sandbox worker dies, hangs or breaks the contract mid-episode
  ends that episode (``GuardedEnv``), never the lock-step batch around it;
- the pool replaces that env with a fresh one and plays the episode once more;
  a second failure counts the episode as failed, with the reason, and the run
  goes on;
- no worker lives long enough to meet its lifetime CPU rlimit: each is
  replaced after ``recycle_after`` episodes (the rlimit stays as a backstop to
  the per-call time limit).

It plays episodes with the model layer's lock-step runner
(``trace_gym.rollout.play_batched``); it must not grow a second episode loop,
and it never scores anything (the env does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym

from trace_gym.errors import EnvContractError, TraceGymError
from trace_gym.rollout import play_batched
from trace_gym.sandbox.errors import SandboxError
from trace_gym.trajectory import Message

FAILED_OBSERVATION = "(the environment failed; this episode is void)"


def _env_failures() -> tuple[type[BaseException], ...]:
    return (SandboxError, EnvContractError)


class GuardedEnv(gym.Wrapper):
    """Turns an env failure (a dead or hung sandbox worker, a contract breach) into
    the end of the episode: ``failure`` holds the reason, the episode is truncated
    with reward 0, and the env must be replaced before it is used again."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.failure: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.failure = None
        try:
            return self.env.reset(seed=seed, options=options)
        except _env_failures() as exc:
            self.failure = f"reset: {type(exc).__name__}: {exc}"

            # The agent still asks for one turn; give it an empty, well-formed transcript.
            self.env.unwrapped.messages = [
                Message(role="system", content=""),
                Message(role="user", content=FAILED_OBSERVATION),
            ]
            return FAILED_OBSERVATION, {
                "system_prompt": "",
                "tools": [],
                "task_id": None,
                "env_failure": self.failure,
                "messages": [m.to_openai() for m in self.env.unwrapped.messages],
            }

    def step(self, action: str):
        if self.failure is not None:
            return FAILED_OBSERVATION, 0.0, False, True, {"env_failure": self.failure}
        try:
            return self.env.step(action)
        except _env_failures() as exc:
            self.failure = f"step: {type(exc).__name__}: {exc}"
            return FAILED_OBSERVATION, 0.0, False, True, {"env_failure": self.failure}


@dataclass
class EpisodeOutcome:
    """One planned episode after the pool played it (and maybe replayed it once)."""

    played: Any  # trace_gym.rollout.PlayedEpisode (trajectory + tokens)
    attempts: int
    failure: str | None = None  # set when both attempts failed: the reason of the last one

    @property
    def failed(self) -> bool:
        return self.failure is not None


@dataclass
class PoolStats:
    replaced: int = 0
    recycled: int = 0
    retried: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


class EnvPool:
    """Env instances per env id, made on first need and reused across iterations.

    Args:
        make_env: builds one env instance for an env id (``registry.make`` with the
            run's sandbox settings).
        recycle_after: episodes an instance plays before it is replaced.
    """

    def __init__(
        self, make_env: Callable[[str], gym.Env], *, recycle_after: int = 64, max_episode_s: float | None = None
    ):
        self.make_env = make_env
        self.recycle_after = recycle_after
        self.max_episode_s = max_episode_s
        self.envs: dict[str, list[GuardedEnv]] = {}
        self.uses: dict[int, int] = {}
        self.stats = PoolStats()

    def take(self, env_id: str, count: int) -> list[GuardedEnv]:
        """``count`` instances of ``env_id`` (more are made when the pool has fewer);
        instances past their ``recycle_after`` episodes are replaced first."""
        envs = self.envs.setdefault(env_id, [])
        while len(envs) < count:
            envs.append(GuardedEnv(self.make_env(env_id)))
        for i in range(count):
            if self.uses.get(id(envs[i]), 0) >= self.recycle_after:
                self._replace(env_id, i)
                self.stats.recycled += 1
        return envs[:count]

    def _replace(self, env_id: str, index: int) -> GuardedEnv:
        old = self.envs[env_id][index]
        self.uses.pop(id(old), None)
        try:
            old.close()
        except Exception:  # a dead worker may fail to close; it is gone either way
            pass
        fresh = GuardedEnv(self.make_env(env_id))
        self.envs[env_id][index] = fresh
        return fresh

    def play(
        self,
        env_id: str,
        episodes: list[Any],
        agents: list[Any],
        configure: Callable[[gym.Env, int], None] | None = None,
    ) -> list[EpisodeOutcome]:
        """Play ``episodes`` of ``env_id`` in lock-step, episode ``i`` in instance ``i``
        with ``agents[i]`` (``configure(env, i)`` runs first, e.g. to set a hint).
        A failed episode is replayed once in a fresh instance; the result keeps the
        order of ``episodes``."""
        if len(agents) < len(episodes):
            raise TraceGymError(f"{len(episodes)} episodes need as many agents, got {len(agents)}")
        outcomes: list[EpisodeOutcome | None] = [None] * len(episodes)
        todo = list(range(len(episodes)))
        for attempt in (1, 2):
            envs = self.take(env_id, len(episodes))
            if configure is not None:
                for i in todo:
                    configure(envs[i], i)
            batch_envs = [envs[i] for i in todo]
            # play_batched fills its slots in order, so episode todo[k] runs in batch_envs[k].
            by_episode = {id(episodes[i]): k for k, i in enumerate(todo)}
            for played in play_batched(
                batch_envs,
                [agents[i] for i in todo],
                env_id,
                [episodes[i] for i in todo],
                max_episode_s=self.max_episode_s,
            ):
                k = by_episode[id(played.episode)]
                i, env = todo[k], batch_envs[k]
                self.uses[id(env)] = self.uses.get(id(env), 0) + 1
                outcomes[i] = EpisodeOutcome(played, attempt, env.failure)
            todo = [i for i in todo if outcomes[i].failed]
            if not todo:
                break
            for i in todo:  # never reuse an instance that failed: its worker may be dead or hung
                self._replace(env_id, i)
                self.stats.replaced += 1
            if attempt == 1:
                self.stats.retried += len(todo)
        for i in todo:
            self.stats.failed += 1
            self.stats.failures.append(outcomes[i].failure)
        return [o for o in outcomes if o is not None]

    def close(self) -> None:
        for envs in self.envs.values():
            for env in envs:
                try:
                    env.close()
                except Exception:
                    pass
        self.envs.clear()
