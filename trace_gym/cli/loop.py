"""The verbs of the TRACE loop: ``rollout``, ``validate``, ``identify``, ``synthesize``, ``run``
(the stages from a config), and ``evaluate`` and ``route`` over an earlier run.

``validate`` (the sandbox checks of synthesized envs) sits here, between ``rollout`` and
``identify``, because that is where ``trace-gym --help`` lists it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import TraceGymError
from ..targets import UserKind
from .common import TEMPLATE_HELP, count, format_table, model_spec, names, say


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add the loop's verbs to ``sub``, the top parser's subcommands."""
    roll = sub.add_parser("rollout", help="roll an agent out on an env and write trajectories to JSONL")
    roll.add_argument("--env", required=True, help="env id, e.g. trace/tau2-retail-v0")
    roll.add_argument("--agent", required=True, help="llm, oracle, random, planted, noop or message_only")
    roll.add_argument(
        "--model",
        default=None,
        help="for --agent llm: smollm2-135m-instruct (default, offline), openai:<model> or hf:<path>",
    )
    roll.add_argument("--chat-template", default=None, metavar="T", help="for --agent llm: " + TEMPLATE_HELP)
    roll.add_argument(
        "--max-new-tokens", type=count, default=None, help="for --agent llm: tokens per model turn (default 256)"
    )
    roll.add_argument(
        "--adapter", default=None, help="for --agent llm: a LoRA adapter name (vLLM) or path (local models)"
    )
    roll.add_argument(
        "--temperature", type=float, default=None, help="for --agent llm: sampling temperature (default 0: greedy)"
    )
    roll.add_argument(
        "--deficits",
        default=None,
        help="for --agent planted: name=probability,... e.g. corrupt_ids=0.3,end_early=0.3 "
        "(corrupt_ids, end_early, omit_info, skip_reads; fixes_error: error-recovery demonstrations)",
    )
    roll.add_argument(
        "--executor", choices=["local", "ray"], default="local", help="run episodes here or on a Ray cluster"
    )
    roll.add_argument(
        "--workers", type=count, default=1, help="parallel episodes: threads (local, API models) or Ray tasks"
    )
    roll.add_argument(
        "--batch", type=count, default=1, help="for local models: episodes generated together in one batch"
    )
    roll.add_argument("--out", required=True, help="trajectory file (JSONL), appended as episodes finish")
    roll.add_argument(
        "--split",
        default=None,
        help="task split of the target (train, test, base), or a seed split a synthesized env's manifest names; default: the target's",
    )
    roll.add_argument(
        "--seeds", type=count, default=None, metavar="N", help="synthesized envs (no tasks): play env seeds 0..N-1"
    )
    roll.add_argument("--tasks", type=count, default=None, metavar="N", help="only the first N tasks of the split")
    roll.add_argument("--task-ids", default=None, help="comma-separated task ids instead of a split")
    roll.add_argument("--samples", type=count, default=1, metavar="K", help="episodes per task (for pass^k)")
    roll.add_argument("--seed", type=int, default=0, help="run seed; each episode's seed derives from it")
    roll.add_argument(
        "--resume",
        action="store_true",
        help="continue a run: skip episodes already in --out (refused if it was made with other settings)",
    )
    roll.add_argument(
        "--retry-given-up",
        action="store_true",
        help="with --resume: also play again the episodes the agent gave up (the old records stay in the file)",
    )
    roll.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    roll.add_argument(
        "--user", choices=[str(u) for u in UserKind], default=None, help="τ² user simulator (default scripted)"
    )
    roll.add_argument("--user-model", default=None, help="model of the LLM user (or TRACE_GYM_USER_MODEL)")
    roll.add_argument(
        "--user-base-url", default=None, help="OpenAI-compatible base URL of the LLM user (or OPENAI_BASE_URL)"
    )
    roll.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="step limit before truncation (τ² targets: tau2's orchestrator steps, every message counted; synthesized envs: agent actions)",
    )
    roll.add_argument(
        "--level",
        type=int,
        default=None,
        help="synthesized envs with LEVELS: the difficulty level to play (default: the env's own)",
    )
    roll.add_argument("--json", action="store_true", help="print the summary as JSON")
    roll.add_argument("--no-progress", action="store_true", help="no progress bar")
    roll.set_defaults(func=cmd_rollout)

    val = sub.add_parser(
        "validate",
        help="run every validation check on synthesized envs (in the sandbox)",
        description="Validate env folders or ids; or, for CI, every registry env a git change "
        "touches (--changed-since REF), or every registry env (--all).",
    )
    val.add_argument("env", nargs="*", help="env folders (with manifest.toml) or registered ids")
    val.add_argument(
        "--changed-since",
        metavar="REF",
        default=None,
        help="validate the registry envs whose folder, or whose target's folder, changed since the "
        "merge base of git REF and HEAD (working tree included)",
    )
    val.add_argument("--all", action="store_true", help="validate every synthesized env of the registry folder")
    val.add_argument(
        "--registry",
        default=None,
        metavar="DIR",
        help="with --changed-since or --all: the registry folder (default: env_registry of the repository)",
    )
    val.add_argument("--jobs", type=count, default=2, help="envs validated in parallel worker processes (default 2)")
    val.add_argument(
        "--backend", default="auto", help="sandbox backend: auto, docker, bwrap (subprocess: trusted code only)"
    )
    val.add_argument(
        "--seeds", type=count, default=None, help="seeds for the reset, diversity and solvable checks (default 100)"
    )
    val.add_argument(
        "--seed",
        type=int,
        default=None,
        help="replay a run's seeds (its report's config.seed); default: drawn fresh, as training draws them",
    )
    val.add_argument("--policy", default=None, help="an agent for the calibration check (K rollouts per seed)")
    val.add_argument("--k", type=count, default=None, help="rollouts per seed for calibration (default 4)")
    val.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    val.add_argument("--no-write", action="store_true", help="do not store validation.json beside the env")
    val.set_defaults(func=cmd_validate)

    ident = sub.add_parser("identify", help="find the capabilities the agent lacks (contrast failures with successes)")
    ident.add_argument("--trajectories", required=True, help="a trajectory file (JSONL) with successes and failures")
    ident.add_argument(
        "--analyst",
        default="gold",
        help="gold (tau2 gold actions, no LLM), milestone (ToolSandbox milestones, no LLM), reference (any target's oracle_actions(), no LLM) or openai:<model>",
    )
    ident.add_argument("--runs", type=count, default=10, help="identification runs N (default 10)")
    ident.add_argument(
        "--k", type=count, default=None, help="runs a capability must pass, K of N (default 8 of 10, scaled)"
    )
    ident.add_argument("--delta", type=float, default=0.20, help="smallest contrastive gap ER- - ER+ (default 0.20)")
    ident.add_argument("--rho", type=float, default=0.10, help="smallest coverage E-/|D-| (default 0.10)")
    ident.add_argument(
        "--max-selected",
        type=count,
        default=None,
        help="select at most N capabilities, the largest gaps first (default: every one that passes)",
    )
    ident.add_argument("--seed", type=int, default=0)
    ident.add_argument(
        "--per-trajectory", action="store_true", help="LLM analyst: label all capabilities of a trajectory in one call"
    )
    ident.add_argument(
        "--compare-gold",
        action="store_true",
        help="LLM analyst: also label the gold capabilities and report Cohen's kappa",
    )
    ident.add_argument("--cache", default=None, help="LLM analyst: answer cache folder (default OUT/.analyst_cache)")
    ident.add_argument(
        "--out", required=True, help="output folder: capabilities.json, labels.jsonl, runs.json, report.md, plots"
    )
    ident.set_defaults(func=cmd_identify)

    synth = sub.add_parser(
        "synthesize",
        help="write, validate and register one training env per capability",
        description="An analyst LLM writes env.py per capability; the sandbox validates it, the "
        "validator's evidence drives repairs, a policy calibrates it, and it is registered "
        "atomically with its provenance. --analyst registry (offline) only reports the "
        "registry envs that serve each capability.",
    )
    synth.add_argument(
        "--capabilities",
        required=True,
        help="capabilities.json from trace-gym identify (labels.jsonl beside it adds evidence)",
    )
    synth.add_argument("--target", required=True, help="the target env id, e.g. trace/tau2-retail-v0")
    synth.add_argument(
        "--analyst", default="registry", help="registry (offline: serve from the registry) or openai:<model>"
    )
    synth.add_argument(
        "--only", action="append", default=None, metavar="NAME", help="synthesize only this capability (repeatable)"
    )
    synth.add_argument(
        "--policy",
        default=None,
        help="an agent for calibration (e.g. oracle, or llm via the rollout agents); none: skipped",
    )
    synth.add_argument(
        "--max-attempts", type=count, default=5, help="answers per variant, the first and its repairs (default 5)"
    )
    synth.add_argument(
        "--max-calibration-rounds", type=int, default=2, help="harder/easier variants asked for (default 2)"
    )
    synth.add_argument(
        "--trajectories",
        default=None,
        help="the trajectories identify read: failed examples, policy and real tool results for the prompt",
    )
    synth.add_argument(
        "--registry",
        default=None,
        metavar="DIR",
        help="registry folder to write into (default: the installed env_registry)",
    )
    synth.add_argument(
        "--resume", action="store_true", help="keep capabilities already registered with a matching code hash"
    )
    synth.add_argument(
        "--cache", default=None, help="analyst answer cache folder (default ~/.cache/trace-gym/synthesis)"
    )
    synth.add_argument("--backend", default="auto", help="sandbox backend for validation: auto, docker, bwrap")
    synth.add_argument("--seeds", type=count, default=None, help="validation seeds (default 100)")
    synth.add_argument(
        "--validation-seed",
        type=int,
        default=None,
        help="where validation draws its seeds (default: fresh for each run, as training draws them)",
    )
    synth.add_argument("--json", action="store_true", help="print the result as JSON")
    synth.set_defaults(func=cmd_synthesize)

    run = sub.add_parser(
        "run",
        help="the whole TRACE loop from a TOML config (rollout, identify, synthesize, train, evaluate)",
        description="Run the stages a TOML config names into its run directory; see examples/*.toml.",
    )
    run.add_argument("config", help="the pipeline config (TOML), e.g. examples/quickstart.toml")
    run.add_argument(
        "--resume", action="store_true", help="continue the run: finished stages whose inputs did not change are kept"
    )
    run.add_argument(
        "--from", dest="from_stage", default=None, metavar="STAGE", help="redo this stage and every later one"
    )
    run.add_argument("--check", action="store_true", help="check the config and exit (nothing runs)")
    run.set_defaults(func=cmd_run)

    def over_a_run(name: str, help: str, description: str) -> argparse.ArgumentParser:
        verb = sub.add_parser(name, help=help, description=description)
        verb.add_argument("run_dir", metavar="RUN", help="the run directory of an earlier trace-gym run")
        return verb

    evaluate = over_a_run(
        "evaluate",
        "play every method of an earlier run on the held-out split (its table and report)",
        "The evaluate stage alone, over the artifacts of an earlier `trace-gym run` (its adapters, "
        "identification and GEPA prompt): one row per method, written to RUN/eval/ and RUN/report.md. "
        "Episodes already played are kept.",
    )
    evaluate.add_argument(
        "--methods",
        default=None,
        help="comma-separated rows (default: the run's [evaluate] methods): "
        "base, trace, grpo-target, merged, summed, control, gepa",
    )
    evaluate.add_argument("--split", default=None, help="the held-out split (default: the run's, test)")
    evaluate.add_argument("--tasks", type=count, default=None, help="only the first N tasks of the split")
    evaluate.add_argument("--samples", type=count, default=None, help="episodes per task (pass^k up to this)")
    evaluate.add_argument(
        "--model",
        default=None,
        help="the trained policy served elsewhere, for evaluation only: vllm:<model> (the run's adapters are "
        "loaded into the server) or openai:<model> (already serving them); nothing before evaluation is re-played",
    )
    evaluate.set_defaults(func=cmd_evaluate)

    route = over_a_run(
        "route",
        "which adapter TRACE's router picks, per task or message, from an earlier run",
        "The router of an earlier run (the base model scoring each capability's label against the "
        "task's opening) on the given messages, or on the opening of each task of a split.",
    )
    route.add_argument("--message", action="append", default=None, help="a task's opening message (repeatable)")
    route.add_argument(
        "--split", default=None, help="route the tasks of this split (default: the run's evaluation split)"
    )
    route.add_argument("--tasks", type=count, default=None, help="only the first N tasks of the split")
    route.add_argument("--json", action="store_true", help="print the decisions as JSON lines")
    route.set_defaults(func=cmd_route)


