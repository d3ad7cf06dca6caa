"""Validate a synthesized environment: small named checks, each with its evidence.

Modelled on Gymnasium's ``env_checker``: one check per property, a report that
lists every check, what it saw and why it passed or failed. Every check runs
the env through the sandbox (``SandboxedEnv``), never in this process.

The checks, in order: static_gate, contract_shape, interface_fidelity,
reset_every_seed, seed_diversity, determinism, solvable, not_trivial,
reward_range, termination, robustness, hints, step_time; and, when a policy is
given, calibration. A failed static gate or contract stops the rest (they are
reported as skipped).

Validation ends in bounded time whatever the env does: every sandbox call is
bounded by what is left of ``time_budget_s`` (past it the running check fails
and the rest are skipped), a worker that hangs or dies during an episode stops
the running check at once (its first decisive failure), and every episode is
cut at the validator's own ``max_episode_steps``, whatever the env declares.
"""

from __future__ import annotations

import ast
import json
import math
import re
import secrets
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .errors import EnvContractError, TraceGymError
from .sandbox.errors import SandboxError
from .hashing import code_hash
from .registry import VALIDATION_REPORT, get_entry, read_manifest
from .result_shapes import load_result_shapes, result_problems
from .tools import check_arguments, load_frozen_tools, select_tools, tool_name, tool_parameters


@dataclass
class ValidationConfig:
    """Thresholds of the validator. Defaults follow TRACE's recommendations."""

    seeds: int = 100
    """Seeds for the reset, diversity and solvability checks."""
    floor_seeds: int = 30
    """Seeds for each floor policy (random, no-op, message-only) in not_trivial."""
    determinism_seeds: int = 5
    """Seeds replayed in two fresh workers by the determinism check."""
    diversity_min: float = 0.95
    """Share of distinct opening scenarios required over ``seeds`` seeds."""
    solvable_reward: float = 0.99
    """Reward at which an oracle episode counts as solved."""
    solvable_share: float = 0.95
    """Share of seeds the oracle must solve."""
    trivial_max: float = 0.3
    """Highest mean reward allowed to each floor policy."""
    min_reward_levels: int = 3
    """Distinct reward values required across all policies (GRPO needs variance)."""
    step_budget_s: float = 0.5
    """Largest p99 round trip of one env step, sandbox included."""
    policy: str | None = None
    """An agent for the calibration check (none: the check is not run)."""
    calibration_seeds: int = 10
    """Seeds (groups) of the calibration check."""
    k: int = 4
    """Rollouts per seed in the calibration check (TRACE's K)."""
    calibration_band: tuple[float, float] = (0.2, 0.6)
    """Where the policy's mean reward and success rate must lie."""
    max_constant_groups: float = 0.5
    """Largest share of groups whose K rewards are all equal."""
    min_informative_groups: float = 0.5
    """Smallest share of groups with reward variance (what GRPO learns from)."""
    max_all_zero_groups: float = 0.2
    """Largest share of groups where every rollout scores 0."""
    max_all_success_groups: float = 0.2
    """Largest share of groups where every rollout succeeds."""
    time_budget_s: float = 100.0
    """Wall-clock budget of the whole validation (sandbox calls and worker starts
    included); past it the running check fails and the rest are skipped."""
    max_episode_steps: int = 100
    """The validator's own step cap: every episode is cut here, and an env that
    declares a larger ``max_steps`` fails ``termination``."""
    fidelity_seeds: int = 10
    """Seeds whose oracle episodes have every tool result checked against the
    target's frozen result shapes in ``interface_fidelity``."""
    seed: int | None = None
    """Where every check's seeds come from. None (the default): drawn fresh for each
    run, 31-bit like the seeds training plays (``draw_seeds``), so env code cannot
    tell a validation seed from a training one or be honest on a fixed list only;
    an int replays a run (the report records the one it used)."""


def draw_seeds(run_seed: int, purpose: str, n: int) -> list[int]:
    """``n`` env seeds as training draws them: 31-bit, from the run's seed
    (``seeding.derive_seed``, the project's one seed formula)."""
    from .rollout import episode_seed

    return [episode_seed(run_seed, purpose, i) for i in range(n)]


@dataclass
class CheckResult:
    name: str
    passed: bool | None  # None: skipped
    evidence: str
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    sandbox_layer: str | None = None  # a failed check: the sandbox layer that stopped the env code, if one did


