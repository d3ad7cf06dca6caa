"""Roll an agent out on an environment and stream trajectories to JSONL.

Episodes are planned up front as (task, sample) pairs in a fixed order with a
seed derived from the run seed, so a rerun with ``resume=True`` skips exactly
the episodes already in the file and plays the rest as the first run would
have (token for token in float32; a local model in bf16 rounds by batch,
and its file records the dtype so that a resume never mixes the two). What
must not happen here: scoring (the env scores), or keeping episodes only in
memory (each is stored as soon as it ends).

An agent plays an episode in one place, ``play_batched`` (``run_episode`` is
its one-episode case): rollout, training, validation and evaluation all come
through it. Three loops step an env with no agent, on purpose: ``replay_oracle``
here (the env's own reference actions, each step's info kept, which a
trajectory does not hold: freezing result shapes, the synthesis prompt's sample
results, the fidelity check), and the termination and determinism checks of
``validation/checks/episodes.py``, which talk to the sandbox worker itself (a
step after the end, every raw answer compared across two workers). Other
``step`` calls are single probes (validation's robustness and fidelity probes,
``freeze``'s refusal text), or serve an env to a loop that is not ours (TRL's
``environment_factory``, the OpenEnv server).
"""

from __future__ import annotations

import importlib.util
import math
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .actions import ActionKind, ParsedAction, parse_action
from trace_gym.agents import make_agent
from .agents.base import Agent, LockStepAgent, Meters, Observes, Reports
from .env import TextEnv, check_target_reset, check_target_reward, opening_messages, turn_messages
from .errors import AgentGaveUp, OtherRunError, TraceGymError
from trace_gym.llm import EMBEDDED_DEFAULT, make_backend
from trace_gym.llm.base import LoadsAdapters
from trace_gym.llm.local import LocalHF
from .llm.precision import engine_dtype, local_device, recorded_dtype
from .llm.registry import is_chat_endpoint, is_local
from .llm.local.strict_calls import strict_from_env
from .registry import EnvKind, add_registry_dir, get_entry, make, registry_dirs
from .seeding import derive_seed
from .store import TrajectoryStore
from .trajectory import Message, Trajectory, episode_id


@dataclass(frozen=True)
class Episode:
    """One planned episode."""

    task_id: str | None
    sample: int
    seed: int
    env_seed: int | None = None
    """Envs without tasks (synthesized envs): the seed ``reset`` gets, which picks
    the scenario; ``seed`` then seeds the agent, so samples of one scenario differ."""

    @property
    def reset_seed(self) -> int:
        return self.env_seed if self.env_seed is not None else self.seed


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
    episode_ids: list[str] = field(default_factory=list, repr=False)
    """The episodes this call planned (a file may hold others, from other calls)."""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "episode_ids"}


def episode_seed(run_seed: int, task_id: str | None, sample: int) -> int:
    """A seed per episode that depends on its identity, not on run order."""
    return derive_seed(run_seed, task_id, sample)


def plan_episodes(task_ids: Iterable[str | None], samples: int, run_seed: int) -> list[Episode]:
    if samples < 1:
        raise TraceGymError(f"samples must be at least 1, got {samples}")
    return [Episode(tid, k, episode_seed(run_seed, tid, k)) for tid in task_ids for k in range(samples)]


def plan_seeded_episodes(env_seeds: Iterable[int], samples: int, run_seed: int) -> list[Episode]:
    """Episodes of an env without tasks: one scenario per env seed, ``samples`` plays of each."""
    if samples < 1:
        raise TraceGymError(f"samples must be at least 1, got {samples}")
    return [
        Episode(None, k, episode_seed(run_seed, f"seed-{s}", k), env_seed=s) for s in env_seeds for k in range(samples)
    ]