def cmd_rollout(args: argparse.Namespace) -> int:
    from trace_gym.agents import AGENTS, LAZY_AGENTS, make_agent

    from ..registry import EnvKind, get_entry
    from ..rollout import rollout

    entry = get_entry(args.env)  # an unknown id fails here, before any heavy import
    if args.level is not None and entry.kind != EnvKind.SYNTHESIZED:
        raise TraceGymError(
            f"--level: {entry.id} is a {entry.kind}; levels are for synthesized envs that declare LEVELS"
        )
    env_kwargs: dict[str, Any] = {}
    for key, value in (
        ("user", args.user),
        ("user_model", args.user_model),
        ("user_base_url", args.user_base_url),
        ("max_steps", args.max_steps),
        ("level", args.level),
    ):
        if value is not None:
            env_kwargs[key] = value
    task_ids = names(args.task_ids, "--task-ids")
    agent_kwargs = agent_options(args)
    if args.agent not in AGENTS and args.agent not in LAZY_AGENTS:
        make_agent(args.agent)  # one clear error for an unknown agent, before the env is built
    summary = rollout(
        entry.id,
        args.agent,
        args.out,
        agent_kwargs=agent_kwargs,
        executor=args.executor,
        workers=args.workers,
        batch=args.batch,
        split=args.split,
        task_ids=task_ids,
        limit=args.tasks,
        samples=args.samples,
        seed=args.seed,
        resume=args.resume,
        retry_given_up=args.retry_given_up,
        seeds=args.seeds,
        overwrite=args.overwrite,
        env_kwargs=env_kwargs,
        progress=False if args.no_progress else None,
    )
    if args.json:
        print(json.dumps(summary.as_dict(), indent=2))
        return 0
    if summary.aborted:
        print(
            f"trace-gym: warning: {summary.aborted} episodes were given up by the agent (e.g. {summary.abort_example}); "
            "rerun with --resume --retry-given-up to play them again",
            file=sys.stderr,
        )
    pass_k = ", ".join(f"pass^{k} {v:.3f}" for k, v in summary.pass_hat_k.items())
    print(
        f"{summary.agent} on {summary.env_id}: {summary.episodes} episodes"
        + (f" ({summary.resumed} resumed)" if summary.resumed else "")
        + f", pass rate {summary.successes / max(summary.episodes, 1):.3f} ({pass_k}), "
        f"mean reward {summary.mean_reward:.3f}, wall {summary.wall_s:.1f}s -> {summary.out}"
    )
    return 0