@dataclass
class ValidationReport:
    env_id: str
    path: str
    code_hash: str
    backend: str
    passed: bool
    checks: list[CheckResult]
    wall_s: float
    validated_at: str
    config: dict[str, Any]
    target_hash: str = ""
    """Hash of the target's frozen interface (tools.json, results.json, manifest)
    the env was judged against: the report goes stale when it changes."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.passed is False]

    def table(self) -> str:
        lines = [f"{self.env_id}  ({self.path}, backend {self.backend}, {self.wall_s:.1f}s)"]
        width = max(len(c.name) for c in self.checks)
        for c in self.checks:
            mark = "PASS" if c.passed else ("skip" if c.passed is None else "FAIL")
            lines.append(f"  {mark}  {c.name.ljust(width)}  {printable(c.evidence)}")
        lines.append("passed" if self.passed else f"FAILED: {', '.join(self.failed())}")
        return "\n".join(lines)


@dataclass
class Episode:
    policy: str
    seed: int
    reward: float | None
    terminated: bool
    truncated: bool
    steps: int
    error: str | None = None
    observations: list[str] = field(default_factory=list)
    reward_info: dict[str, Any] = field(default_factory=dict)


class _TimeBudgetExhausted(Exception):
    """The validation's time budget ran out (not a TraceGymError, so that no check
    swallows it: the loop in ``validate`` fails the running check and stops)."""


class _CheckStopped(Exception):
    """A check met a decisive failure (the worker hung or died in an episode): it
    fails at once with this evidence instead of paying the same time-out per seed."""


class _BudgetedWorker:
    """A sandbox worker whose every call is bounded by what is left of the budget,
    and whose refusals (a ``SandboxError`` with a ``layer``) are noted in ``layers``."""

    def __init__(self, worker: Any, deadline: float, layers: list[str]):
        self._worker = worker
        self._deadline = deadline
        self._layers = layers

    def call(self, op: str, timeout: float | None = None, **payload: Any) -> Any:
        left = self._deadline - time.monotonic()
        if left <= 0:
            self._worker.close()
            raise _TimeBudgetExhausted(f"before {op}()")
        try:
            return self._worker.call(op, timeout=min(timeout or self._worker.limits.call_timeout_s, left), **payload)
        except SandboxError as exc:
            if exc.layer:
                self._layers.append(exc.layer)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)


class _Context:
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
        self.target_hash = code_hash(target.path)
        self.deadline = time.monotonic() + config.time_budget_s
        self.run_seed = config.seed if config.seed is not None else secrets.randbits(31)
        self.env = None
        self.layers: list[str] = []  # sandbox layers that refused env code during the running check
        self.episodes: list[Episode] = []
        self.step_times: list[float] = []

    def seeds(self, purpose: str, n: int) -> list[int]:
        """This run's seeds for one use (the main list, floors, probes, ...)."""
        return draw_seeds(self.run_seed, purpose, n)

    def make_env(self):
        """A fresh sandboxed env: its calls bounded by the budget, its episodes by
        the validator's step cap (the env's declared ``max_steps`` is kept in
        ``declared_max_steps`` for the termination check)."""
        from trace_gym.sandbox.env import SandboxedEnv

        if time.monotonic() >= self.deadline:
            raise _TimeBudgetExhausted("before starting a worker")
        try:
            env = SandboxedEnv(self.path, backend=self.backend)
        except SandboxError as exc:  # refused while loading: the module's own code
            if exc.layer:
                self.layers.append(exc.layer)
            raise
        env.worker = _BudgetedWorker(env.worker, self.deadline, self.layers)
        env.declared_max_steps = env.worker.info.get("max_steps")
        env.max_steps = min(env.max_steps, self.config.max_episode_steps)
        return env

    def play(self, env, agent_name: str, seed: int, *, record: bool = True) -> Episode:
        from trace_gym.agents import make_agent

        agent = make_agent(agent_name, seed=seed)
        try:
            obs, info = env.reset(seed=seed)
            agent.reset(obs, {**info, "episode_seed": seed}, env)
            observations = [obs]
            reward, terminated, truncated, step_info = 0.0, False, False, {}
            while not (terminated or truncated):
                action = agent.act(obs)
                t0 = time.perf_counter()
                obs, reward, terminated, truncated, step_info = env.step(action)
                self.step_times.append(time.perf_counter() - t0)
                observations.append(obs)
                if hasattr(agent, "observe"):
                    agent.observe(obs, step_info)
            episode = Episode(
                agent_name,
                seed,
                reward,
                terminated,
                truncated,
                env.unwrapped.steps,
                observations=observations,
                reward_info=step_info.get("reward_info") or {},
            )
        except TraceGymError as exc:
            episode = Episode(agent_name, seed, None, False, False, 0, error=str(exc))
            if not env.unwrapped.worker.alive:  # it hung or died: decisive; a fresh worker for the next check
                if record:
                    self.episodes.append(episode)
                env.close()
                self.env = self.make_env()
                raise _CheckStopped(f"the worker hung or died in a {agent_name} episode (seed {seed}): {exc}") from None
        if record:
            self.episodes.append(episode)
        return episode


