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
    aborted: int = 0
    abort_example: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def episode_seed(run_seed: int, task_id: str | None, sample: int) -> int:
    """A seed per episode that depends on its identity, not on run order."""
    return zlib.crc32(f"{run_seed}|{task_id}|{sample}".encode()) & 0x7FFFFFFF


def plan_episodes(task_ids: Iterable[str | None], samples: int, run_seed: int) -> list[Episode]:
    if samples < 1:
        raise TraceGymError(f"samples must be at least 1, got {samples}")
    return [Episode(tid, k, episode_seed(run_seed, tid, k)) for tid in task_ids for k in range(samples)]


@dataclass
class _Running:
    """One episode in flight: what becomes its trajectory when it ends."""

    episode: Episode
    started: datetime
    t0: float
    info: dict[str, Any]
    observation: str
    agent_s: float = 0.0
    env_s: float = 0.0


def _start(env: Any, agent: Any, episode: Episode) -> _Running:
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    options = {"task_id": episode.task_id} if episode.task_id is not None else None
    observation, info = env.reset(seed=episode.seed, options=options)
    info = {**info, "episode_seed": episode.seed}
    agent.reset(observation, info, env)
    return _Running(episode, started, t0, info, observation, env_s=time.perf_counter() - t0)


def _finish(env: Any, agent: Any, env_id: str, run: _Running, reward: float, terminated: bool, truncated: bool,
            step_info: dict[str, Any], error: str | None = None) -> Trajectory:
    core = env.unwrapped
    usage = agent.usage() if hasattr(agent, "usage") else {}
    return Trajectory(
        episode_id=episode_id(env_id, run.info.get("task_id"), run.episode.sample, run.episode.seed),
        env_id=env_id,
        task_id=run.info.get("task_id"),
        seed=run.episode.seed,
        sample=run.episode.sample,
        agent=agent.name,
        model=getattr(agent, "model", None),
        adapter=getattr(agent, "adapter", None),
        messages=list(core.messages),
        reward=float(reward),
        reward_info=step_info.get("reward_info") or {},
        terminated=bool(terminated),
        truncated=bool(truncated),
        termination_reason=core.termination_reason if error is None else "agent_error",
        steps=core.steps,
        started_at=run.started.isoformat(),
        wall_s=time.perf_counter() - run.t0,
        agent_s=run.agent_s,
        env_s=run.env_s,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        error=error,
        agent_info=agent.info() if hasattr(agent, "info") else {},
    )


def run_episode(env: Any, agent: Any, env_id: str, episode: Episode) -> Trajectory:
    """Play one episode; the env's transcript becomes the trajectory record.

    An agent that gives up (``AgentGaveUp``: its model never produced a valid
    action) ends the episode with reward 0 and the reason in ``error``.
    """
    run = _start(env, agent, episode)
    reward, terminated, truncated, step_info = 0.0, False, False, {}
    while not (terminated or truncated):
        a0 = time.perf_counter()
        try:
            action = agent.act(run.observation)
        except TraceGymError as exc:
            if type(exc).__name__ != "AgentGaveUp":
                raise
            return _finish(env, agent, env_id, run, 0.0, False, True, {}, error=str(exc))
        a1 = time.perf_counter()
        run.observation, reward, terminated, truncated, step_info = env.step(action)
        run.agent_s += a1 - a0
        run.env_s += time.perf_counter() - a1
    return _finish(env, agent, env_id, run, reward, terminated, truncated, step_info)


