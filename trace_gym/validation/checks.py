"""The checks, one function each: a ``Context`` in, a ``CheckResult`` out."""

from __future__ import annotations

import ast
import json
import math
import statistics
from typing import Any, Callable

from ..errors import EnvContractError, TraceGymError
from ..result_shapes import result_problems
from ..tools import check_arguments, select_tools, tool_name, tool_parameters


from .context import Context, note_crash, revive
from .hints import hinted_reset, oracle_messages, oracle_values, stated_numbers
from .report import CheckResult


# --- the checks ----------------------------------------------------------------------
def check_static_gate(ctx: Context) -> CheckResult:
    from trace_gym.sandbox import check_source

    findings = check_source(ctx.source)
    if findings:
        return CheckResult(
            "static_gate", False, "; ".join(str(f) for f in findings[:5]), {"findings": [str(f) for f in findings]}
        )
    return CheckResult("static_gate", True, f"{len(ctx.source.splitlines())} lines, only allowed imports and names")


def check_contract_shape(ctx: Context) -> CheckResult:
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


def check_interface_fidelity(ctx: Context) -> CheckResult:
    """Does the env answer as the target does? The agent sees only the target's
    frozen schemas (``SandboxedEnv`` shows nothing else), so what is judged here is
    what the env's tools *return*: every tool result, on a schema-valid probe of
    each tool and along the oracle's episodes of ``fidelity_seeds`` seeds, must be
    an error in the target's style or a result of the target's frozen shape
    (``results.json``; for τ²: the JSON of tau2's own return models, field names
    and types exact). The oracle's calls must fit the schemas."""
    from trace_gym.actions import format_tool_call
    from trace_gym.rollout import replay_oracle

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
            hung, env = note_crash(ctx, crashes, f"{tool_name(schema)}({json.dumps(arguments)[:80]})", exc), ctx.env
            if hung:
                break
    bad_oracle_calls = []
    for seed in ctx.seeds("main", min(ctx.config.fidelity_seeds, ctx.config.seeds)) if not hung else ():
        try:
            env.reset(seed=seed)
            for parsed, _, info in replay_oracle(env, limit=env.max_steps):
                if parsed.kind == "malformed":
                    bad_oracle_calls.append(f"seed {seed}: an oracle action does not parse: {parsed.error}")
                for call in parsed.tool_calls:
                    if call.name not in names:
                        bad_oracle_calls.append(f"seed {seed}: oracle calls '{call.name}', not in TOOLS")
                        continue
                    problems = check_arguments(select_tools(ctx.target_tools, [call.name])[0], call.arguments)
                    bad_oracle_calls += [f"seed {seed}: {call.name}: {p}" for p in problems]
                answers += [(f"seed {seed} oracle", r["name"], r["content"]) for r in info.get("tool_results", [])]
        except TraceGymError as exc:
            hung, env = note_crash(ctx, crashes, f"seed {seed}, oracle episode", exc), ctx.env
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


def check_robustness(ctx: Context) -> CheckResult:
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
            revive(ctx)
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


def check_hints(ctx: Context) -> CheckResult:
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
        plain, hinted, oracle, hint_text, known = hinted_reset(env.worker, seed)
        if hinted["user_message"] != plain["user_message"]:
            changed_user += 1
        if hinted["system_prompt"] == plain["system_prompt"]:
            unchanged += 1
        per_seed.append((seed, hint_text.lower(), known.lower(), {v.lower() for v in oracle_values(oracle)}))
        numbers.append(
            (seed, stated_numbers(hint_text), stated_numbers(known), stated_numbers(" ".join(oracle_messages(oracle))))
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


def check_step_time(ctx: Context) -> CheckResult:
    times = sorted(ctx.step_times)
    if not times:
        return CheckResult("step_time", None, "no steps were timed")
    p50, p99 = statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]
    evidence = f"{len(times)} steps: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms (budget {ctx.config.step_budget_s * 1e3:.0f} ms)"
    return CheckResult("step_time", p99 <= ctx.config.step_budget_s, evidence, {"p50_s": p50, "p99_s": p99})


def check_calibration(ctx: Context) -> CheckResult:
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


Check = Callable[[Context], CheckResult]
CHECKS: list[Check] = [
    check_static_gate,
    check_contract_shape,
    check_interface_fidelity,
    check_reset_every_seed,
    check_seed_diversity,
    check_determinism,
    check_solvable,
    check_levels,
    check_not_trivial,
    check_reward_range,
    check_termination,
    check_robustness,
    check_hints,
    check_step_time,
    check_calibration,
]
"""The order a validation runs them in: cheapest first, so that a broken env fails
early; a failed static_gate, contract_shape or interface_fidelity with no env started
skips the rest. Where the order is load-bearing, ``NEEDS`` says why."""

NEEDS: dict[Check, tuple[Check, ...]] = {
    check_reset_every_seed: (check_interface_fidelity,),  # the env it starts (ctx.env)
    check_seed_diversity: (check_reset_every_seed,),  # the openings it saw (ctx.openings)
    check_solvable: (check_interface_fidelity,),
    check_levels: (check_interface_fidelity,),
    check_not_trivial: (check_interface_fidelity,),
    check_reward_range: (check_solvable, check_not_trivial),  # their oracle and floor episodes (ctx.episodes)
    check_termination: (check_solvable,),  # its oracle episodes
    check_robustness: (check_interface_fidelity,),
    check_hints: (check_interface_fidelity,),
    check_step_time: (check_solvable, check_not_trivial, check_reward_range),  # their steps (ctx.step_times)
    check_calibration: (check_interface_fidelity,),
}
"""What a check reads that an earlier one leaves in the context."""


def order_problems(checks: list[Check]) -> list[str]:
    """Where ``checks`` runs a check before one it needs (``NEEDS``); empty when none."""
    place = {check: i for i, check in enumerate(checks)}
    return [
        f"{check.__name__} runs before {needed.__name__}, which it needs"
        for check, needs in NEEDS.items()
        for needed in needs
        if check in place and place.get(needed, len(checks)) > place[check]
    ]


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