def agent_options(args: argparse.Namespace) -> dict[str, Any]:
    """Agent keyword arguments from the rollout flags; flags that do not apply to the agent are an error."""
    options: dict[str, Any] = {}
    llm_flags = {
        "model": args.model,
        "chat-template": args.chat_template,
        "adapter": args.adapter,
        "temperature": args.temperature,
        "max-new-tokens": args.max_new_tokens,
    }
    given = {k: v for k, v in llm_flags.items() if v is not None}
    if given and args.agent != "llm":
        raise TraceGymError(f"--{', --'.join(given)} only apply to --agent llm")
    given.pop("chat-template", None)
    if "max-new-tokens" in given:
        given["max_new_tokens"] = given.pop("max-new-tokens")
    if args.model or args.chat_template:
        given["model"] = model_spec(args.model, args.chat_template)
    options.update(given)
    if args.deficits is not None:
        if args.agent != "planted":
            raise TraceGymError("--deficits only applies to --agent planted")
        try:
            options["deficits"] = {
                k.strip(): float(v) for k, v in (p.split("=") for p in args.deficits.split(",") if p.strip())
            }
        except ValueError:
            raise TraceGymError(
                f"--deficits must look like corrupt_ids=0.3,end_early=0.2, got {args.deficits!r}"
            ) from None
    return options


