"""``RUN/report.md``: the whole run on one page, every figure read from the run directory.

Sections appear as their stages finish: the base policy's rollouts, the
capability table, the environments and their validation, the training curves,
and the evaluation table, each followed by what its figures mean. Nothing here
computes a result: it reads the files the stages wrote (``state.json``,
``identify/capabilities.json``, ``envs/envs.json``, ``adapters/adapters.json``,
``eval/results.json``) and quotes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..artifacts import AdapterSet, ArtifactError, EnvSet, Identification, UntrainableRecord
from ..training.calibration import load_calibrations
from ..training.config import TrainingError


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _rel(path: str | Path, run_dir: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path)


def _ceilings(ceilings: dict[str, Any]) -> list[str]:
    """What the step limits allow: the target's own solutions played within each."""
    if not ceilings:
        return []
    parts = [
        f"within {stage}'s max_steps {c['max_steps'] or '(default)'}, {c['successes']} of its first "
        f"{c['episodes']} `{c['split']}` tasks"
        for stage, c in ceilings.items()
    ]
    return [f"*Ceiling*: the target's own solutions pass {'; '.join(parts)}: no agent can pass more there.", ""]


def write_report(config: Any, state: Any) -> Path:
    run_dir = config.run_dir
    out = [
        f"# TRACE run: {config.run.target}",
        "",
        f"Policy `{config.policy.spec}`, seed {config.run.seed}, stages: {', '.join(config.run.stages)}. "
        f"Every figure below is read from the files of `{run_dir}`; `state.json` records when each stage ran "
        "and a hash of what it read.",
        "",
    ]
    stages = state.stages
    if "rollout" in stages:
        out += _rollout_section(stages["rollout"].outputs, run_dir, config)
    if "identify" in stages:
        out += _identify_section(stages["identify"].outputs, run_dir, config)
    if "synthesize" in stages:
        out += _envs_section(stages["synthesize"].outputs, run_dir)
    if "train" in stages:
        out += _train_section(stages["train"].outputs, run_dir, state.adapters())
    if "gepa" in stages:
        out += _gepa_section(stages["gepa"].outputs, run_dir)
    if "evaluate" in stages:
        out += _eval_section(stages["evaluate"].outputs, run_dir)
    out += ["## Stages", "", "| stage | finished | wall s | inputs hash |", "| --- | --- | --- | --- |"]
    for name, record in stages.items():
        out.append(f"| {name} | {record.finished_at} | {record.wall_s:.0f} | `{record.inputs_hash[:12]}` |")
    path = run_dir / "report.md"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


PASS_RATE_NOTE = [
    "*Pass rate*: the share of episodes the target's own evaluator scored as solved. Identification "
    "contrasts the successes with the failures, so it needs some of each.",
    "",
]


def _played(r: dict[str, Any], run_dir: Path) -> str:
    return (
        f"pass rate **{r['pass_rate']:.3f}** ({r['successes']} successes), mean reward {r['mean_reward']:.3f}, "
        f"{r['wall_s']:.0f} s (`{_rel(r['trajectories'], run_dir)}`)"
    )


def _rollout_section(r: dict[str, Any], run_dir: Path, config: Any) -> list[str]:
    split, who = config.rollout.split, r.get("agent", "policy")
    if r.get("stand_in"):  # the policy's episodes, and another agent's on the side it is short of
        p, o = r["policy"], r["stand_in"]
        added = " and ".join(f"{o['added'][side]} {side}" for side in o["sides"])
        deficits = f" (the oracle with seeded deficits {o['deficits']})" if o.get("deficits") else ""
        own_failures = p["episodes"] - p["successes"]
        explained = (
            "the policy's own"
            if not o["added"]["failures"]
            else "the stand-in's"
            if not own_failures
            else "partly the stand-in's"
        )
        if o["added"]["successes"]:
            explained += "; where stand-ins are the successes, a gap measures the distance from what succeeds"
            explained += ", not a contrast within the policy"
        return [
            "## 1. The base policy on the target",
            "",
            f"{p['episodes']} episodes on the `{split}` split: {_played(p, run_dir)}.",
            "",
            f"**Too few to contrast**: {r['fallback_reason']}. Identification reads every episode of the policy's "
            f"and {added} of the `{o['agent']}` agent{deficits}, which played the whole split ({o['episodes']} "
            f"episodes: {_played(o, run_dir)}): {r['episodes']} episodes, {r['successes']} successes "
            f"(`{_rel(r['trajectories'], run_dir)}`). The failures it explains are {explained}.",
            "",
            *PASS_RATE_NOTE,
            *_ceilings(r.get("ceilings") or {}),
        ]
    if r.get("given"):
        heading, where = "## 1. The trajectories identification contrasts", "given (not rolled out)"
    elif who == "policy":
        heading, where = "## 1. The base policy on the target", f"on the `{split}` split"
    else:
        heading = "## 1. The trajectories identification contrasts"
        where = f"on the `{split}` split, played by the `{who}` agent, not by the policy: its failures are the ones "
        where += "identification explains" + (f" (deficits {r.get('deficits')})" if r.get("deficits") else "")
    return [
        heading,
        "",
        f"{r['episodes']} episodes {where}: {_played(r, run_dir)}.",
        "",
        *PASS_RATE_NOTE,
        *_ceilings(r.get("ceilings") or {}),
    ]


