"""Does the env answer as its target does: its tool results against the target's frozen shapes."""

from __future__ import annotations

import json

from trace_gym.actions import ActionKind, format_tool_call
from ...errors import EnvContractError, TraceGymError
from ...result_shapes import result_problems
from trace_gym.rollout import replay_oracle
from ...tools import check_arguments, select_tools, tool_name, tool_parameters
from ..context import Context, note_crash, valid_arguments
from ..report import CheckResult


def check_interface_fidelity(ctx: Context) -> CheckResult:
    """Does the env answer as the target does? The agent sees only the target's
    frozen schemas (``SandboxedEnv`` shows nothing else), so what is judged here is
    what the env's tools *return*: every tool result, on a schema-valid probe of
    each tool and along the oracle's episodes of ``fidelity_seeds`` seeds, must be
    an error in the target's style or a result of the target's frozen shape
    (``results.json``; for τ²: the JSON of tau2's own return models, field names
    and types exact). The oracle's calls must fit the schemas."""
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
        arguments = valid_arguments(tool_parameters(schema), i)
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
                if parsed.kind == ActionKind.MALFORMED:
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