def cmd_validate(args: argparse.Namespace) -> int:
    from ..validation import ValidationConfig, validate

    config = ValidationConfig(seed=args.seed)
    if args.seeds is not None:
        config.seeds = args.seeds
    if args.policy is not None:
        config.policy = args.policy
    if args.k is not None:
        config.k = args.k
    modes = sum([bool(args.env), args.changed_since is not None, args.all])
    if modes != 1:
        raise TraceGymError("validate takes env folders or ids, or --changed-since REF, or --all (exactly one of them)")
    if args.registry and not (args.changed_since or args.all):
        raise TraceGymError("--registry only applies with --changed-since or --all")
    if len(args.env) == 1:
        progress = None if args.json else (lambda name: print(f"  checking {name}...", file=sys.stderr, flush=True))
        report = validate(args.env[0], backend=args.backend, config=config, write=not args.no_write, progress=progress)
        print(json.dumps(report.as_dict(), indent=2) if args.json else report.table())
        return 0 if report.passed else 1
    return validate_registry_envs(args, config)


def validate_registry_envs(args: argparse.Namespace, config: Any) -> int:
    """Several envs at once (CI): one summary table, non-zero if any fails."""
    from ..registry import EnvKind
    from ..registry_ci import changed_envs, registry_folders, repo_root, summary_json, summary_rows, validate_many
    from ..validation import env_folder

    selection = None
    if args.changed_since is not None:
        selection = changed_envs(args.changed_since, registry=args.registry)
        paths = [e.path for e in sorted(selection.envs.values(), key=lambda e: e.id)]
        if not args.json:
            for env_id in sorted(selection.envs):
                print(f"  {env_id}: {selection.reasons[env_id]}", file=sys.stderr)
            for name in selection.removed:
                print(f"  {name}: removed by the change, nothing to validate", file=sys.stderr)
        if not paths:
            if args.json:
                print(summary_json([], selection))
            else:
                print(
                    f"no registry env changed since {args.changed_since} "
                    f"({len(selection.changed_files)} files changed); nothing to validate"
                )
            return 0
    elif args.all:
        registry = Path(args.registry) if args.registry else repo_root() / "env_registry"
        if not registry.is_dir():
            raise TraceGymError(f"no registry folder at {registry}")
        paths = [e.path for e in registry_folders(registry).values() if e.kind == EnvKind.SYNTHESIZED]
    else:
        paths = [env_folder(env) for env in args.env]

    def progress(outcome: Any) -> None:
        if not args.json:
            verdict = "PASS" if outcome.passed else "FAIL"
            print(f"  {verdict} {outcome.env_id} ({outcome.wall_s:.1f}s)", file=sys.stderr, flush=True)

    outcomes = validate_many(
        paths, backend=args.backend, config=config, jobs=args.jobs, write=not args.no_write, progress=progress
    )
    if args.json:
        print(summary_json(outcomes, selection))
    else:
        print(format_table(summary_rows(outcomes), ["env", "result", "failed checks", "wall s"]))
        failed = [o.env_id for o in outcomes if not o.passed]
        print(
            f"{len(outcomes) - len(failed)} of {len(outcomes)} envs passed"
            + (
                f"; failed: {', '.join(failed)} (trace-gym validate FOLDER shows each check's evidence)"
                if failed
                else ""
            )
        )
    return 0 if all(o.passed for o in outcomes) else 1