def validate(
    path_or_id: str | Path,
    *,
    backend: Any = "auto",
    config: ValidationConfig | None = None,
    write: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Run every check on an env folder (or registered env id) and return the report.

    With ``write=True`` the report is stored as ``validation.json`` beside env.py,
    with the code hash it was made for (``trace-gym envs list`` shows it stale
    once the code changes).
    """
    from trace_gym.sandbox import select_backend

    path = env_folder(path_or_id)
    config = config or ValidationConfig()
    backend_obj = select_backend(backend) if isinstance(backend, str) else backend
    ctx = _Context(path, backend_obj, config)
    started = time.perf_counter()
    results: list[CheckResult] = []
    stop = False
    for check in CHECKS:
        if check is check_calibration and not config.policy:
            continue
        if stop:
            reason = stop if isinstance(stop, str) else "skipped: an earlier check failed"
            results.append(CheckResult(check.__name__.removeprefix("check_"), None, reason))
            continue
        if progress:
            progress(check.__name__.removeprefix("check_"))
        t0 = time.perf_counter()
        ctx.layers.clear()
        try:
            result = check(ctx)
        except TraceGymError as exc:
            result = CheckResult(check.__name__.removeprefix("check_"), False, f"error: {exc}")
        except _CheckStopped as exc:
            result = CheckResult(
                check.__name__.removeprefix("check_"), False, f"stopped at the first decisive failure: {exc}"
            )
        except _TimeBudgetExhausted as exc:
            result = CheckResult(
                check.__name__.removeprefix("check_"),
                False,
                f"the validation's time budget ({config.time_budget_s:g}s) ran out during this check ({exc}): the env is too slow to judge",
            )
            stop = "skipped: the validation's time budget ran out"
        except Exception as exc:  # noqa: BLE001 - a reply no check foresaw still ends as a FAIL with evidence
            result = CheckResult(
                check.__name__.removeprefix("check_"),
                False,
                f"error: the env's answers broke this check ({type(exc).__name__}: {str(exc)[:300]})",
                {"traceback": traceback.format_exc()[-4000:]},
            )
            _revive_quietly(ctx)
        result.seconds = round(time.perf_counter() - t0, 3)
        if result.passed is False and ctx.layers:
            result.sandbox_layer = ctx.layers[0]
        results.append(result)
        if (
            result.passed is False
            and check in (check_static_gate, check_contract_shape, check_interface_fidelity)
            and ctx.env is None
        ):
            stop = stop or True
    if ctx.env is not None:
        ctx.env.close()
    report = ValidationReport(
        env_id=ctx.entry.id,
        path=_shown_path(path),
        code_hash=code_hash(path),
        backend=backend_obj.name,
        passed=all(r.passed is not False for r in results),
        checks=results,
        wall_s=round(time.perf_counter() - started, 2),
        validated_at=datetime.now(timezone.utc).isoformat(),
        config={**asdict(config), "seed": ctx.run_seed},  # the seeds drawn: replayable with this seed
        target_hash=ctx.target_hash,
    )
    if write:
        (path / VALIDATION_REPORT).write_text(json.dumps(report.as_dict(), indent=2) + "\n", encoding="utf-8")
    return report


def _shown_path(path: Path) -> str:
    """The env folder as a report records it: relative to the working directory when inside it,
    so that a committed report names no machine's absolute path."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def env_folder(path_or_id: str | Path) -> Path:
    """The folder of an env given as a folder (with manifest.toml) or a registered id."""
    candidate = Path(path_or_id)
    if (candidate / "manifest.toml").exists():
        return candidate
    if candidate.name == "env.py" and (candidate.parent / "manifest.toml").exists():
        return candidate.parent
    if str(path_or_id).startswith(("trace/", "trace_gym:")):
        entry = get_entry(str(path_or_id))
        if entry.kind != "synthesized":
            raise TraceGymError(f"{entry.id} is a target; only synthesized envs are validated")
        return entry.path
    raise TraceGymError(f"{path_or_id} is neither an env folder (with manifest.toml) nor a registered env id")


# --- the checks ----------------------------------------------------------------------
def check_static_gate(ctx: _Context) -> CheckResult:
    from trace_gym.sandbox import check_source

    findings = check_source(ctx.source)
    if findings:
        return CheckResult(
            "static_gate", False, "; ".join(str(f) for f in findings[:5]), {"findings": [str(f) for f in findings]}
        )
    return CheckResult("static_gate", True, f"{len(ctx.source.splitlines())} lines, only allowed imports and names")


def check_contract_shape(ctx: _Context) -> CheckResult:
    tree = ast.parse(ctx.source)
    problems = []
    doc = ast.get_docstring(tree) or ""
    if not doc.lower().startswith("transfer rationale"):
        problems.append("the module docstring must start with 'Transfer rationale:' (why success here transfers)")
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    env_class = classes.get("Environment")
    methods = {n.name for n in env_class.body if isinstance(n, ast.FunctionDef)} if env_class else set()
    if env_class is None:
        problems.append("no class Environment")
    for method in ("reset", "step", "reward", "oracle"):
        if env_class is not None and method not in methods:
            problems.append(f"Environment has no {method}()")
    if not any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TOOLS" for t in n.targets)
        for n in tree.body
    ):
        problems.append("no module-level TOOLS list")
    if problems:
        return CheckResult("contract_shape", False, "; ".join(problems))
    return CheckResult("contract_shape", True, "transfer rationale, TOOLS, Environment with reset/step/reward/oracle")