def run_batched(envs: list[Any], agents: list[Any], env_id: str, episodes: list[Episode], backend: Any):
    """Play episodes in lock-step, one batched generation per turn across all
    episodes in flight (``LocalHF`` batches on CPU and GPU). Yields trajectories
    as episodes end."""
    from collections import deque

    queue = deque(episodes)
    slots: list[_Running | None] = [None] * len(envs)
    while queue or any(slots):
        for i, slot in enumerate(slots):
            if slot is None and queue:
                slots[i] = _start(envs[i], agents[i], queue.popleft())
        active = [i for i, slot in enumerate(slots) if slot is not None]
        if not active:
            break
        for i in active:
            agents[i].observe(slots[i].observation)
        a0 = time.perf_counter()
        kwargs = agents[active[0]].generation_kwargs()
        completions = backend.generate([agents[i].request() for i in active], **kwargs)
        share = (time.perf_counter() - a0) / len(active)
        for i, completion in zip(active, completions):
            run = slots[i]
            run.agent_s += share
            try:
                action = agents[i].receive(completion)
            except TraceGymError as exc:
                if type(exc).__name__ != "AgentGaveUp":
                    raise
                slots[i] = None
                yield _finish(envs[i], agents[i], env_id, run, 0.0, False, True, {}, error=str(exc))
                continue
            e0 = time.perf_counter()
            run.observation, reward, terminated, truncated, step_info = envs[i].step(action)
            run.env_s += time.perf_counter() - e0
            if terminated or truncated:
                slots[i] = None
                yield _finish(envs[i], agents[i], env_id, run, reward, terminated, truncated, step_info)