def cmd_identify(args: argparse.Namespace) -> int:
    from ..identification import SelectionConfig, identify, make_analyst
    from ..store import read_trajectories

    config = SelectionConfig(
        delta=args.delta, rho=args.rho, runs=args.runs, min_runs=args.k, max_selected=args.max_selected
    )
    trajectories = read_trajectories(args.trajectories)
    analyst = make_analyst(
        args.analyst,
        per_trajectory=args.per_trajectory,
        cache_dir=Path(args.cache or Path(args.out) / ".analyst_cache"),
    )
    result = identify(
        trajectories,
        analyst,
        args.out,
        config=config,
        seed=args.seed,
        compare_gold=args.compare_gold,
        progress=lambda message: print(f"  {message}...", file=sys.stderr, flush=True),
    )
    rows = [
        {
            "capability": c.name,
            "gap": "unknown" if c.gap_mean is None else f"{c.gap_mean:.2f}±{c.gap_std:.2f}",
            "coverage": f"{c.coverage_mean:.2f}",
            "runs": f"{c.runs_passed}/{c.runs}" + (f" ({c.runs_gap_unknown} unknown)" if c.runs_gap_unknown else ""),
            "selected": c.verdict,
        }
        for c in result.capabilities
    ]
    print(format_table(rows, ["capability", "gap", "coverage", "runs", "selected"]))
    info = result.analyst
    print(
        f"{info['runs_made']} of {info['runs_requested']} bootstrap runs made; kept when passed in {info['runs_required']} of them"
        + (f", at most {config.max_selected}, the largest gaps first" if config.max_selected is not None else "")
    )
    print(
        f"selected: {', '.join(result.selected) or 'none'}; analyst calls {result.analyst['calls']}, tokens {result.analyst['tokens']}; "
        f"wrote {args.out}/capabilities.json and report.md"
    )
    return 0