def check_interface_fidelity(ctx: _Context) -> CheckResult:
    """Does the env answer as the target does? The agent sees only the target's
    frozen schemas (``SandboxedEnv`` shows nothing else), so what is judged here is
    what the env's tools *return*: every tool result, on a schema-valid probe of
    each tool and along the oracle's episodes of ``fidelity_seeds`` seeds, must be
    an error in the target's style or a result of the target's frozen shape
    (``results.json``; for τ²: the JSON of tau2's own return models, field names
    and types exact). The oracle's calls must fit the schemas."""
    from trace_gym.actions import format_tool_call
    from trace_gym.sandbox.env import action_text

    try:
        ctx.env = ctx.make_env()
    except EnvContractError as exc:
        return CheckResult("interface_fidelity", False, str(exc))
    except TraceGymError as exc:
        return CheckResult("interface_fidelity", False, f"the env does not load in the sandbox: {exc}")
    env = ctx.env
    names = [tool_name(t) for t in env.tools]
    answers: list[tuple[str, str, str]] = []  # (where, tool, result text)
    crashes = []
    hung = False  # a hang or a dead worker is decisive: the check stops there, no time-out per call
    for i, schema in enumerate(env.tools):
        arguments = _valid_arguments(tool_parameters(schema), i)
        try:
            env.reset(seed=ctx.seeds("probe", len(env.tools))[i])
            info = env.step(format_tool_call(tool_name(schema), arguments))[4]
            answers += [
                (f"probe {r['name']}({json.dumps(arguments)[:60]})", r["name"], r["content"])
                for r in info.get("tool_results", [])
            ]
        except TraceGymError as exc:
            hung, env = _note_crash(ctx, crashes, f"{tool_name(schema)}({json.dumps(arguments)[:80]})", exc), ctx.env
            if hung:
                break
    bad_oracle_calls = []
    for seed in ctx.seeds("main", min(ctx.config.fidelity_seeds, ctx.config.seeds)) if not hung else ():
        try:
            env.reset(seed=seed)
            actions = env.worker.call("oracle") or []
            for action in actions if isinstance(actions, list) else []:
                if isinstance(action, dict) and action.get("type") == "tool_call":
                    name = action.get("name")
                    if name not in names:
                        bad_oracle_calls.append(f"seed {seed}: oracle calls '{name}', not in TOOLS")
                        continue
                    problems = check_arguments(select_tools(ctx.target_tools, [name])[0], action.get("arguments") or {})
                    bad_oracle_calls += [f"seed {seed}: {name}: {p}" for p in problems]
            for action in actions[: env.max_steps]:
                _, _, terminated, truncated, info = env.step(action_text(action))
                answers += [(f"seed {seed} oracle", r["name"], r["content"]) for r in info.get("tool_results", [])]
                if terminated or truncated:
                    break
        except TraceGymError as exc:
            hung, env = _note_crash(ctx, crashes, f"seed {seed}, oracle episode", exc), ctx.env
            if hung:
                break
    misshapen: dict[tuple[str, str], str] = {}
    if ctx.result_shapes is not None:
        for where, tool, text in answers:
            problems = result_problems(ctx.result_shapes, tool, text)
            if problems:
                misshapen.setdefault(
                    (tool, problems[0]), f"{where}: {tool} answered unlike {ctx.entry.target}: {problems[0]}"
                )
    wrong = list(misshapen.values())
    if crashes or bad_oracle_calls or wrong:
        evidence = "; ".join((wrong + crashes + bad_oracle_calls)[:4])
        return CheckResult(
            "interface_fidelity",
            False,
            evidence,
            {"results": wrong[:20], "crashes": crashes, "oracle_calls": bad_oracle_calls[:20]},
        )
    evidence = f"TOOLS {names} ⊆ the target's, shown with its frozen schemas; oracle calls fit them; "
    if ctx.result_shapes is None:
        evidence += (
            f"tool results NOT checked: {ctx.entry.target} has no frozen results.json "
            f"(trace-gym envs freeze-tools {ctx.entry.target})"
        )
    else:
        evidence += (
            f"{len(answers)} tool results (a probe of each tool, the oracle's episodes of "
            f"{min(ctx.config.fidelity_seeds, ctx.config.seeds)} seeds) have {ctx.entry.target}'s result shapes or error style"
        )
    return CheckResult("interface_fidelity", True, evidence, {"results_checked": len(answers)})


