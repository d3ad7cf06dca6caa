"""Checks that probe single steps and resets: bad actions, hints, step time."""

from __future__ import annotations

import statistics

from trace_gym.actions import format_tool_call
from ...errors import TraceGymError
from trace_gym.sandbox.env import parse_reward
from ...tools import tool_name, tool_parameters
from ..context import Context, note_crash, valid_arguments
from ..hints import hinted_reset, oracle_messages, oracle_values, stated_numbers
from ..report import CheckResult


def check_robustness(ctx: Context) -> CheckResult:
    """Wrongly typed argument values (the host already answers unknown tools and
    argument names, as the target would) and odd messages, through the agent's
    own path, each followed by a reward. An exception raised inside a tool call
    is answered in the target's words (τ²: ``Error: <message>``), as the target
    itself answers it: evidence, not a failure. The env fails on what the target
    would not survive: a crash in reset, in reward or in a message step, a hang,
    a non-string observation, a malformed reward. A worker that hangs or dies
    ends the check there: one time-out, not one per probe."""
    env = ctx.env
    probes = ["", '{"name": 1}' * 50, format_tool_call("no_such_tool", {})]
    for i, schema in enumerate(env.tools):
        params = tool_parameters(schema)
        valid = valid_arguments(params, i)
        for name in params.get("properties", {}) or {}:
            for bad in (12345, None, ["x"], {"a": 1}):
                probes.append(format_tool_call(tool_name(schema), {**valid, name: bad}))
    crashes, answered = [], []
    stopped_at = None  # the probe at which the worker hung or died
    probe_seeds = ctx.seeds("robustness", len(probes))
    for i, probe in enumerate(probes):
        try:
            env.reset(seed=probe_seeds[i])
            seen = len(env.tool_exceptions)
            env.step(probe)
            answered.extend(env.tool_exceptions[seen:])
            parse_reward(env.worker.call("reward"))
        except TraceGymError as exc:
            hung, env = note_crash(ctx, crashes, probe[:90], exc), ctx.env
            if hung:  # decisive: one time-out, not one per probe
                stopped_at = i + 1
                break
    details = {"crashes": crashes, "tool_exceptions": answered[:20]}
    if stopped_at is not None:
        return CheckResult(
            "robustness",
            False,
            f"stopped at the first decisive failure: the worker hung or died at bad action {stopped_at}/"
            f"{len(probes)} (its reset, step or reward): {crashes[-1]}",
            details,
        )
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