def seed_split(entry: Any, split: str | None, seeds: int | None) -> list[int]:
    """The env seeds to roll a synthesized env out on: ``seeds`` N gives 0..N-1;
    ``split`` names a range of its manifest's ``[splits]`` table (``test = [1000, 1100]``:
    seeds 1000..1099, end excluded)."""
    splits = entry.manifest.get("splits", {})
    if seeds is not None and split is not None:
        raise TraceGymError("give --seeds or --split, not both")
    if seeds is not None:
        if seeds < 1:
            raise TraceGymError(f"--seeds must be at least 1, got {seeds}")
        return list(range(seeds))
    known = ", ".join(sorted(splits)) or "none"
    if split is None:
        raise TraceGymError(
            f"{entry.id} has no task list: pass --seeds N, or --split NAME of its manifest's [splits] (it names: {known})"
        )
    bounds = splits.get(split)
    if bounds is None:
        raise TraceGymError(f"{entry.id} has no split '{split}'; its manifest's [splits] names: {known}")
    if not (
        isinstance(bounds, list)
        and len(bounds) == 2
        and all(isinstance(b, int) and b >= 0 for b in bounds)
        and bounds[0] < bounds[1]
    ):
        raise TraceGymError(
            f"{entry.path}/manifest.toml: [splits] {split} must be [first_seed, end_seed], got {bounds!r}"
        )
    return list(range(bounds[0], bounds[1]))


