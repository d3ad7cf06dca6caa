"""What the checks share: one sandboxed env whose calls are bounded by the time budget, the
episodes played so far and their step times, and the run's seeds."""

from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import gymnasium as gym

from ..agents import make_agent
from trace_gym.agents.random_agent import RandomAgent
from ..errors import TraceGymError
from ..hashing import interface_hash
from ..registry import get_entry, read_manifest
from ..result_shapes import load_result_shapes
from ..rollout import Episode as Planned, episode_seed, run_episode
from trace_gym.sandbox.backends import Limits
from trace_gym.sandbox.env import SandboxedEnv
from ..sandbox.errors import Layer, SandboxError
from ..tools import load_frozen_tools
from .report import ValidationConfig


def draw_seeds(run_seed: int, purpose: str, n: int) -> list[int]:
    """``n`` env seeds as training draws them: 31-bit, from the run's seed
    (``seeding.derive_seed``, the project's one seed formula)."""
    return [episode_seed(run_seed, purpose, i) for i in range(n)]


@dataclass
class Episode:
    policy: str
    seed: int
    reward: float | None
    terminated: bool
    truncated: bool
    steps: int
    error: str | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)


class TimeBudgetExhausted(Exception):
    """The validation's time budget ran out (not a TraceGymError, so that no check
    swallows it: the loop in ``validate`` fails the running check and stops)."""


class CheckStopped(Exception):
    """A check met a decisive failure (the worker hung or died in an episode): it
    fails at once with this evidence instead of paying the same time-out per seed."""


@contextlib.contextmanager
def noting_layer(layers: list[Layer]) -> Iterator[None]:
    """Note in ``layers`` the sandbox layer that stopped env code (a ``SandboxError``'s
    ``layer``) and let the error go on."""
    try:
        yield
    except SandboxError as exc:
        if exc.layer:
            layers.append(exc.layer)
        raise


class BudgetedWorker:
    """A sandbox worker whose every call is bounded by what is left of the budget,
    and whose refusals (a ``SandboxError`` with a ``layer``) are noted in ``layers``."""

    def __init__(self, worker: Any, deadline: float, layers: list[Layer]):
        self._worker = worker
        self._deadline = deadline
        self._layers = layers

    def call(self, op: str, timeout: float | None = None, **payload: Any) -> Any:
        left = self._deadline - time.monotonic()
        if left <= 0:
            self._worker.close()
            raise TimeBudgetExhausted(f"before {op}()")
        with noting_layer(self._layers):
            return self._worker.call(op, timeout=min(timeout or self._worker.limits.call_timeout_s, left), **payload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)


class _TimedSteps(gym.Wrapper):
    """The env, each answered ``step``'s round trip (sandbox included) appended to ``times``."""

    def __init__(self, env: Any, times: list[float]):
        super().__init__(env)
        self._times = times

    def step(self, action: Any) -> Any:
        t0 = time.perf_counter()
        result = self.env.step(action)
        self._times.append(time.perf_counter() - t0)
        return result


class Context:
    """What the checks share: the env folder, one sandboxed env, episodes seen."""

    def __init__(self, path: Path, backend: Any, config: ValidationConfig):
        self.path = path
        self.backend = backend
        self.config = config
        self.entry = read_manifest(path)
        self.source = (path / "env.py").read_text(encoding="utf-8")
        target = get_entry(self.entry.target)
        self.target_tools = load_frozen_tools(target.tools_path)
        self.result_shapes = load_result_shapes(target.path)
        self.target_hash = interface_hash(target.path, path)
        self.deadline = time.monotonic() + config.time_budget_s
        self.run_seed = config.seed if config.seed is not None else secrets.randbits(31)
        self.env = None
        self.layers: list[Layer] = []  # sandbox layers that refused env code during the running check
        # what checks leave for later ones (checks.NEEDS says which reads what)
        self.openings: dict[int, str] = {}  # seed -> system prompt and first observation (reset_every_seed)
        self.episodes: list[Episode] = []  # every recorded episode played so far
        self.step_times: list[float] = []  # the round trip of every step played so far

    def seeds(self, purpose: str, n: int) -> list[int]:
        """This run's seeds for one use (the main list, floors, probes, ...)."""
        return draw_seeds(self.run_seed, purpose, n)

    def make_env(self):
        """A fresh sandboxed env: its calls bounded by the budget, its episodes by
        the validator's step cap (the env's declared ``max_steps`` is kept in
        ``declared_max_steps`` for the termination check)."""
        if time.monotonic() >= self.deadline:
            raise TimeBudgetExhausted("before starting a worker")
        with noting_layer(self.layers):  # refused while loading: the module's own code
            env = SandboxedEnv(
                self.path, backend=self.backend, limits=Limits(call_timeout_s=self.config.call_timeout_s)
            )
        env.worker = BudgetedWorker(env.worker, self.deadline, self.layers)
        env.declared_max_steps = env.worker.info.get("max_steps")
        env.max_steps = min(env.max_steps, self.config.max_episode_steps)
        return env

    def play(self, env, agent_name: str, seed: int, *, record: bool = True) -> Episode:
        """One episode of ``agent_name`` on this run's ``seed``, played as rollouts play
        them (``rollout.run_episode``), each step's round trip timed."""
        try:
            played = run_episode(
                _TimedSteps(env, self.step_times),
                make_agent(agent_name, seed=seed),
                self.entry.id,
                Planned(None, 0, seed),
            )
            episode = Episode(
                agent_name,
                seed,
                played.reward,
                played.terminated,
                played.truncated,
                played.steps,
                reward_info=played.reward_info,
            )
        except TraceGymError as exc:
            episode = Episode(agent_name, seed, None, False, False, 0, error=str(exc))
            if not env.unwrapped.worker.alive:  # it hung or died: decisive; a fresh worker for the next check
                if record:
                    self.episodes.append(episode)
                env.close()
                self.env = self.make_env()
                raise CheckStopped(f"the worker hung or died in a {agent_name} episode (seed {seed}): {exc}") from None
        if record:
            self.episodes.append(episode)
        return episode


def revive_quietly(ctx: Context) -> None:
    try:
        revive(ctx)
    except Exception:  # noqa: BLE001 - the next check reports a worker that cannot start
        ctx.env = None


def note_crash(ctx: Context, crashes: list[str], where: str, exc: Exception) -> bool:
    """Record a crash and give the check a live env; True when the worker hung or
    died (decisive: the check stops there rather than pay a time-out per call)."""
    crashes.append(f"{where}: {exc}")
    hung = ctx.env is None or not ctx.env.worker.alive
    revive(ctx)
    return hung


def revive(ctx: Context) -> None:
    """A check that killed the worker gets a fresh env for the checks after it."""
    if ctx.env is None or not ctx.env.worker.alive:
        if ctx.env is not None:
            ctx.env.close()
        ctx.env = ctx.make_env()


def valid_arguments(params: dict[str, Any], salt: int) -> dict[str, Any]:
    """Arguments that fit a tool's JSON-schema ``params``, drawn as the random agent draws them from ``salt``."""
    return RandomAgent(seed=salt).arguments_for(params)