def check_reset_every_seed(ctx: _Context) -> CheckResult:
    failures, openings = [], {}
    for seed in ctx.seeds("main", ctx.config.seeds):
        try:
            obs, info = ctx.env.reset(seed=seed)
            openings[seed] = info["system_prompt"] + "\n---\n" + obs
        except TraceGymError as exc:
            failures.append(f"seed {seed}: {exc}")
            _revive(ctx)
            break  # the first failing seed decides: no time-out per seed
    ctx.openings = openings
    if failures:
        return CheckResult(
            "reset_every_seed", False, f"{failures[0]} (stopped at the first failing seed)", {"failures": failures}
        )
    return CheckResult("reset_every_seed", True, f"{ctx.config.seeds} seeds reset without error")


def check_seed_diversity(ctx: _Context) -> CheckResult:
    openings = getattr(ctx, "openings", {})
    if not openings:
        return CheckResult("seed_diversity", False, "no seed could be reset")
    if len(openings) < ctx.config.seeds:
        return CheckResult(
            "seed_diversity",
            None,
            f"not judged: reset_every_seed stopped after {len(openings)} of {ctx.config.seeds} seeds",
        )
    share = len(set(openings.values())) / ctx.config.seeds
    evidence = f"{len(set(openings.values()))} distinct openings over {ctx.config.seeds} seeds ({share:.0%}; need {ctx.config.diversity_min:.0%})"
    return CheckResult("seed_diversity", share >= ctx.config.diversity_min, evidence, {"share": share})


def check_determinism(ctx: _Context) -> CheckResult:
    differences = []
    for seed in ctx.seeds("main", ctx.config.determinism_seeds):
        runs = []
        for _ in range(2):
            env = ctx.make_env()  # a fresh worker each time: no state carried over
            try:
                runs.append(_replay(env, seed))
            finally:
                env.close()
        if runs[0] != runs[1]:
            first = (
                next(i for i, (a, b) in enumerate(zip(runs[0], runs[1])) if a != b)
                if len(runs[0]) == len(runs[1])
                else "length"
            )
            differences.append(f"seed {seed} differs at item {first}")
    if differences:
        return CheckResult(
            "determinism",
            False,
            "the same seed and actions gave different results in two fresh workers: " + "; ".join(differences[:3]),
        )
    return CheckResult(
        "determinism",
        True,
        f"{ctx.config.determinism_seeds} seeds replayed identically (oracle and random actions) in fresh workers",
    )


def check_solvable(ctx: _Context) -> CheckResult:
    episodes = [ctx.play(ctx.env, "oracle", seed) for seed in ctx.seeds("main", ctx.config.seeds)]
    solved = [e for e in episodes if e.reward is not None and e.reward >= ctx.config.solvable_reward]
    share = len(solved) / len(episodes)
    errors = [f"seed {e.seed}: {e.error}" for e in episodes if e.error][:3]
    evidence = f"oracle solves {len(solved)}/{len(episodes)} seeds ({share:.0%}; need {ctx.config.solvable_share:.0%})"
    if errors:
        evidence += "; errors: " + "; ".join(errors)
    return CheckResult("solvable", share >= ctx.config.solvable_share, evidence, {"share": share})


def check_not_trivial(ctx: _Context) -> CheckResult:
    means = {}
    for policy in ("random", "noop", "message_only"):
        rewards = [ctx.play(ctx.env, policy, seed).reward or 0.0 for seed in ctx.seeds("floor", ctx.config.floor_seeds)]
        means[policy] = sum(rewards) / len(rewards)
    worst = max(means, key=means.get)
    evidence = ", ".join(f"{p} {m:.2f}" for p, m in means.items()) + f" (each must be <= {ctx.config.trivial_max})"
    return CheckResult("not_trivial", means[worst] <= ctx.config.trivial_max, evidence, {"means": means})


def check_reward_range(ctx: _Context) -> CheckResult:
    """Rewards of every policy so far plus partial solutions (seeded prefixes of
    the oracle's actions), which show whether partial work earns partial credit."""
    for seed in ctx.seeds("main", min(ctx.config.floor_seeds, ctx.config.seeds)):
        ctx.play(ctx.env, "partial_oracle", seed)
    errors = [e.error for e in ctx.episodes if e.error and ("reward" in e.error)]
    rewards = [e.reward for e in ctx.episodes if e.reward is not None]
    if errors:
        return CheckResult("reward_range", False, errors[0])
    bad = [r for r in rewards if not (math.isfinite(r) and 0.0 <= r <= 1.0)]
    levels = sorted({round(r, 6) for r in rewards})
    if bad:
        return CheckResult("reward_range", False, f"rewards out of [0, 1]: {bad[:5]}")
    evidence = (
        f"{len(rewards)} episodes, rewards in [0, 1], levels {levels[:8]} (need >= {ctx.config.min_reward_levels})"
    )
    return CheckResult("reward_range", len(levels) >= ctx.config.min_reward_levels, evidence, {"levels": levels})


