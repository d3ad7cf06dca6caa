"""Roll an agent out on an environment and stream trajectories to JSONL.

Episodes are planned up front as (task, sample) pairs in a fixed order with a
seed derived from the run seed, so a rerun with ``resume=True`` skips exactly
the episodes already in the file and plays the rest as the first run would
have. What must not happen here: scoring (the env scores), or keeping
episodes only in memory (each is stored as soon as it ends).
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from .errors import TraceGymError
from .store import TrajectoryStore
from .trajectory import Trajectory, episode_id


@dataclass(frozen=True)
class Episode:
    """One planned episode."""

    task_id: str | None
    sample: int
    seed: int


@dataclass
class RolloutSummary:
    env_id: str
    agent: str
    episodes: int
    successes: int
    mean_reward: float
    pass_at_1: float
    pass_hat_k: dict[int, float]
    wall_s: float
    resumed: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    out: str | None = None
    by_termination: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def episode_seed(run_seed: int, task_id: str | None, sample: int) -> int:
    """A seed per episode that depends on its identity, not on run order."""
    return zlib.crc32(f"{run_seed}|{task_id}|{sample}".encode()) & 0x7FFFFFFF


def plan_episodes(task_ids: Iterable[str | None], samples: int, run_seed: int) -> list[Episode]:
    if samples < 1:
        raise TraceGymError(f"samples must be at least 1, got {samples}")
    return [Episode(tid, k, episode_seed(run_seed, tid, k)) for tid in task_ids for k in range(samples)]


def run_episode(env: Any, agent: Any, env_id: str, episode: Episode) -> Trajectory:
    """Play one episode; the env's transcript becomes the trajectory record."""
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    options = {"task_id": episode.task_id} if episode.task_id is not None else None
    observation, info = env.reset(seed=episode.seed, options=options)
    info = {**info, "episode_seed": episode.seed}
    env_s = time.perf_counter() - t0
    agent_s = 0.0
    agent.reset(observation, info, env)
    reward, terminated, truncated, step_info = 0.0, False, False, {}
    while not (terminated or truncated):
        a0 = time.perf_counter()
        action = agent.act(observation)
        a1 = time.perf_counter()
        observation, reward, terminated, truncated, step_info = env.step(action)
        agent_s += a1 - a0
        env_s += time.perf_counter() - a1
    core = env.unwrapped
    usage = agent.usage() if hasattr(agent, "usage") else {}
    return Trajectory(
        episode_id=episode_id(env_id, info.get("task_id"), episode.sample, episode.seed),
        env_id=env_id,
        task_id=info.get("task_id"),
        seed=episode.seed,
        sample=episode.sample,
        agent=agent.name,
        model=getattr(agent, "model", None),
        adapter=getattr(agent, "adapter", None),
        messages=list(core.messages),
        reward=float(reward),
        reward_info=step_info.get("reward_info") or {},
        terminated=bool(terminated),
        truncated=bool(truncated),
        termination_reason=core.termination_reason,
        steps=core.steps,
        started_at=started.isoformat(),
        wall_s=time.perf_counter() - t0,
        agent_s=agent_s,
        env_s=env_s,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
    )


def rollout(
    env_id: str,
    agent_factory: Callable[[], Any],
    out: str | Path,
    *,
    split: str | None = None,
    task_ids: list[str] | None = None,
    limit: int | None = None,
    samples: int = 1,
    seed: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    progress: bool | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> RolloutSummary:
    """Roll ``agent_factory()`` out over a target's tasks (or seeds) into ``out``.

    ``split`` picks the target's task split; ``task_ids`` names tasks
    explicitly; ``limit`` keeps the first N tasks. ``progress=None`` shows a
    bar only on a terminal.
    """
    from tqdm.auto import tqdm

    from .registry import make

    store = TrajectoryStore(out, resume=resume, overwrite=overwrite)
    kwargs = dict(env_kwargs or {})
    if split is not None:
        kwargs["split"] = split
    env = make(env_id, **kwargs)
    try:
        if task_ids is None:
            task_ids = list(getattr(env.unwrapped, "task_ids", None) or [])
            if not task_ids:
                raise TraceGymError(f"{env_id} has no task list; pass task ids or use seeds")
        else:
            for tid in task_ids:
                env.unwrapped.get_task(tid)  # one clear error for an unknown id, before any work
        if limit is not None:
            task_ids = task_ids[:limit]
        plan = plan_episodes(task_ids, samples, seed)
        keys = [episode_id(env_id, ep.task_id, ep.sample, ep.seed) for ep in plan]
        todo = [ep for ep, key in zip(plan, keys) if key not in store]
        resumed = len(plan) - len(todo)
        agent = agent_factory()
        t0 = time.perf_counter()
        bar = tqdm(total=len(plan), initial=resumed, desc=f"{agent.name} on {env_id}", unit="ep", disable=_bar_disabled(progress))
        passed = sum(1 for key in keys if key in store and store.completed[key].success)
        for ep in todo:
            trajectory = run_episode(env, agent, env_id, ep)
            store.append(trajectory)
            passed += trajectory.success
            bar.update(1)
            bar.set_postfix(pass_rate=f"{passed / max(bar.n, 1):.2f}")
            if on_episode:
                on_episode(trajectory)
        bar.close()
        wall = time.perf_counter() - t0
        done = store.completed
        trajectories = [done[key] for key in keys]
    finally:
        env.close()
        store.close()
    summary = summarize(trajectories, env_id=env_id, agent=agent.name, wall_s=wall)
    summary.resumed = resumed
    summary.out = str(out)
    return summary


def summarize(trajectories: list[Trajectory], *, env_id: str, agent: str, wall_s: float = 0.0) -> RolloutSummary:
    """pass^1, pass^k (all k samples of a task succeed, tau2's estimator), mean reward."""
    n = len(trajectories)
    by_task: dict[str | None, list[bool]] = {}
    terminations: dict[str, int] = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t.success)
        terminations[t.termination_reason or "unknown"] = terminations.get(t.termination_reason or "unknown", 0) + 1
    k_max = min((len(v) for v in by_task.values()), default=0)
    pass_hat = {k: _pass_hat_k(by_task, k) for k in range(1, k_max + 1)}
    prompt = [t.prompt_tokens for t in trajectories if t.prompt_tokens is not None]
    completion = [t.completion_tokens for t in trajectories if t.completion_tokens is not None]
    return RolloutSummary(
        env_id=env_id,
        agent=agent,
        episodes=n,
        successes=sum(t.success for t in trajectories),
        mean_reward=(sum(t.reward for t in trajectories) / n) if n else 0.0,
        pass_at_1=pass_hat.get(1, 0.0),
        pass_hat_k=pass_hat,
        wall_s=wall_s,
        prompt_tokens=sum(prompt) if prompt else None,
        completion_tokens=sum(completion) if completion else None,
        by_termination=terminations,
    )


def _pass_hat_k(by_task: dict[Any, list[bool]], k: int) -> float:
    # tau2's pass^k: for a task with n trials and c successes, C(c, k) / C(n, k).
    values = [math.comb(sum(v), k) / math.comb(len(v), k) for v in by_task.values() if len(v) >= k]
    return sum(values) / len(values) if values else 0.0


def _bar_disabled(progress: bool | None) -> bool | None:
    return None if progress is None else not progress