def rollout(
    env_id: str,
    agent: str,
    out: str | Path,
    *,
    agent_kwargs: dict[str, Any] | None = None,
    split: str | None = None,
    task_ids: list[str] | None = None,
    limit: int | None = None,
    samples: int = 1,
    seed: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    env_kwargs: dict[str, Any] | None = None,
    executor: str = "local",
    workers: int = 1,
    batch: int = 1,
    progress: bool | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> RolloutSummary:
    """Roll agent ``agent`` (a name for ``make_agent``) out over a target's tasks into ``out``.

    ``split`` picks the target's task split; ``task_ids`` names tasks
    explicitly; ``limit`` keeps the first N tasks; ``samples`` plays each task
    K times (pass^k). Executors: ``local`` runs episodes one by one, in
    ``workers`` threads (API models), or ``batch`` at a time in lock-step with
    one batched generation per turn (local models); ``ray`` fans episodes out
    over a Ray cluster (``ray.init()`` must reach one, or a local one starts).
    Finished episodes are appended as they end; ``resume`` skips those already
    in ``out``. ``progress=None`` shows a bar only on a terminal.
    """
    from tqdm.auto import tqdm

    from .registry import make

    if executor not in ("local", "ray"):
        raise TraceGymError(f"unknown executor '{executor}'; choose local or ray")
    agent_kwargs = {"seed": seed, **(agent_kwargs or {})}
    kwargs = dict(env_kwargs or {})
    if split is not None:
        kwargs["split"] = split
    store = TrajectoryStore(out, resume=resume, overwrite=overwrite)
    env = None
    try:
        env = make(env_id, **kwargs)
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
        t0 = time.perf_counter()
        bar = tqdm(total=len(plan), initial=resumed, desc=f"{agent} on {env_id}", unit="ep", disable=_bar_disabled(progress))
        passed = sum(1 for key in keys if key in store and store.completed[key].success)

        def record(trajectory: Trajectory) -> None:
            nonlocal passed
            store.append(trajectory)
            passed += trajectory.success
            bar.update(1)
            bar.set_postfix(pass_rate=f"{passed / max(bar.n, 1):.2f}")
            if on_episode:
                on_episode(trajectory)

        if executor == "ray":
            env.close()
            env = None
            for trajectory in _run_ray(env_id, kwargs, agent, agent_kwargs, todo, workers):
                record(trajectory)
        elif batch > 1:
            _run_local_batched(env, env_id, kwargs, agent, agent_kwargs, todo, batch, record)
        elif workers > 1:
            _run_threads(env_id, kwargs, agent, agent_kwargs, todo, workers, record)
        else:
            from trace_gym.agents import make_agent

            the_agent = make_agent(agent, **agent_kwargs)
            for ep in todo:
                record(run_episode(env, the_agent, env_id, ep))
        bar.close()
        wall = time.perf_counter() - t0
        done = store.completed
        trajectories = [done[key] for key in keys]
    finally:
        if env is not None:
            env.close()
        store.close()
    summary = summarize(trajectories, env_id=env_id, agent=agent, wall_s=wall)
    summary.resumed = resumed
    summary.out = str(out)
    return summary


def _run_local_batched(env, env_id, env_kwargs, agent, agent_kwargs, todo, batch, record) -> None:
    from trace_gym.agents import make_agent
    from trace_gym.llm import EMBEDDED_DEFAULT, make_backend

    from .registry import make

    if agent != "llm":
        raise TraceGymError("--batch needs --agent llm (it batches model generation across episodes)")
    model = agent_kwargs.get("model") or EMBEDDED_DEFAULT
    backend = make_backend(model) if isinstance(model, str) else model
    size = min(batch, max(len(todo), 1))
    envs = [env] + [make(env_id, **env_kwargs) for _ in range(size - 1)]
    agents = [make_agent(agent, **{**agent_kwargs, "model": backend}) for _ in range(size)]
    try:
        for trajectory in run_batched(envs, agents, env_id, todo, backend):
            record(trajectory)
    finally:
        for extra in envs[1:]:
            extra.close()


def _run_threads(env_id, env_kwargs, agent, agent_kwargs, todo, workers, record) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from trace_gym.agents import make_agent

    from .registry import make

    local = threading.local()
    made: list[Any] = []

    def play(ep: Episode) -> Trajectory:
        if not hasattr(local, "env"):
            local.env = make(env_id, **env_kwargs)
            local.agent = make_agent(agent, **agent_kwargs)
            made.append(local.env)
        return run_episode(local.env, local.agent, env_id, ep)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for future in as_completed([pool.submit(play, ep) for ep in todo]):
                record(future.result())
    finally:
        for env in made:
            env.close()


def _ray_chunk(env_id: str, env_kwargs: dict[str, Any], agent: str, agent_kwargs: dict[str, Any], episodes: list[Episode]) -> list[str]:
    """Runs on a Ray worker: its own env and agent; trajectories as JSON text."""
    import trace_gym  # noqa: F401  (registers the envs in the worker)
    from trace_gym.agents import make_agent

    from .registry import make

    env = make(env_id, **env_kwargs)
    try:
        the_agent = make_agent(agent, **agent_kwargs)
        return [run_episode(env, the_agent, env_id, ep).model_dump_json() for ep in episodes]
    finally:
        env.close()


def _run_ray(env_id, env_kwargs, agent, agent_kwargs, todo, workers):
    try:
        import ray
    except ImportError:
        raise TraceGymError("--executor ray needs ray: pip install 'trace-gym[ray]'") from None
    if not ray.is_initialized():
        ray.init(num_cpus=max(workers, 1), include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    remote = ray.remote(_ray_chunk)
    chunk = max(1, len(todo) // (max(workers, 1) * 4))
    pending = [remote.remote(env_id, env_kwargs, agent, agent_kwargs, todo[i:i + chunk]) for i in range(0, len(todo), chunk)]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for text in ray.get(ready[0]):
            yield Trajectory.model_validate_json(text)


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
        aborted=sum(1 for t in trajectories if t.error),
        abort_example=next((t.error for t in trajectories if t.error), None),
    )


def _pass_hat_k(by_task: dict[Any, list[bool]], k: int) -> float:
    # tau2's pass^k: for a task with n trials and c successes, C(c, k) / C(n, k).
    values = [math.comb(sum(v), k) / math.comb(len(v), k) for v in by_task.values() if len(v) >= k]
    return sum(values) / len(values) if values else 0.0


def _bar_disabled(progress: bool | None) -> bool | None:
    return None if progress is None else not progress