def _identify_section(outputs: dict[str, Any], run_dir: Path, config: Any) -> list[str]:
    sel = config.identify.selection
    out = ["## 2. Capabilities identified", ""]
    try:
        identified = Identification.load(outputs["dir"])
    except ArtifactError as exc:
        return out + [f"Not shown: {exc}", ""]
    if identified.degenerate:
        return out + [f"No capability could be selected: {identified.degenerate}", ""]
    out += [
        f"Analyst `{config.identify.analyst}`; kept when the gap ER- - ER+ >= {sel.delta} and coverage >= {sel.rho} "
        f"in at least {sel.min_runs} of {sel.runs} runs"
        + (f", at most {sel.max_selected} of them, the largest gaps first" if sel.max_selected is not None else "")
        + f" (details: `{_rel(Path(outputs['dir']) / 'report.md', run_dir)}`).",
        "",
        "| capability | gap | coverage | ER+ | ER- | runs passed | selected |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in identified.candidates:
        gap = "unknown" if c.gap_mean is None else f"{c.gap_mean:.2f} ± {c.gap_std or 0:.2f}"
        er_plus = "unknown" if c.er_plus_mean is None else f"{c.er_plus_mean:.2f}"
        er_minus = "unknown" if c.er_minus_mean is None else f"{c.er_minus_mean:.2f}"
        out.append(
            f"| {c.name} | {gap} | {c.coverage_mean:.2f} | {er_plus} | {er_minus} | "
            f"{c.runs_passed}/{c.runs} | {'**yes**' if c.selected else c.verdict} |"
        )
    out += [
        "",
        "*ER+ / ER-*: how often the capability is LACKING in successes / failures; *gap*: their difference "
        "(large means the lack goes with failure); *coverage*: the share of all failures where it is lacking.",
        "",
    ]
    return out


def _envs_section(outputs: dict[str, Any], run_dir: Path) -> list[str]:
    envs = EnvSet.load(outputs["envs_json"]).envs if outputs.get("envs_json") else None
    out = ["## 3. Training environments", ""]
    if not envs:
        return out + [outputs.get("summary", "none"), ""]
    out += ["| capability | env | source | validation | checks |", "| --- | --- | --- | --- | --- |"]
    for row in envs:
        report = _read_json(Path(row.path) / "validation.json") if row.path else None
        checks = "-"
        if report:
            ran = [c for c in report.get("checks", []) if c.get("passed") is not None]
            checks = f"{sum(1 for c in ran if c['passed'])}/{len(ran)}"
        out.append(f"| {row.capability} | `{row.env_id or '-'}` | {row.source} | {row.status} | {checks} |")
    out += [
        "",
        "*validation*: the env passed every named check in the sandbox (determinism, seed diversity, interface "
        "fidelity with the target's tools and result formats, graded rewards, termination, robustness, hints).",
        "",
    ]
    return out


def _train_section(outputs: dict[str, Any], run_dir: Path, made: AdapterSet) -> list[str]:
    if not made.untrainable and outputs.get("untrainable"):  # a run from before adapters.json recorded them
        made.untrainable = [UntrainableRecord(**u) for u in outputs["untrainable"]]
    out = ["## 4. Training (GRPO, one LoRA adapter per capability)", ""]
    if not made.adapters and not made.untrainable:
        return out + [outputs.get("summary", "none"), ""]
    out += [
        "| adapter | trained on | level | calibration: mean reward, informative / all-zero / all-success groups "
        "| iterations | rollouts "
        "| episodes played | informative groups, iteration 1 | first mean reward | last mean reward | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in made.adapters:
        log = (
            [json.loads(line) for line in Path(row.train_log).read_text().splitlines() if line.strip()]
            if Path(row.train_log).exists()
            else []
        )
        first = _fmt(log[0].get("mean_reward")) if log else "-"
        last = _fmt(log[-1].get("mean_reward")) if log else "-"
        rollouts = log[-1].get("rollouts", "-") if log else "-"
        wall = f"{log[-1].get('elapsed_s', 0):.0f}" if log else "-"
        try:
            calibrations = list(load_calibrations(row.calibration).values()) if row.calibration else []
            calibrated = (
                "; ".join(
                    f"{_fmt(f.mean_reward)}, {f.informative_share:.0%} / {f.all_zero_share:.0%} / "
                    f"{f.all_success_share:.0%}"
                    for f in (c.chosen for c in calibrations)
                )
                or "-"
            )
        except TrainingError as exc:  # a calibration file this trace-gym cannot read: said, not guessed
            calibrations, calibrated = [], f"not shown: {exc}"
        levels = ", ".join("-" if c.level is None else str(c.level) for c in calibrations) or "-"
        informative = (
            f"{log[0].get('informative_groups', '-')}/{len(log[0].get('first_draw_groups', [])) or '-'}" if log else "-"
        )
        out.append(
            f"| {row.name} | {', '.join(row.envs)} | {levels} | {calibrated} | {len(log)} | {rollouts} | "
            f"{row.episodes_played} | {informative} | {first} | {last} | {wall} |"
        )
    for skipped in made.untrainable:
        out.append(
            f"| {skipped.name} | {', '.join(skipped.envs)} | - | untrainable: {skipped.reason} "
            "| 0 | 0 | - | - | - | - | - |"
        )
    curves = sorted((a.name, a.reward_curve) for a in made.adapters if a.reward_curve)
    if curves:
        out += ["", *[f"![{name}]({_rel(path, run_dir)})" for name, path in curves]]
    out += [
        "",
        "*rollouts*: the update's planned episodes (G groups x K samples per iteration), the budget by which "
        "the methods are compared; *episodes played*: every episode, calibration and the redraws of constant "
        "groups (dynamic sampling) included; *level*: the env's difficulty calibration chose for this policy; "
        "*informative groups*: groups whose rewards differ (GRPO learns from no other); *mean reward*: over the "
        "first draw of every group.",
        "",
    ]
    return out


def _gepa_section(outputs: dict[str, Any], run_dir: Path) -> list[str]:
    out = [
        "## GEPA baseline (prompt optimization at equal rollouts)",
        "",
        f"{outputs['candidates']} candidate prompts from {outputs['rollouts']} episodes of a {outputs['budget']}-episode "
        f"budget; reflection model `{outputs['reflection']}` ({outputs['reflection_calls']} calls). Validation score "
        f"{outputs['seed_val_score']:.3f} with the seed prompt, {outputs['best_val_score']:.3f} with the best "
        f"(search log: `{_rel(Path(outputs['dir']) / 'search.jsonl', run_dir)}`). The best instructions, added to "
        "the end of the target's system prompt:",
        "",
        "```",
        outputs["best_prompt"],
        "```",
        "",
    ]
    if outputs.get("warning"):
        out += [f"**Warning:** {outputs['warning']}.", ""]
    out += [
        "*Episodes*: every episode the search played on the target's train split (the seed prompt's validation "
        "included), the same budget by which the trained methods are compared.",
        "",
    ]
    return out


def _eval_section(outputs: dict[str, Any], run_dir: Path) -> list[str]:
    out = ["## 5. Evaluation on the held-out split", ""]
    table = Path(outputs["results_md"]) if outputs.get("results_md") else None
    if not table or not table.exists():
        return out + [outputs.get("summary", "none"), ""]
    out += [table.read_text(encoding="utf-8").rstrip(), ""]
    for plot in outputs.get("plots", []):
        out.append(f"![{Path(plot).stem}]({_rel(plot, run_dir)})")
    out += [
        "",
        "*pass^1*: share of solved episodes, with a 95% Wilson interval; *pass^k*: the chance that k samples "
        "of a task all succeed; *tasks +/- vs base*: tasks the method solves more often than base, and less often; "
        "*routing acc.*: share of tasks routed to a capability the base model lacked there (or to none when it "
        "lacked none), by the gold or milestone analyst's labels (n/a: no such truth for this run); cost columns: "
        "training rollouts, analyst calls, wall time. Second table: *LACKING*: the share of the method's own "
        "held-out episodes where the run's analyst finds the capability lacking (95% Wilson interval); *pass^1 "
        "where base lacked it*: on those tasks only; *LACKING change*: the mean change against base on the "
        "capabilities the method was trained for, and on the others (a capability adapter should lower the "
        "first more).",
        "",
    ]
    return out


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"