def check_termination(ctx: _Context) -> CheckResult:
    """Oracle episodes end by themselves within the env's ``max_steps``, which must
    not exceed the validator's own cap (episodes were cut there); a step after the
    end is answered."""
    oracle = [e for e in ctx.episodes if e.policy == "oracle" and e.error is None]
    never_ended = [e.seed for e in oracle if e.truncated]
    problems = []
    cap = ctx.config.max_episode_steps
    declared = getattr(ctx.env, "declared_max_steps", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and declared > cap:
        problems.append(
            f"the env declares max_steps {declared}, above the validator's cap of {cap} steps (episodes were cut there)"
        )
    if never_ended:
        problems.append(
            f"oracle episodes reach max_steps ({ctx.env.max_steps}) without the env ending them (seeds {never_ended[:5]})"
        )
    env = ctx.env
    env.reset(seed=ctx.seeds("main", 1)[0])
    actions = env.worker.call("oracle") or []
    done = False
    for action in actions[:cap] if isinstance(actions, list) else []:
        done = env.worker.call("step", action=action).get("done")
        if done:
            break
    try:
        after = env.worker.call("step", action={"type": "message", "content": "Are you still there?"})
        if not isinstance(after, dict) or not isinstance(after.get("observation"), str):
            problems.append("a step after the end does not return an observation")
    except TraceGymError as exc:
        problems.append(f"a step after the end crashes: {exc}")
        _revive(ctx)
    if problems:
        return CheckResult("termination", False, "; ".join(problems))
    return CheckResult(
        "termination",
        True,
        f"{len(oracle)} oracle episodes end by themselves within max_steps {ctx.env.max_steps}; a step after the end is answered",
    )


def check_robustness(ctx: _Context) -> CheckResult:
    """Wrongly typed argument values (the host already answers unknown tools and
    argument names, as the target would) and odd messages, through the agent's
    own path, each followed by a reward. An exception raised inside a tool call
    is answered in the target's words (τ²: ``Error: <message>``), as the target
    itself answers it: evidence, not a failure. The env fails on what the target
    would not survive: a crash in reset, in reward or in a message step, a hang,
    a non-string observation, a malformed reward."""
    from trace_gym.actions import format_tool_call
    from trace_gym.sandbox.env import parse_reward

    env = ctx.env
    probes = ["", '{"name": 1}' * 50, format_tool_call("no_such_tool", {})]
    for i, schema in enumerate(env.tools):
        params = tool_parameters(schema)
        valid = _valid_arguments(params, i)
        for name in params.get("properties", {}) or {}:
            for bad in (12345, None, ["x"], {"a": 1}):
                probes.append(format_tool_call(tool_name(schema), {**valid, name: bad}))
    crashes, answered = [], []
    probe_seeds = ctx.seeds("robustness", len(probes))
    for i, probe in enumerate(probes):
        try:
            env.reset(seed=probe_seeds[i])
            seen = len(env.tool_exceptions)
            env.step(probe)
            answered.extend(env.tool_exceptions[seen:])
            parse_reward(env.worker.call("reward"))
        except TraceGymError as exc:
            crashes.append(f"{probe[:90]} -> {exc}")
            _revive(ctx)
            env = ctx.env
    details = {"crashes": crashes, "tool_exceptions": answered[:20]}
    if crashes:
        return CheckResult(
            "robustness", False, f"{len(crashes)}/{len(probes)} bad actions crash the env: {crashes[0]}", details
        )
    evidence = f"{len(probes)} bad actions (wrongly typed values for every argument of every tool, odd messages) each get an observation and a reward"
    if answered:
        first = answered[0]
        evidence += (
            f"; {len(answered)} raised inside a tool and were answered as {ctx.entry.target} answers "
            f"(first: {first['tool']} raised {first['exception']}: {first['message'][:80]}; tracebacks in details)"
        )
    return CheckResult("robustness", True, evidence, details)


def check_hints(ctx: _Context) -> CheckResult:
    """A hint may say how to work, never what this seed's answer is: a leak is
    an oracle value (argument, or word of its messages) that appears in this
    seed's hint, not in what the agent is told anyway, and in fewer than half
    of all hints (generic advice repeats across seeds; an answer does not).
    Numbers are compared as numbers, however short or formatted: a count (3),
    an amount ($1,234.50 = 1234.5) stated in the oracle's messages is what a
    solved episode must produce, and a hint that states it gives it away."""
    env = ctx.env
    unchanged, changed_user = 0, 0
    seeds = ctx.seeds("main", min(20, ctx.config.seeds))
    per_seed, numbers = [], []
    for seed in seeds:
        plain, hinted, oracle, hint_text, known = _hinted_reset(env.worker, seed)
        if hinted["user_message"] != plain["user_message"]:
            changed_user += 1
        if hinted["system_prompt"] == plain["system_prompt"]:
            unchanged += 1
        per_seed.append((seed, hint_text.lower(), known.lower(), {v.lower() for v in _oracle_values(oracle)}))
        numbers.append(
            (seed, stated_numbers(hint_text), stated_numbers(known), stated_numbers(" ".join(_oracle_messages(oracle))))
        )
    leaks = []
    for seed, in_hint, in_known, answers in numbers:
        for value in sorted(answers & in_hint - in_known):
            share = sum(value in other for _, other, _, _ in numbers) / len(numbers)
            if share < 0.5:
                leaks.append(f"seed {seed}: the hint states {value}, a number the oracle's messages give as the answer")
    for seed, hint_text, known, values in per_seed:
        for value in sorted(values):
            if value in hint_text and value not in known:
                share = sum(value in other for _, other, _, _ in per_seed) / len(per_seed)
                if share < 0.5:
                    leaks.append(f"seed {seed}: the hint spells out '{value}'")
    problems = []
    if changed_user:
        problems.append(
            f"hint=True changes the user message on {changed_user} seeds (it may change only the system prompt)"
        )
    if unchanged == len(seeds):
        problems.append("hint=True changes nothing")
    if leaks:
        problems.append("; ".join(leaks[:3]))
    if problems:
        return CheckResult("hints", False, "; ".join(problems), {"leaks": leaks[:20]})
    return CheckResult(
        "hints",
        True,
        f"hint=True changes only the system prompt on {len(seeds)} seeds and spells out none of the oracle's values",
    )


def check_step_time(ctx: _Context) -> CheckResult:
    times = sorted(ctx.step_times)
    if not times:
        return CheckResult("step_time", None, "no steps were timed")
    p50, p99 = statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]
    evidence = f"{len(times)} steps: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms (budget {ctx.config.step_budget_s * 1e3:.0f} ms)"
    return CheckResult("step_time", p99 <= ctx.config.step_budget_s, evidence, {"p50_s": p50, "p99_s": p99})