def cmd_synthesize(args: argparse.Namespace) -> int:
    from ..synthesis import SynthesisConfig, synthesize
    from ..validation import ValidationConfig

    validation = ValidationConfig(**({"seeds": args.seeds} if args.seeds else {}), seed=args.validation_seed)
    config = SynthesisConfig(
        max_attempts=args.max_attempts,
        max_calibration_rounds=args.max_calibration_rounds,
        policy=args.policy,
        validation=validation,
        backend=args.backend,
        resume=args.resume,
    )
    cache = Path(args.cache) if args.cache else Path.home() / ".cache" / "trace-gym" / "synthesis"
    result = synthesize(
        args.capabilities,
        args.target,
        analyst=args.analyst,
        registry_dir=args.registry,
        config=config,
        only=args.only,
        trajectories=args.trajectories,
        cache_dir=cache,
        progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True),
    )
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        print(result.summary())
        for outcome in result.outcomes:
            if not outcome.ok and outcome.last_report:
                print(f"\nlast report for {outcome.capability}:\n{outcome.last_report}")
    return 0 if all(o.ok for o in result.outcomes) else 1


def cmd_run(args: argparse.Namespace) -> int:
    from ..pipeline import load_config, run_pipeline

    config = load_config(args.config)  # every config mistake stops here, before any work
    if args.check:
        print(
            f"{args.config}: ok (target {config.run.target}, stages {', '.join(config.run.stages)}, run dir {config.run_dir})"
        )
        return 0
    report = run_pipeline(
        config,
        resume=args.resume,
        from_stage=args.from_stage,
        say=say,
    )
    print(f"report: {report} (every figure is read from {config.run_dir}/; under each table, what its figures mean)")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ..pipeline import evaluate_run

    methods = names(args.methods, "--methods")
    report = evaluate_run(
        args.run_dir,
        methods=methods,
        split=args.split,
        tasks=args.tasks,
        samples=args.samples,
        model=args.model,
        say=say,
    )
    print(f"report: {report} (the table: {args.run_dir}/eval/results.md)")
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    from ..pipeline import route_run

    if args.message and (args.split or args.tasks):
        raise TraceGymError("give --message, or --split/--tasks, not both")
    decisions = route_run(args.run_dir, messages=args.message, split=args.split, tasks=args.tasks)
    for task, decision in decisions:
        if args.json:
            print(json.dumps({"task": task, **decision.as_dict()}))
        else:
            shown = decision.named(decision.calibrated or decision.scores)
            scores = ", ".join(f"{k} {v:.2f}" for k, v in shown.items())
            print(
                f"{str(task)[:60]}: {decision.capability or 'none'} (adapter {decision.adapter or 'none'}; "
                f"{'calibrated ' if decision.calibrated else ''}scores {scores})"
            )
    return 0