def run_settings(env_id: str, agent: str, agent_kwargs: dict[str, Any], env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What makes two rollouts the same run, recorded in the trajectory file's header.

    The agent's options (model, adapter, temperature, deficits, run seed...)
    and the env's (user simulator, step limit) count; which tasks are played
    does not (a resumed run may add tasks), nor do endpoints and keys."""

    def plain(value: Any) -> Any:
        if value is None or isinstance(value, (str, int, float, bool, list, dict)):
            return value
        return getattr(value, "name", None) or type(value).__name__  # a backend object: its model name

    def options(kwargs: dict[str, Any]) -> dict[str, Any]:
        return {k: plain(v) for k, v in kwargs.items() if k != "split" and "key" not in k and "base_url" not in k}

    agent_options = {**options(agent_kwargs), **local_settings(agent, agent_kwargs)}
    return {
        "env_id": env_id,
        "agent": agent,
        "agent_options": agent_options,
        "env_options": options(env_kwargs),
    }


def local_settings(agent: str, agent_kwargs: dict[str, Any]) -> dict[str, Any]:
    """How a local model agent decodes, where a file must record it, so that a resumed
    run does not mix two ways: its dtype where it is not float32 on a CPU
    (``recorded_dtype``; in bf16 a batch samples other tokens than float32 does), and
    ``strict_tools`` where its tool calls are held to their schemas (True, or ``"ids"``
    with grounded ids: ``strict_calls.py``)."""
    if agent not in MODEL_AGENTS:
        return {}
    model = agent_kwargs.get("model") or EMBEDDED_DEFAULT
    if isinstance(model, str):
        if not is_local(model):
            return {}
        strict = strict_from_env()
        try:
            device = local_device()
            dtype = recorded_dtype(engine_dtype(None, device), device)
        except ImportError:
            dtype = None  # no torch: the model's own loading says so, in one line
    else:
        strict = getattr(model, "strict_tools", False)
        dtype = getattr(model, "dtype", None)
        dtype = recorded_dtype(dtype, str(getattr(model, "device", "cpu"))) if isinstance(dtype, str) else None
    settings: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
    return {**settings, "strict_tools": strict} if strict else settings


@dataclass
class _Running:
    """One episode in flight: what becomes its trajectory when it ends."""

    episode: Episode
    started: datetime
    t0: float
    info: dict[str, Any]
    observation: str
    transcript: list[dict[str, Any]] = field(default_factory=list)
    """The conversation as the env handed it out (``info["messages"]``), for an env
    that keeps no transcript of its own."""
    steps: int = 0
    agent_s: float = 0.0
    env_s: float = 0.0

    def stepped(self, agent: Any, action: str, observation: str, info: dict[str, Any]) -> None:
        """Record one step's result, and tell the agent (``observe``) if it listens."""
        self.observation = observation
        self.steps += 1
        self.transcript.extend(turn_messages(action, observation, info))
        if isinstance(agent, Observes):
            agent.observe(observation, info)


def _start(env: Any, agent: Any, episode: Episode) -> _Running:
    started = datetime.now(timezone.utc)
    t0 = time.perf_counter()
    options = {"task_id": episode.task_id} if episode.task_id is not None else None
    observation, info = env.reset(seed=episode.reset_seed, options=options)
    info = {**info, "episode_seed": episode.seed, "episode_sample": episode.sample}

    check_target_reset(env.unwrapped, observation, info)
    agent.reset(observation, info, env)

    return _Running(
        episode, started, t0, info, observation, opening_messages(observation, info), env_s=time.perf_counter() - t0
    )


def _finish(
    env: Any,
    agent: Any,
    env_id: str,
    run: _Running,
    reward: float,
    terminated: bool,
    truncated: bool,
    step_info: dict[str, Any],
    error: str | None = None,
) -> Trajectory:
    core = env.unwrapped
    own = isinstance(core, TextEnv)  # a trace-gym env keeps the richer transcript (raw text, errors, user-side calls)
    if error is not None and own:  # the env, not the runner, scores an abandoned episode (partial credit, or τ²'s 0)
        reward = core.end("agent_error")
        step_info = {**step_info, "reward_info": core.reward_info}
    usage = agent.usage() if isinstance(agent, Meters) else {}
    return Trajectory(
        episode_id=episode_id(env_id, run.episode.task_id, run.episode.sample, run.episode.reset_seed),
        env_id=env_id,
        task_id=run.info.get("task_id"),
        seed=run.episode.reset_seed,
        sample=run.episode.sample,
        agent=agent.name,
        model=agent.model,
        adapter=agent.adapter,
        messages=list(core.messages) if own else transcript_messages(run.transcript),
        reward=check_target_reward(core, reward),
        reward_info=step_info.get("reward_info") or {},
        terminated=bool(terminated),
        truncated=bool(truncated),
        termination_reason="agent_error"
        if error is not None
        else core.termination_reason
        if own
        else step_info.get("termination_reason") or ("done" if terminated else "max_steps" if truncated else None),
        steps=core.steps if own else run.steps,
        started_at=run.started.isoformat(),
        wall_s=time.perf_counter() - run.t0,
        agent_s=run.agent_s,
        env_s=run.env_s,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        error=error,
        agent_info=agent.info() if isinstance(agent, Reports) else {},
    )


def transcript_messages(transcript: list[dict[str, Any]]) -> list[Message]:
    """The record of an env that keeps no transcript: its OpenAI messages, with an agent
    turn that is neither a call nor a message (it did not parse) marked as an error, as a
    trace-gym env marks it (what ``well_formed_calls`` reads)."""
    out = []
    for m in transcript:
        message = Message.from_openai(m)
        if (
            message.role == "assistant"
            and not message.tool_calls
            and parse_action(message.content or "").kind == ActionKind.MALFORMED
        ):
            message.error = True
        out.append(message)
    return out


def run_episode(env: Any, agent: Any, env_id: str, episode: Episode) -> Trajectory:
    """Play one episode; the env's transcript becomes the trajectory record
    (``play_batched``'s one-episode case).

    An agent that gives up (``AgentGaveUp``: its model never produced a valid
    action) ends the episode, truncated, with the reason in ``error``: a
    trace-gym env scores what was done so far (``TextEnv.end``: a synthesized
    env's partial credit, τ²'s 0 for an agent error); another env, 0.
    """
    [played] = play_batched([env], [agent], env_id, [episode])
    return played.trajectory


def replay_oracle(env: Any, *, limit: int | None = None) -> Iterator[tuple[ParsedAction, str, dict[str, Any]]]:
    """Step the episode ``env`` was just reset to through its oracle's actions (the
    env's reference solution), yielding each action parsed, the observation and the
    step's info; it stops where the episode ends, after ``limit`` actions, or where
    the caller stops reading. Freezing a target's result shapes, the synthesis
    prompt's sample results and validation's fidelity check all read it."""
    for action in (env.unwrapped.oracle_actions() or [])[:limit]:
        observation, _, terminated, truncated, info = env.step(action)
        yield parse_action(action), observation, info
        if terminated or truncated:
            return


@dataclass
class PlayedEpisode:
    """A finished episode: its trajectory (text) and, from a token-level model,
    its tokens (what a trainer updates on)."""

    trajectory: Trajectory
    tokens: Any = None  # trace_gym.llm.TokenEpisode
    episode: Episode | None = None


ONE_BACKEND = (
    "the model agents of one lock-step batch must share one backend (one model object): "
    "play agents of different models with batch 1, or in rollouts of their own"
)


def play_batched(
    envs: list[Any],
    agents: list[Any],
    env_id: str,
    episodes: list[Episode],
    max_episode_s: float | None = None,
    agent_for: Callable[[int, Episode], Any] | None = None,
):
    """The episode loop: every rollout, training group, validation and evaluation
    episode is played here. Episodes run in lock-step, ``len(envs)`` at a time,
    ``envs[i]`` played by ``agents[i]``, or, given ``agent_for`` (then ``agents`` is
    not read), by ``agent_for(i, episode)``, made as the episode starts (several
    agents over one batch: evaluation's methods). Agents that split a turn in two
    (``agents.base.LockStepAgent``: a model's request, then its answer) share one
    batched generation per turn across the episodes in flight, each request under
    its own settings (seed, temperature, adapter), through their one backend
    (``LocalHF`` batches on CPU and GPU; a second backend is refused); any other
    agent (the oracle, a scripted policy) acts on its own. Yields
    ``PlayedEpisode``s as episodes end. An episode whose wall time passes
    ``max_episode_s`` ends after its current step, truncated, with the reason in
    its ``error``."""
    agents = list(agents) if agent_for is None else [None] * len(envs)
    if not agents:
        return
    lock_step = [False] * len(agents)
    backend = None  # the lock-step agents' one backend, from the first that starts an episode
    queue = deque(episodes)
    slots: list[_Running | None] = [None] * len(envs)

    def start(i: int, episode: Episode) -> _Running:
        nonlocal backend
        if agent_for is not None:
            agents[i] = agent_for(i, episode)
        if not isinstance(agents[i], Agent):  # refused before its episode is played, not after
            raise TraceGymError(
                f"{type(agents[i]).__name__} is not an agent: it needs name, model and adapter attributes "
                "(None where it has no model) and reset() and act() (agents.base.Agent)"
            )
        lock_step[i] = isinstance(agents[i], LockStepAgent)
        if lock_step[i]:
            backend = agents[i].backend if backend is None else backend
            if agents[i].backend is not backend:
                raise TraceGymError(ONE_BACKEND)
        return _start(envs[i], agents[i], episode)

    def done(i: int, trajectory: Trajectory) -> PlayedEpisode:
        played = PlayedEpisode(trajectory, agents[i].tokens if lock_step[i] else None, slots[i].episode)
        slots[i] = None
        if lock_step[i]:
            agents[i].end_episode()
        return played

    def gave_up(i: int, exc: AgentGaveUp) -> PlayedEpisode:
        return done(i, _finish(envs[i], agents[i], env_id, slots[i], 0.0, False, True, {}, error=str(exc)))

    while queue or any(slots):
        for i, slot in enumerate(slots):
            if slot is None and queue:
                slots[i] = start(i, queue.popleft())
        active = [i for i, slot in enumerate(slots) if slot is not None]
        if not active:
            break
        actions: dict[int, str] = {}
        for i in [i for i in active if not lock_step[i]]:
            a0 = time.perf_counter()
            try:
                actions[i] = agents[i].act(slots[i].observation)
            except AgentGaveUp as exc:
                yield gave_up(i, exc)
                continue
            slots[i].agent_s += time.perf_counter() - a0
        requests = {}
        for i in [i for i in active if lock_step[i]]:
            try:
                requests[i] = agents[i].request()
            except AgentGaveUp as exc:  # e.g. a prompt that would pass the model's context: ends, truncated
                yield gave_up(i, exc)
        if requests:
            a0 = time.perf_counter()
            completions = backend.complete(list(requests.values()))
            share = (time.perf_counter() - a0) / len(requests)
            for i, completion in zip(requests, completions):
                slots[i].agent_s += share
                try:
                    actions[i] = agents[i].receive(completion)
                except AgentGaveUp as exc:
                    yield gave_up(i, exc)
        for i in sorted(actions):
            run = slots[i]
            e0 = time.perf_counter()
            observation, reward, terminated, truncated, step_info = envs[i].step(actions[i])
            run.stepped(agents[i], actions[i], observation, step_info)
            run.env_s += time.perf_counter() - e0
            if terminated or truncated:
                yield done(i, _finish(envs[i], agents[i], env_id, run, reward, terminated, truncated, step_info))
            elif max_episode_s is not None and time.perf_counter() - run.t0 > max_episode_s:
                yield done(
                    i,
                    _finish(
                        envs[i],
                        agents[i],
                        env_id,
                        run,
                        0.0,
                        False,
                        True,
                        step_info,
                        error=f"the episode ran past max_episode_s ({max_episode_s:g} s); ended here, truncated",
                    ),
                )


def play_episodes(
    policy: Any,
    env_id: str,
    episodes: list[Episode] | list[int],
    *,
    tokenizer: Any = None,
    batch: int = 8,
    adapter: str | None = None,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    env_kwargs: dict[str, Any] | None = None,
    run_seed: int = 0,
) -> list[PlayedEpisode]:
    """Play episodes of a registry env (a target in-process, a synthesized env in
    its sandbox) with a local model, in lock-step batches, and return them with
    their tokens: what GRPO's ``rollout_func`` needs
    (``played.tokens.for_grpo()``).

    ``policy`` is a model spec (``hf:<path>``, the embedded name), a ``LocalHF``,
    or a transformers/peft model object in memory with its ``tokenizer`` (the
    policy a trainer is updating: cached keys and values are cleared at the
    start of each call, since the weights may have changed since the last).
    ``episodes`` are planned episodes or plain env seeds (synthesized envs; a
    seed given G times is played G times, with different sampling seeds, derived
    from ``run_seed`` as ``plan_seeded_episodes`` derives them).
    """
    if isinstance(policy, str):
        backend = make_backend(policy)
    elif isinstance(policy, LocalHF):
        backend = policy
    else:
        if tokenizer is None:
            raise TraceGymError("play_episodes with a model object needs its tokenizer")
        backend = LocalHF.from_model(policy, tokenizer)
    if not backend.token_level:
        raise TraceGymError(f"{backend.name} is not a local token-level model; play_episodes needs one")
    if not isinstance(policy, (str, LocalHF)):
        backend.clear_cache()
    planned: list[Episode] = []
    repeats: dict[int, int] = {}
    for ep in episodes:  # a seed given G times is G samples of one scenario (a GRPO group)
        if not isinstance(ep, Episode):
            env_seed = int(ep)
            repeats[env_seed] = repeats.get(env_seed, -1) + 1
            ep = Episode(
                None,
                repeats[env_seed],
                episode_seed(run_seed, f"seed-{env_seed}", repeats[env_seed]),
                env_seed=env_seed,
            )
        planned.append(ep)
    size = max(1, min(batch, len(planned)))
    envs = [make(env_id, **(env_kwargs or {})) for _ in range(size)]
    try:
        agents = [
            make_agent("llm", model=backend, adapter=adapter, temperature=temperature, max_new_tokens=max_new_tokens)
            for _ in range(size)
        ]
        order = {id(ep): k for k, ep in enumerate(planned)}
        played = sorted(play_batched(envs, agents, env_id, planned), key=lambda p: order[id(p.episode)])
    finally:
        for env in envs:
            env.close()
    return played


def rollout(
    env_id: str,
    agent: str,
    out: str | Path,
    *,
    agent_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> RolloutSummary:
    """Roll agent ``agent`` (a name for ``make_agent``) out over a target's tasks into ``out``:
    ``rollout_players`` with one player, whose keywords ``options`` are.

    ``split`` picks the target's task split; ``task_ids`` names tasks
    explicitly; ``limit`` keeps the first N tasks; ``samples`` plays each task
    K times (pass^k). Executors: ``local`` runs episodes one by one, in
    ``workers`` threads (API models), or ``batch`` at a time in lock-step with
    one batched generation per turn (local models); ``ray`` fans episodes out
    over a Ray cluster (``ray.init()`` must reach one, or a local one starts).
    Envs without tasks (synthesized envs) are played by seed: ``seeds`` N
    (0..N-1) or ``split``, a seed range its manifest names.
    Finished episodes are appended as they end; ``resume`` skips those already
    in ``out`` and refuses a file made with other settings (``run_settings``);
    ``retry_given_up`` also plays again the episodes the agent gave up;
    ``set_aside(path)`` moves away a file of other settings instead (see ``rollout_players``).
    ``progress=None`` shows a bar only on a terminal.
    """
    [summary] = rollout_players(env_id, [Player(agent, out, agent_kwargs or {})], **options)
    return summary


@dataclass
class Player:
    """One agent of ``rollout_players``: a name for ``make_agent``, its options and its trajectory file."""

    agent: str
    out: str | Path
    agent_kwargs: dict[str, Any] = field(default_factory=dict)


def rollout_players(
    env_id: str,
    players: list[Player],
    *,
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
    seeds: int | None = None,
    retry_given_up: bool = False,
    set_aside: Callable[[Path], None] | None = None,
) -> list[RolloutSummary]:
    """``rollout`` for several agents over the same episodes (evaluation's methods),
    each into its own file; one summary per player, in order. With the local
    executor and ``batch`` > 1 the players' episodes share one lock-step batch
    (one batched generation per turn across every player's episodes in flight:
    their model agents must share one model, a spec named by several players is
    loaded once); otherwise each player plays in turn. ``on_episode`` hears every
    player's episodes; each summary's ``wall_s`` is the whole call's.
    ``set_aside(path)``: called for a player's file that holds a run with other
    settings, which it must move away (that player then plays anew); without it
    such a file is refused."""
    from tqdm.auto import tqdm

    if executor not in ("local", "ray"):
        raise TraceGymError(f"unknown executor '{executor}'; choose local or ray")
    kwargs = dict(env_kwargs or {})
    entry = get_entry(env_id)
    env_seeds = None
    if entry.kind == EnvKind.SYNTHESIZED:
        if task_ids is not None:
            raise TraceGymError(
                f"{env_id} has no tasks: it is played by seed (--seeds N or --split NAME), not by task id"
            )
        env_seeds = seed_split(entry, split, seeds)
        user_flags = [k for k in ("user", "user_model", "user_base_url") if k in kwargs]
        if user_flags:
            raise TraceGymError(
                f"{env_id} plays its own user: --{', --'.join(f.replace('_', '-') for f in user_flags)} only apply to τ² targets"
            )
    elif seeds is not None:
        raise TraceGymError(f"{env_id} has tasks: choose them with --split, --tasks or --task-ids, not --seeds")
    elif split is not None:
        kwargs["split"] = split
    outs = [Path(p.out).resolve() for p in players]
    if len(set(outs)) < len(outs):
        raise TraceGymError(f"two players write to one file ({', '.join(str(p.out) for p in players)})")
    options = [{"seed": seed, **p.agent_kwargs} for p in players]
    settings = [run_settings(env_id, p.agent, o, kwargs) for p, o in zip(players, options)]
    backends: dict[Any, Any] = {}  # a model spec is loaded once, whichever players name it
    options = [_with_local_adapter(p.agent, o, executor, backends) for p, o in zip(players, options)]
    env = make(env_id, **kwargs)  # (before the stores: an env that cannot be made leaves no file behind)
    stores: list[TrajectoryStore] = []
    try:
        if env_seeds is not None:
            plan = plan_seeded_episodes(env_seeds[:limit] if limit is not None else env_seeds, samples, seed)
        else:
            plan = plan_episodes(_task_ids(env, env_id, task_ids, limit), samples, seed)
        for player, setting in zip(players, settings):  # (after the plan: a target that lists no tasks leaves no file)
            stores.append(_open_store(player.out, setting, resume, overwrite, retry_given_up, set_aside))
    except BaseException:
        env.close()
        for store in stores:
            store.close()
        raise
    try:
        keys = [episode_id(env_id, ep.task_id, ep.sample, ep.reset_seed) for ep in plan]
        todo = [[ep for ep, key in zip(plan, keys) if key not in store] for store in stores]
        t0 = time.perf_counter()
        resumed = len(plan) * len(players) - sum(map(len, todo))
        names = ", ".join(dict.fromkeys(p.agent for p in players))
        bar = tqdm(
            total=len(plan) * len(players),
            initial=resumed,
            desc=f"{names} on {env_id}",
            unit="ep",
            disable=_bar_disabled(progress),
        )
        passed = sum(1 for store in stores for key in keys if key in store and store.completed[key].success)

        def recorder(store: TrajectoryStore) -> Callable[[Trajectory], None]:
            def record(trajectory: Trajectory) -> None:
                nonlocal passed
                store.append(trajectory)
                passed += trajectory.success
                bar.update(1)
                bar.set_postfix(pass_rate=f"{passed / max(bar.n, 1):.2f}")
                if on_episode:
                    on_episode(trajectory)

            return record

        records = [recorder(store) for store in stores]
        if executor == "local" and batch > 1:
            _run_local_batched(env, env_id, kwargs, players, options, todo, batch, records, backends)
        else:
            for player, agent_kwargs, episodes, record in zip(players, options, todo, records):
                if executor == "ray":
                    if env is not None:
                        env.close()
                        env = None
                    for trajectory in _run_ray(env_id, kwargs, player.agent, agent_kwargs, episodes, workers):
                        record(trajectory)
                elif workers > 1:
                    _run_threads(env_id, kwargs, player.agent, agent_kwargs, episodes, workers, record)
                else:
                    the_agent = make_agent(player.agent, **agent_kwargs)
                    for ep in episodes:
                        record(run_episode(env, the_agent, env_id, ep))
        bar.close()
        wall = time.perf_counter() - t0
        trajectories = [[store.completed[key] for key in keys] for store in stores]
    finally:
        if env is not None:
            env.close()
        for store in stores:
            store.close()
    summaries = []
    for player, played, episodes in zip(players, trajectories, todo):
        summary = summarize(played, env_id=env_id, agent=player.agent, wall_s=wall)
        summary.resumed = len(plan) - len(episodes)
        summary.out = str(player.out)
        summary.episode_ids = list(keys)
        summaries.append(summary)
    return summaries


def _task_ids(env: Any, env_id: str, task_ids: list[str] | None, limit: int | None) -> list[str]:
    """The tasks to play: ``task_ids`` (each checked against the target, one clear error
    for an unknown id, before any work), else the split's; the first ``limit``."""
    if task_ids is None:
        task_ids = list(getattr(env.unwrapped, "task_ids", None) or [])
        if not task_ids:
            raise TraceGymError(
                f"{env_id} has no task list: a target lists its split's task ids in task_ids (docs/targets.md)"
            )
    else:
        getter = getattr(env.unwrapped, "get_task", None)
        known = [str(t) for t in getattr(env.unwrapped, "task_ids", None) or []]
        for tid in task_ids:
            if callable(getter):
                getter(tid)
            elif known and str(tid) not in known:
                raise TraceGymError(
                    f"{env_id} has no task '{tid}' in this split ({len(known)} tasks, e.g. "
                    f"{', '.join(known[:5])}); --split names another"
                )
    return task_ids[:limit] if limit is not None else task_ids


def _open_store(
    out: str | Path,
    settings: dict[str, Any],
    resume: bool,
    overwrite: bool,
    retry_given_up: bool,
    set_aside: Callable[[Path], None] | None,
) -> TrajectoryStore:
    def opened() -> TrajectoryStore:
        return TrajectoryStore(
            out, resume=resume or retry_given_up, overwrite=overwrite, settings=settings, retry_given_up=retry_given_up
        )

    try:
        return opened()
    except OtherRunError:
        if set_aside is None:
            raise
        set_aside(Path(out))
        return opened()


MODEL_AGENTS = ("llm", "routed")
"""The agents that load a model (the others replay or script their actions)."""


def _run_local_batched(env, env_id, env_kwargs, players, options, todo, batch, records, backends) -> None:
    """Every player's episodes in one lock-step batch of up to ``batch``, each episode
    played by its own player's agent (one per player and slot), through one backend."""
    if any(p.agent not in MODEL_AGENTS for p in players):
        raise TraceGymError("--batch needs --agent llm (it batches model generation across episodes)")
    options = [{**o, "model": _shared_backend(backends, o)} for o in options]
    if len({id(o["model"]) for o in options}) > 1:  # (refused before any episode is played)
        raise TraceGymError(ONE_BACKEND)
    backend = options[0]["model"]
    queue = [(k, replace(ep)) for k, episodes in enumerate(todo) for ep in episodes]  # (players share a plan)
    size = min(batch, max(len(queue), 1))
    if getattr(backend, "max_batch", size) < size:  # a local model generates the whole lock-step batch at once
        backend.max_batch = size
    player_of = {id(ep): k for k, ep in queue}
    made: dict[tuple[int, int], Any] = {}

    def agent_for(slot: int, episode: Episode) -> Any:
        k = player_of[id(episode)]
        if (k, slot) not in made:
            made[k, slot] = make_agent(players[k].agent, **options[k])
        return made[k, slot]

    envs = [env] + [make(env_id, **env_kwargs) for _ in range(size - 1)]
    try:
        for played in play_batched(envs, [], env_id, [ep for _, ep in queue], agent_for=agent_for):
            records[player_of[id(played.episode)]](played.trajectory)
    finally:
        for extra in envs[1:]:
            extra.close()


def _shared_backend(backends: dict[Any, Any], agent_kwargs: dict[str, Any]) -> Any:
    """The agent's model as a backend object: made once per spec (and server) in
    ``backends``, so that the players of one rollout that name it share it."""
    model = agent_kwargs.get("model") or EMBEDDED_DEFAULT
    if not isinstance(model, str):
        return model
    server = {k: agent_kwargs[k] for k in ("base_url", "api_key") if k in agent_kwargs}
    key = (model, tuple(sorted(server.items())))
    if key not in backends:
        backends[key] = make_backend(model, **server)
    return backends[key]


def _with_local_adapter(
    agent: str, agent_kwargs: dict[str, Any], executor: str, backends: dict[Any, Any] | None = None
) -> dict[str, Any]:
    """``--adapter PATH`` with a local model: the model is made once, here (in
    ``backends``, shared with the rollout's other players), with that adapter
    loaded under its path, so every agent of the run uses it. A server's adapter
    (vLLM multi-LoRA) is a name the server knows: left alone."""
    adapter, model = agent_kwargs.get("adapter"), agent_kwargs.get("model")
    if agent != "llm" or not adapter or (isinstance(model, str) and is_chat_endpoint(model)):
        return agent_kwargs
    if model is not None and not isinstance(model, str) and adapter in getattr(model, "adapters", {}):
        return agent_kwargs  # a backend object that already holds it
    path = Path(adapter).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise TraceGymError(
            f"no LoRA adapter at {adapter} (a folder with adapter_config.json, as peft saves it); "
            "a local model loads adapters from folders"
        )
    if executor == "ray":
        raise TraceGymError(
            "--adapter PATH with a local model needs --executor local (each Ray worker would load its own model)"
        )

    backend = _shared_backend({} if backends is None else backends, agent_kwargs)
    if not isinstance(backend, LoadsAdapters):
        name = getattr(backend, "name", type(backend).__name__)  # a user's object need not be a backend at all
        raise TraceGymError(f"model {name} cannot load LoRA adapters")
    backend.load_adapter(adapter, str(path))
    return {**agent_kwargs, "model": backend}


def _run_threads(env_id, env_kwargs, agent, agent_kwargs, todo, workers, record) -> None:
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


def _ray_chunk(
    env_id: str,
    env_kwargs: dict[str, Any],
    agent: str,
    agent_kwargs: dict[str, Any],
    episodes: list[Episode],
    dirs: list[str] = (),
) -> list[str]:
    """Runs on a Ray worker: its own env and agent; trajectories as JSON text. ``dirs``:
    the driver's registry folders (a run's own envs are not on the worker's path)."""
    import trace_gym  # noqa: F401  (registers the envs in the worker)

    for folder in dirs:
        add_registry_dir(folder)

    env = make(env_id, **env_kwargs)
    try:
        the_agent = make_agent(agent, **agent_kwargs)
        return [run_episode(env, the_agent, env_id, ep).model_dump_json() for ep in episodes]
    finally:
        env.close()


def ray_placement(agent: str, agent_kwargs: dict[str, Any], gpus_here: int, cluster_gpus: float) -> dict[str, Any]:
    """Ray's resources for one worker: a local model loads a copy per worker, so where
    this machine has GPUs each worker holds one of its own (Ray sets its
    CUDA_VISIBLE_DEVICES; at most as many run at once as there are GPUs), rather than
    every copy landing on GPU 0. A model behind a server needs none."""
    model = agent_kwargs.get("model") or EMBEDDED_DEFAULT
    local = agent in MODEL_AGENTS and isinstance(model, str) and is_local(model)
    if not local or gpus_here == 0:
        return {}
    if cluster_gpus < 1:
        raise TraceGymError(
            f"--executor ray with a local model on this machine's {gpus_here} GPU(s): the Ray cluster offers no GPU, "
            "so every worker's copy would share one; start Ray with its GPUs, or play with --batch instead"
        )
    return {"num_gpus": 1}


def _run_ray(env_id, env_kwargs, agent, agent_kwargs, todo, workers):
    try:
        import ray
    except ImportError:
        raise TraceGymError("--executor ray needs ray: pip install 'trace-gym[ray]'") from None
    if not ray.is_initialized():
        ray.init(num_cpus=max(workers, 1), include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    gpus_here = 0
    if importlib.util.find_spec("torch") is not None:
        import torch

        gpus_here = torch.cuda.device_count()
    placement = ray_placement(agent, agent_kwargs, gpus_here, ray.cluster_resources().get("GPU", 0))
    remote = ray.remote(**placement)(_ray_chunk) if placement else ray.remote(_ray_chunk)
    chunk = max(1, len(todo) // (max(workers, 1) * 4))

    dirs = [str(d) for d in registry_dirs()]
    pending = [
        remote.remote(env_id, env_kwargs, agent, agent_kwargs, todo[i : i + chunk], dirs)
        for i in range(0, len(todo), chunk)
    ]
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