def check_calibration(ctx: _Context) -> CheckResult:
    cfg = ctx.config
    groups = []
    for seed in ctx.seeds("calibration", cfg.calibration_seeds):
        rewards = [ctx.play(ctx.env, cfg.policy, seed, record=False).reward or 0.0 for _ in range(cfg.k)]
        groups.append(rewards)
    flat = [r for g in groups for r in g]
    n = len(groups)
    mean = sum(flat) / len(flat)
    success = sum(r >= cfg.solvable_reward for r in flat) / len(flat)
    constant = sum(len(set(g)) == 1 for g in groups) / n
    informative = 1 - constant
    all_zero = sum(all(r == 0 for r in g) for g in groups) / n
    all_success = sum(all(r >= cfg.solvable_reward for r in g) for g in groups) / n
    pass_at = {k: sum(any(r >= cfg.solvable_reward for r in g[:k]) for g in groups) / n for k in range(1, cfg.k + 1)}
    low, high = cfg.calibration_band
    rules = {
        f"mean reward {mean:.2f} in [{low}, {high}]": low <= mean <= high,
        f"success rate {success:.2f} in [{low}, {high}]": low <= success <= high,
        f"constant groups {constant:.2f} <= {cfg.max_constant_groups}": constant <= cfg.max_constant_groups,
        f"informative groups {informative:.2f} >= {cfg.min_informative_groups}": informative
        >= cfg.min_informative_groups,
        f"all-zero groups {all_zero:.2f} <= {cfg.max_all_zero_groups}": all_zero <= cfg.max_all_zero_groups,
        f"all-success groups {all_success:.2f} <= {cfg.max_all_success_groups}": all_success
        <= cfg.max_all_success_groups,
    }
    failed = [rule for rule, ok in rules.items() if not ok]
    pass_table = ", ".join(f"pass@{k} {v:.2f}" for k, v in pass_at.items())
    evidence = (
        f"{cfg.policy}, {n} groups x K={cfg.k}: "
        + ("; ".join(failed) if failed else "all rules hold")
        + f"; {pass_table}"
    )
    return CheckResult("calibration", not failed, evidence, {"groups": groups, "pass_at_k": pass_at, "rules": rules})


CHECKS = [
    check_static_gate,
    check_contract_shape,
    check_interface_fidelity,
    check_reset_every_seed,
    check_seed_diversity,
    check_determinism,
    check_solvable,
    check_not_trivial,
    check_reward_range,
    check_termination,
    check_robustness,
    check_hints,
    check_step_time,
    check_calibration,
]


