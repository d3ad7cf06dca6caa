"""Checks that play whole episodes: resets, determinism, the oracle's and the floor policies' rewards, termination."""

from __future__ import annotations

import math
import random
from typing import Any

from ...errors import TraceGymError
from ...tools import tool_name, tool_parameters
from ..context import Context, revive, valid_arguments
from ..report import CheckResult


def check_reset_every_seed(ctx: Context) -> CheckResult:
    failures, openings = [], {}
    for seed in ctx.seeds("main", ctx.config.seeds):
        try:
            obs, info = ctx.env.reset(seed=seed)
            openings[seed] = info["system_prompt"] + "\n---\n" + obs
        except TraceGymError as exc:
            failures.append(f"seed {seed}: {exc}")
            revive(ctx)
            break  # the first failing seed decides: no time-out per seed
    ctx.openings = openings
    if failures:
        return CheckResult(
            "reset_every_seed", False, f"{failures[0]} (stopped at the first failing seed)", {"failures": failures}
        )
    return CheckResult("reset_every_seed", True, f"{ctx.config.seeds} seeds reset without error")


def check_seed_diversity(ctx: Context) -> CheckResult:
    openings = ctx.openings
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


def check_determinism(ctx: Context) -> CheckResult:
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


def check_solvable(ctx: Context) -> CheckResult:
    episodes = [ctx.play(ctx.env, "oracle", seed) for seed in ctx.seeds("main", ctx.config.seeds)]
    solved = [e for e in episodes if e.reward is not None and e.reward >= ctx.config.solvable_reward]
    share = len(solved) / len(episodes)
    errors = [f"seed {e.seed}: {e.error}" for e in episodes if e.error][:3]
    evidence = f"oracle solves {len(solved)}/{len(episodes)} seeds ({share:.0%}; need {ctx.config.solvable_share:.0%})"
    if errors:
        evidence += "; errors: " + "; ".join(errors)
    return CheckResult("solvable", share >= ctx.config.solvable_share, evidence, {"share": share})


def check_levels(ctx: Context) -> CheckResult:
    """Every difficulty level an env declares is one calibration may train at: each
    resets and is solved by the oracle as the default level is (``solvable``)."""
    env = ctx.env.unwrapped
    if not env.levels:
        return CheckResult("levels", True, "no LEVELS declared: one level, checked by solvable")
    shares, errors, default = {}, [], env.level
    try:
        for level in range(env.levels):
            env.level = level
            episodes = [
                ctx.play(ctx.env, "oracle", seed, record=False)
                for seed in ctx.seeds(f"level {level}", ctx.config.level_seeds)
            ]
            shares[level] = sum(
                e.reward is not None and e.reward >= ctx.config.solvable_reward for e in episodes
            ) / len(episodes)
            errors += [f"level {level} seed {e.seed}: {e.error}" for e in episodes if e.error][:2]
    finally:
        env.level = default
    failed = [level for level, share in shares.items() if share < ctx.config.solvable_share]
    evidence = "oracle solves " + ", ".join(f"level {k} {v:.0%}" for k, v in shares.items())
    evidence += f" of {ctx.config.level_seeds} seeds each (need {ctx.config.solvable_share:.0%})"
    if errors:
        evidence += "; errors: " + "; ".join(errors[:3])
    return CheckResult("levels", not failed, evidence, {"shares": shares})


def check_not_trivial(ctx: Context) -> CheckResult:
    means = {}
    for policy in ("random", "noop", "message_only"):
        rewards = [ctx.play(ctx.env, policy, seed).reward or 0.0 for seed in ctx.seeds("floor", ctx.config.floor_seeds)]
        means[policy] = sum(rewards) / len(rewards)
    worst = max(means, key=means.get)
    evidence = ", ".join(f"{p} {m:.2f}" for p, m in means.items()) + f" (each must be <= {ctx.config.trivial_max})"
    return CheckResult("not_trivial", means[worst] <= ctx.config.trivial_max, evidence, {"means": means})


def check_reward_range(ctx: Context) -> CheckResult:
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


def check_termination(ctx: Context) -> CheckResult:
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
        revive(ctx)
    if problems:
        return CheckResult("termination", False, "; ".join(problems))
    return CheckResult(
        "termination",
        True,
        f"{len(oracle)} oracle episodes end by themselves within max_steps {ctx.env.max_steps}; a step after the end is answered",
    )


def _replay(env, seed: int) -> list[Any]:
    """Oracle actions then random ones, at the worker level; everything the env says."""
    out: list[Any] = [env.worker.call("reset", seed=seed, hint=False)]
    actions = list(env.worker.call("oracle") or [])
    rng = random.Random(seed)
    for _ in range(2):  # then schema-valid random calls, as the host would let through
        schema = rng.choice(env.tools)
        actions.append(
            {
                "type": "tool_call",
                "name": tool_name(schema),
                "arguments": valid_arguments(tool_parameters(schema), rng.randrange(10**6)),
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