# --- helpers -----------------------------------------------------------------------
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Evidence as it may be printed: escape sequences removed, other control
    characters (carriage returns, bells, bidi overrides) shown as spaces."""
    return _CONTROL.sub(" ", _ANSI.sub("", str(text)))


def _revive_quietly(ctx: _Context) -> None:
    try:
        _revive(ctx)
    except Exception:  # noqa: BLE001 - the next check reports a worker that cannot start
        ctx.env = None


def _note_crash(ctx: _Context, crashes: list[str], where: str, exc: Exception) -> bool:
    """Record a crash and give the check a live env; True when the worker hung or
    died (decisive: the check stops there rather than pay a time-out per call)."""
    crashes.append(f"{where}: {exc}")
    hung = ctx.env is None or not ctx.env.worker.alive
    _revive(ctx)
    return hung


def _revive(ctx: _Context) -> None:
    """A check that killed the worker gets a fresh env for the checks after it."""
    if ctx.env is None or not ctx.env.worker.alive:
        if ctx.env is not None:
            ctx.env.close()
        ctx.env = ctx.make_env()


def _replay(env, seed: int) -> list[Any]:
    """Oracle actions then random ones, at the worker level; everything the env says."""
    import random

    out: list[Any] = [env.worker.call("reset", seed=seed, hint=False)]
    actions = list(env.worker.call("oracle") or [])
    rng = random.Random(seed)
    for _ in range(2):  # then schema-valid random calls, as the host would let through
        schema = rng.choice(env.tools)
        actions.append(
            {
                "type": "tool_call",
                "name": tool_name(schema),
                "arguments": _valid_arguments(tool_parameters(schema), rng.randrange(10**6)),
            }
        )
    out.append(env.worker.call("reset", seed=seed, hint=False))
    for action in actions:
        result = env.worker.call("step", action=action)
        out.append(result)
        if result.get("done"):
            break
    out.append(env.worker.call("reward"))
    return out


def _valid_arguments(params: dict[str, Any], salt: int) -> dict[str, Any]:
    from trace_gym.agents.random_agent import RandomAgent

    return RandomAgent(seed=salt).arguments_for(params)


_VALUE_TOKEN = re.compile(r"[#A-Za-z0-9_.\-]*\d[#A-Za-z0-9_.\-]*")
_WORD = re.compile(r"[A-Za-z][A-Za-z\-]+")


_NUMBER = re.compile(r"(?<![\w.#])[-+]?\$?\d[\d,]*(?:\.\d+)?(?![\w#])")


def stated_numbers(text: str) -> set[str]:
    """The numbers a text states, normalised ($1,234.50 and 1234.5 are one number);
    digits inside ids (#W0012, user_12) are not numbers here."""
    out = set()
    for token in _NUMBER.findall(text):
        try:
            value = float(token.replace("$", "").replace(",", ""))
        except ValueError:
            continue
        out.add(f"{value:.6f}".rstrip("0").rstrip("."))
    return out


def _hinted_reset(worker: Any, seed: int) -> tuple[dict, dict, list, str, str]:
    """A seed reset without and with its hint, and its oracle: (plain, hinted, oracle,
    what the hint adds, what the agent is told anyway)."""
    plain = worker.call("reset", seed=seed, hint=False)
    oracle = worker.call("oracle") or []
    hinted = worker.call("reset", seed=seed, hint=True)
    hint_text = hinted["system_prompt"].replace(plain["system_prompt"], " ")
    return plain, hinted, oracle, hint_text, plain["system_prompt"] + " " + plain["user_message"]


def hint_leaks(worker: Any, seed: int, other: int) -> list[str]:
    """What ``seed``'s hint gives away, judged one seed at a time (training's spot
    check; ``check_hints`` judges many): an oracle value or a number of the oracle's
    messages that the hint states and nothing else the agent is told does. A value
    that ``other``'s hint states too is generic advice, not this seed's answer."""
    _, _, oracle, hint, known = _hinted_reset(worker, seed)
    hint, known = hint.lower(), known.lower()
    elsewhere = worker.call("reset", seed=other, hint=True)["system_prompt"].lower()
    leaks = [
        f"the hint spells out '{value}'"
        for value in sorted({v.lower() for v in _oracle_values(oracle)})
        if value in hint and value not in known and value not in elsewhere
    ]
    numbers = stated_numbers(hint) & stated_numbers(" ".join(_oracle_messages(oracle))) - stated_numbers(
        known
    ) - stated_numbers(elsewhere)
    return leaks + [f"the hint states {n}, a number the oracle's messages give as the answer" for n in sorted(numbers)]


def _oracle_messages(actions: list[Any]) -> list[str]:
    return [str(a.get("content", "")) for a in actions if isinstance(a, dict) and a.get("type") == "message"]


def _oracle_values(actions: list[Any]) -> set[str]:
    """Argument values of the oracle's calls and number-like tokens of its messages."""
    values: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
            text = str(value)
            if len(text) >= 3:
                values.add(text)

    for action in actions:
        if not isinstance(action, dict):
            continue
        if action.get("type") == "tool_call":
            walk(action.get("arguments"))
        elif action.get("type") == "message":
            content = str(action.get("content", ""))
            values.update(t for t in _VALUE_TOKEN.findall(content) if len(t) >= 3)
            values.update(w.lower() for w in _WORD.findall(content) if len(w) >= 4)
    return values
