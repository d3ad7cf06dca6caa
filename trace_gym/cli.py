"""The ``trace-gym`` command line: parse, call the library, print.

A mistake of the user's (an unknown id, a bad path, an unreachable endpoint)
prints one line, ``trace-gym: error: ...``, and exits 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

from .errors import TraceGymError
from .targets import UserKind
from .training.config import SFTTrainingConfig


_WARNED: set[str] = set()


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """``warnings.showwarning`` for the command line: a warning the filters let through is
    one line without its source line, and each text is said once a command (a registry
    read by several callers warned of one broken folder three times)."""
    from .text import printable

    kind = "" if category is UserWarning else f"{category.__name__}: "
    text = f"trace-gym: warning: {kind}{printable(str(message)).removeprefix('trace-gym: ')}"
    if text not in _WARNED:
        _WARNED.add(text)
        print(text, file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    previous, warnings.showwarning = warnings.showwarning, _one_line_warning
    _WARNED.clear()
    try:
        return _run(argv)
    finally:
        warnings.showwarning = previous  # (a program that calls main() keeps its own hook)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TraceGymError as exc:
        from .text import printable  # env code's text can reach an error: no control characters

        print(f"trace-gym: error: {printable(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trace-gym: interrupted; finished episodes are saved, rerun with --resume to continue", file=sys.stderr)
        return 130


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line too (subcommand parsers inherit the class)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"trace-gym: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def count(text: str) -> int:
    """An argparse type: a whole number of at least 1 (episodes, workers, runs...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count: {text!r} (a whole number, at least 1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="trace-gym",
        description="TRACE: capability-targeted training environments for tool-using agents.",
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    envs = sub.add_parser("envs", help="list and manage registered environments")
    envs_sub = envs.add_subparsers(title="envs commands", metavar="COMMAND")
    listing = envs_sub.add_parser("list", help="id, kind, target, capability and validation status of every env")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=cmd_envs_list)
    new = envs_sub.add_parser("new", help="scaffold a new synthesized env folder that already passes validation")
    new.add_argument("name", help="lower-case name with dashes, e.g. order-lookup (id trace/<name>-v0)")
    new.add_argument("--target", required=True, help="the target env id, e.g. trace/tau2-retail-v0")
    new.add_argument("--dir", default="env_registry", help="where to create the folder (default env_registry)")
    new.add_argument("--capability", default="", help="the capability's short name")
    new.add_argument("--description", default="", help="the capability in one sentence")
    new.set_defaults(func=cmd_envs_new)
    freeze = envs_sub.add_parser(
        "freeze-tools",
        help="re-freeze a target's tool schemas and result shapes into env_registry/<target>/tools.json and results.json",
    )
    freeze.add_argument("env_id")
    freeze.set_defaults(func=cmd_envs_freeze)
    targets = sub.add_parser("targets", help="a target of your own: scaffold it, freeze its tools")
    targets_sub = targets.add_subparsers(title="targets commands", metavar="COMMAND")
    tnew = targets_sub.add_parser(
        "new",
        help="scaffold a target of your own that already plays (docs/targets.md)",
        description="Writes DIR/NAME/manifest.toml and DIR/NAME/<name>.py: a plain gymnasium.Env "
        "(a small order desk with train and test tasks, tools, a reward and "
        "reference solutions) that rollout, the oracle and training play as it is. "
        "Make it yours one piece at a time.",
    )
    tnew.add_argument("name", help="lower-case name with dashes, e.g. my-desk (id trace/<name>-v0)")
    tnew.add_argument(
        "--dir",
        default=".",
        help="where to create the folder (default: here); register it by putting "
        "this folder on TRACE_GYM_REGISTRY_PATH or in a package's trace_gym.registry entry point",
    )
    tnew.add_argument("--description", default="", help="one sentence on what the target is")
    tnew.set_defaults(func=cmd_targets_new)
    tfreeze = targets_sub.add_parser(
        "freeze",
        help="freeze a target's tool schemas and result formats (tools.json and "
        "results.json beside its manifest, both or neither)",
    )
    tfreeze.add_argument("env_id")
    tfreeze.set_defaults(func=cmd_envs_freeze)
    eserve = envs_sub.add_parser(
        "serve",
        help="serve a registry env as an OpenEnv environment (episodes on its /ws)",
        description="OpenEnv's server (openenv-core) over a registry env, a target or a "
        "synthesized env in its sandbox: reset takes seed, task_id and split; the "
        'action is {"text": the agent\'s turn}; the observation holds the text, the '
        "messages, the system prompt and tools at reset, and the reward at the end. "
        "docs/targets.md has the protocol.",
    )
    eserve.add_argument("env_id")
    eserve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    eserve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    eserve.add_argument(
        "--max-sessions", type=int, default=8, help="episodes played at once, one per WebSocket session (default 8)"
    )
    eserve.set_defaults(func=cmd_envs_serve)
    catalog = envs_sub.add_parser("catalog", help="write the registry catalogue (CATALOG.md and catalog.json)")
    catalog.add_argument(
        "--registry", default=None, metavar="DIR", help="the registry folder (default: the installed env_registry)"
    )
    catalog.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the committed catalogue is out of date"
    )
    catalog.set_defaults(func=cmd_envs_catalog)

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
    evaluate.add_argument("--tasks", type=int, default=None, help="only the first N tasks of the split")
    evaluate.add_argument("--samples", type=int, default=None, help="episodes per task (pass^k up to this)")
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
    route.add_argument("--tasks", type=int, default=None, help="only the first N tasks of the split")
    route.add_argument("--json", action="store_true", help="print the decisions as JSON lines")
    route.set_defaults(func=cmd_route)

    serve = sub.add_parser(
        "serve",
        help="the improved agent behind an OpenAI-compatible API, each conversation routed",
        description="An OpenAI-compatible server (chat completions with tools, vLLM's token-id "
        "completions, /v1/load_lora_adapter) over a local model. Given an earlier run, it "
        "serves its policy with every adapter the run trained, and the model id 'trace' "
        "routes each conversation to its capability adapter as evaluation does.",
    )
    serve.add_argument(
        "run_dir",
        metavar="RUN",
        nargs="?",
        default=None,
        help="an earlier trace-gym run (its policy, adapters and router)",
    )
    serve.add_argument(
        "--model",
        default=None,
        help="without RUN: a local model, the embedded smollm2-135m-instruct "
        "(default), a shipped warm start or hf:<folder>",
    )
    serve.add_argument("--chat-template", default=None, metavar="T", help="with --model: " + TEMPLATE_HELP)
    serve.add_argument(
        "--adapter",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="also serve this LoRA adapter under NAME (repeatable)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require this key from every client (Authorization: Bearer KEY); "
        "default: the TRACE_GYM_SERVE_API_KEY variable, else none",
    )
    serve.add_argument(
        "--allow-adapter-loading",
        action="store_true",
        help="answer /v1/load_lora_adapter (off: a client cannot make the server read a folder)",
    )
    serve.add_argument("--quiet", action="store_true", help="do not log each request to stderr")
    serve.set_defaults(func=cmd_serve)

    train = sub.add_parser(
        "train",
        help="train one LoRA adapter with GRPO (TRL + peft) on registry envs",
        description="GRPO on one env (a capability env, or a target: the GRPO-on-target baseline) or "
        "on a mixture (--env A,B,C: the merged-adapter baseline). Defaults are the TRACE "
        "paper's: rank 32, G=4, K=4, lr 1e-5, 40 iterations. Writes adapter/, "
        "train_log.jsonl, reward_curve.png and checkpoints/ into --out.",
    )
    train.add_argument("--env", required=True, help="env id, or several ids separated by commas (one merged adapter)")
    train.add_argument(
        "--model", default=None, help="policy: the embedded smollm2-135m-instruct (default) or hf:<local folder>"
    )
    train.add_argument("--chat-template", default=None, metavar="T", help=TEMPLATE_HELP)
    train.add_argument("--out", required=True, help="run folder")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    add_torch_options(train, "--resume keeps the run's")
    train.add_argument(
        "--use-vllm", action="store_true", help="pass TRL's vLLM integration through (needs vllm installed)"
    )
    train.add_argument("--iterations", type=int, default=None, help="GRPO iterations (default 40)")
    train.add_argument("--groups", type=int, default=None, help="G: seeds per iteration (default 4)")
    train.add_argument("--rollouts-per-group", type=int, default=None, help="K: episodes per seed (default 4)")
    train.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 1e-5)")
    train.add_argument("--lora-rank", type=int, default=None, help="LoRA rank (default 32)")
    train.add_argument(
        "--hint-share", type=float, default=None, help="share of each group played with a hint (default 0.25)"
    )
    train.add_argument("--max-new-tokens", type=int, default=None, help="tokens per model turn (default 256)")
    train.add_argument(
        "--max-steps", type=int, default=None, help="agent actions per episode (default: the env's own limit)"
    )
    train.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="episodes per forward/backward pass, dividing G x K (default K; larger: faster, more memory)",
    )
    train.add_argument(
        "--max-draws",
        type=int,
        default=None,
        help="dynamic sampling: draws per constant-reward group per iteration (default 3; 1: off)",
    )
    train.add_argument(
        "--level", type=int, default=None, help="difficulty level of an env with LEVELS (default: calibration's choice)"
    )
    train.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip calibrating the envs for the policy (refused unless --train-anyway)",
    )
    train.add_argument(
        "--train-anyway",
        action="store_true",
        help="train an env that calibration found untrainable for this policy, or that was not calibrated",
    )
    train.add_argument(
        "--train-unvalidated",
        action="append",
        default=[],
        metavar="ENV_ID",
        help="train this synthesized env although its validation report is missing, stale or failed "
        "(repeat for each; refused by default)",
    )
    train.add_argument("--backend", default=None, help="sandbox backend of synthesized envs: auto, docker, bwrap")
    train.add_argument("--json", action="store_true", help="print the result as JSON")
    train.set_defaults(func=cmd_train)

    warm = sub.add_parser(
        "sft",
        help="warm-start a policy: LoRA fine-tuning (TRL SFTTrainer) on successful trajectories",
        description="Fine-tune the policy on trajectories that succeeded (a target's oracle on its train "
        "split, your own logs, or the policy's own successes), with loss on the agent's "
        "tokens only. Writes adapter/, model/ (merged: use it as --model hf:OUT/model), "
        "sft_log.jsonl and run.json into --out. A file holding a held-out task is refused.",
    )
    warm.add_argument("--trajectories", required=True, help="trajectory file(s), comma-separated")
    warm.add_argument("--out", required=True, help="run folder")
    warm.add_argument(
        "--model",
        default=None,
        help="policy to warm-start: an embedded model (default smollm2-135m-instruct), a shipped warm start "
        "or hf:<local folder>",
    )
    warm.add_argument("--chat-template", default=None, metavar="T", help=TEMPLATE_HELP + " (saved with the model)")
    warm.add_argument(
        "--min-reward", type=float, default=None, help="learn from episodes with at least this reward (default 1.0)"
    )

    def sft_default(name: str) -> str:  # the defaults, said once: in the config's fields
        return f"(default {SFTTrainingConfig.__dataclass_fields__[name].default:g})"

    warm.add_argument(
        "--epochs", type=int, default=None, help=f"passes over the demonstrations {sft_default('epochs')}"
    )
    warm.add_argument("--lr", type=float, default=None, help=f"AdamW learning rate {sft_default('learning_rate')}")
    warm.add_argument(
        "--batch-size", type=int, default=None, help=f"demonstrations per optimizer step {sft_default('batch_size')}"
    )
    warm.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help=f"demonstrations per forward pass, all of one prompt {sft_default('micro_batch')}",
    )
    warm.add_argument("--lora-rank", type=int, default=None, help=f"LoRA rank {sft_default('lora_rank')}")
    warm.add_argument("--lora-alpha", type=int, default=None, help=f"LoRA scaling alpha {sft_default('lora_alpha')}")
    warm.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per demonstration (default: the model's context)"
    )
    add_torch_options(warm, "--resume needs the run's")
    warm.add_argument("--save-steps", type=int, default=None, help="optimizer steps between checkpoints (default 5)")
    warm.add_argument("--resume", action="store_true", help="go on from the last checkpoint in --out (same options)")
    warm.set_defaults(func=cmd_sft)

    baseline = sub.add_parser("baseline", help="baselines TRACE is compared with at equal rollouts (gepa)")
    baseline_sub = baseline.add_subparsers(title="baselines", metavar="BASELINE")
    gepa = baseline_sub.add_parser(
        "gepa",
        help="GEPA: evolve the policy's instructions by reflection, within a rollout budget",
        description="GEPA (reflective prompt evolution, the gepa package) on a target's train split: a reflection "
        "model reads failed episodes with the env's reward components and writes better instructions "
        "(added to the end of the target's system prompt); every episode played counts against "
        "--budget. Writes best_prompt.txt, search.jsonl, gepa.json and episodes/ into --out, then "
        "evaluates the best prompt on the held-out split (eval/).",
    )
    gepa.add_argument("--env", required=True, help="the target env id, e.g. trace/tau2-retail-v0")
    gepa.add_argument(
        "--model",
        default=None,
        help="policy: the embedded smollm2-135m-instruct (default), hf:<folder> or openai:<model>",
    )
    gepa.add_argument("--chat-template", default=None, metavar="T", help="of the policy: " + TEMPLATE_HELP)
    gepa.add_argument(
        "--reflection",
        default=None,
        metavar="MODEL",
        help="reflection model: openai:<model> (default: the embedded model, too small to be a fair baseline; it says so)",
    )
    gepa.add_argument(
        "--reflection-max-tokens",
        type=count,
        default=1024,
        metavar="N",
        help="longest reflection answer (default 1024; a small local reflector is much faster with 256)",
    )
    gepa.add_argument(
        "--budget",
        type=count,
        required=True,
        help="episodes the search may play in all (TRACE's training rollouts, for equal budget)",
    )
    gepa.add_argument("--out", required=True, help="run folder")
    gepa.add_argument(
        "--split", default="train", help="the target's split GEPA trains and validates on (default train)"
    )
    gepa.add_argument("--tasks", type=count, default=None, help="only the first N tasks of --split")
    gepa.add_argument(
        "--val-tasks",
        type=count,
        default=4,
        help="how many of those tasks (the last ones) are GEPA's validation set (default 4)",
    )
    gepa.add_argument("--minibatch", type=count, default=3, help="train tasks per reflection (default 3)")
    gepa.add_argument(
        "--seed-prompt", default=None, metavar="TEXT", help="the instructions GEPA starts from (or @FILE)"
    )
    gepa.add_argument("--eval-split", default="test", help="held-out split for the best prompt's row (default test)")
    gepa.add_argument("--eval-tasks", type=count, default=None, help="only the first N tasks of --eval-split")
    gepa.add_argument("--samples", type=count, default=1, help="episodes per held-out task (pass^k)")
    gepa.add_argument("--no-eval", action="store_true", help="search only; no held-out row")
    gepa.add_argument(
        "--max-steps", type=count, default=None, help="messages per episode before truncation (default: the target's)"
    )
    gepa.add_argument("--max-new-tokens", type=count, default=256, help="tokens per model turn (default 256)")
    gepa.add_argument("--temperature", type=float, default=0.0)
    gepa.add_argument("--batch", type=count, default=8, help="local models: episodes generated together in lock-step")
    gepa.add_argument("--workers", type=count, default=1, help="API models: episodes in parallel threads")
    gepa.add_argument("--resume", action="store_true", help="continue the search in --out (a finished one is kept)")
    gepa.add_argument("--seed", type=int, default=0)
    gepa.add_argument("--progress", action="store_true", help="GEPA's own progress bar over rollouts")
    gepa.add_argument("--json", action="store_true", help="print the result as JSON")
    gepa.set_defaults(func=cmd_baseline_gepa)

    report = sub.add_parser("report", help="a table of pass rate and mean reward per trajectory file")
    report.add_argument("files", nargs="+")
    report.set_defaults(func=cmd_report)
    return parser


def cmd_envs_list(args: argparse.Namespace) -> int:
    from .registry import discover

    rows = [
        {
            "id": e.id,
            "kind": e.kind,
            "target": e.target or "",
            "capability": e.capability.get("name", ""),
            "status": e.validation_status(),
        }
        for e in discover().values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows, ["id", "kind", "target", "capability", "status"]))
    return 0


def cmd_envs_new(args: argparse.Namespace) -> int:
    from .scaffold import new_env

    folder = new_env(args.name, args.target, args.dir, args.capability, args.description)
    print(f"created {folder}/ (env.py, manifest.toml, README.md); next: edit env.py, then trace-gym validate {folder}")
    return 0


def cmd_targets_new(args: argparse.Namespace) -> int:
    from .scaffold import new_target

    folder = new_target(args.name, args.dir, args.description)
    parent = os.path.abspath(args.dir)
    print(
        f"created {folder}/ (manifest.toml, {args.name.replace('-', '_')}.py); next:\n"
        f"  export TRACE_GYM_REGISTRY_PATH={parent}${{TRACE_GYM_REGISTRY_PATH:+:$TRACE_GYM_REGISTRY_PATH}}\n"
        f"  trace-gym rollout --env trace/{args.name}-v0 --agent oracle --split train --out runs/{args.name}-oracle.jsonl\n"
        f"  trace-gym targets freeze trace/{args.name}-v0"
    )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .validation import ValidationConfig, validate

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
    from .registry import EnvKind
    from .registry_ci import changed_envs, registry_folders, repo_root, summary_json, summary_rows, validate_many
    from .validation import env_folder

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


def cmd_envs_serve(args: argparse.Namespace) -> int:
    from .openenv_server import BackgroundServer

    if not 0 <= args.port < 65536:
        raise TraceGymError(f"--port must be in 0..65535, got {args.port}")
    try:
        server = BackgroundServer(args.env_id, host=args.host, port=args.port, max_sessions=args.max_sessions)
    except OSError as exc:
        raise TraceGymError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    with server:
        print(f"serving {args.env_id} over OpenEnv at {server.base_url} (episodes on /ws; Ctrl-C stops)", flush=True)
        try:
            server.wait()
        except KeyboardInterrupt:
            pass
    return 0


def cmd_envs_catalog(args: argparse.Namespace) -> int:
    from .catalog import StaleCatalogError, check_catalog, write_catalog

    if args.check:
        try:
            check_catalog(args.registry)
        except StaleCatalogError as exc:
            print(f"trace-gym: {exc}", file=sys.stderr)
            return 1
        print("the registry catalogue is up to date")
        return 0
    for path in write_catalog(args.registry):
        print(f"wrote {path}")
    return 0


def cmd_envs_freeze(args: argparse.Namespace) -> int:
    from .freeze import freeze_tools

    print("wrote " + ", ".join(str(path) for path in freeze_tools(args.env_id)))
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from trace_gym.agents import AGENTS, LAZY_AGENTS, make_agent

    from .registry import EnvKind, get_entry
    from .rollout import rollout

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
    task_ids = [t.strip() for t in args.task_ids.split(",") if t.strip()] if args.task_ids else None
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


def cmd_identify(args: argparse.Namespace) -> int:
    from .identification import SelectionConfig, identify, make_analyst
    from .store import read_trajectories

    config = SelectionConfig(delta=args.delta, rho=args.rho, runs=args.runs, min_runs=args.k)
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
            "selected": "yes" if c.selected else "no",
        }
        for c in result.capabilities
    ]
    print(format_table(rows, ["capability", "gap", "coverage", "runs", "selected"]))
    info = result.analyst
    print(
        f"{info['runs_made']} of {info['runs_requested']} bootstrap runs made; kept when passed in {info['runs_required']} of them"
    )
    print(
        f"selected: {', '.join(result.selected) or 'none'}; analyst calls {result.analyst['calls']}, tokens {result.analyst['tokens']}; "
        f"wrote {args.out}/capabilities.json and report.md"
    )
    return 0


def cmd_synthesize(args: argparse.Namespace) -> int:
    from .synthesis import SynthesisConfig, synthesize
    from .validation import ValidationConfig

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


TEMPLATE_HELP = (
    "chat template of a local or vllm: model: auto (default: the model's own if it appends turn "
    "for turn, else TRL's training template for its family), stock, a template's name "
    "(ours: chatml_compact_tools; TRL's: qwen3_training) or a .jinja path"
)


def add_torch_options(parser: argparse.ArgumentParser, resume_dtype: str) -> None:
    """Where and how a training verb runs the model: the same four options for GRPO and SFT
    (``resume_dtype``: what --resume does with --dtype, which differs between them)."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default=None,
        help="model weights (default auto: bfloat16 on CUDA and on CPUs with bf16 instructions "
        f"(AVX512-BF16, AMX, Arm BF16), float32 elsewhere; the LoRA stays float32; {resume_dtype})",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=None)


def model_spec(model: str | None, template: str | None) -> str | None:
    """The spec --model and --chat-template name together (None: the command's default model)."""
    if not template:
        return model
    from .llm.registry import EMBEDDED_DEFAULT, with_template

    return with_template(model or EMBEDDED_DEFAULT, template)


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


def cmd_run(args: argparse.Namespace) -> int:
    from .pipeline import load_config, run_pipeline

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
        say=lambda message: print(message, file=sys.stderr, flush=True),
    )
    print(f"report: {report} (every figure is read from {config.run_dir}/; under each table, what its figures mean)")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .pipeline import evaluate_run

    for name in ("tasks", "samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise TraceGymError(f"--{name}: must be at least 1, got {getattr(args, name)}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    report = evaluate_run(
        args.run_dir,
        methods=methods,
        split=args.split,
        tasks=args.tasks,
        samples=args.samples,
        model=args.model,
        say=lambda message: print(message, file=sys.stderr, flush=True),
    )
    print(f"report: {report} (the table: {args.run_dir}/eval/results.md)")
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    from .pipeline import route_run

    if args.message and (args.split or args.tasks):
        raise TraceGymError("give --message, or --split/--tasks, not both")
    if args.tasks is not None and args.tasks < 1:
        raise TraceGymError(f"--tasks: must be at least 1, got {args.tasks}")
    decisions = route_run(args.run_dir, messages=args.message, split=args.split, tasks=args.tasks)
    for task, decision in decisions:
        if args.json:
            print(json.dumps({"task": task, **decision.as_dict()}))
        else:
            shown = decision.calibrated or decision.scores
            scores = ", ".join(f"{k} {v:.2f}" for k, v in shown.items())
            print(
                f"{str(task)[:60]}: {decision.capability or 'none'} (adapter {decision.adapter or 'none'}; "
                f"{'calibrated ' if decision.calibrated else ''}scores {scores})"
            )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import ROUTED, make_server, served_from_run, served_model

    if args.run_dir and (args.model or args.chat_template):
        raise TraceGymError("give RUN (its policy is served, under its own chat template) or --model, not both")
    adapters = {}
    for item in args.adapter or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise TraceGymError(f"--adapter: expected NAME=PATH, got {item!r}")
        if not (Path(path) / "adapter_config.json").exists():
            raise TraceGymError(f"--adapter {name}: no LoRA adapter at {path} (no adapter_config.json there)")
        adapters[name] = path
    if args.run_dir:
        served = served_from_run(args.run_dir)
        for name, path in adapters.items():
            served.backend.load_adapter(name, path)
    else:
        from .llm import EMBEDDED_DEFAULT

        served = served_model(model_spec(args.model or EMBEDDED_DEFAULT, args.chat_template), adapters)
    try:
        server = make_server(
            served,
            args.host,
            args.port,
            log=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
            api_key=args.api_key or os.environ.get("TRACE_GYM_SERVE_API_KEY") or None,
            allow_adapter_loading=args.allow_adapter_loading,
        )
    except OSError as exc:
        raise TraceGymError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    host, port = server.server_address[:2]
    routed = f"'{ROUTED}' routes each conversation; " if served.router is not None else ""
    print(f"serving {', '.join(served.models())} at http://{host}:{port}/v1 ({routed}Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .training import GRPOTrainingConfig, ranks, train

    options = {
        "iterations": args.iterations,
        "groups": args.groups,
        "rollouts_per_group": args.rollouts_per_group,
        "learning_rate": args.lr,
        "lora_rank": args.lora_rank,
        "hint_share": args.hint_share,
        "max_new_tokens": args.max_new_tokens,
        "max_steps": args.max_steps,
        "sandbox_backend": args.backend,
        "torch_threads": args.threads,
        "seed": args.seed,
        "model": model_spec(args.model, args.chat_template),
        "micro_batch": args.micro_batch,
        "dtype": args.dtype,
        "max_draws": args.max_draws,
        "level": args.level,
    }
    if args.no_calibrate:
        options["calibrate"] = False
    if args.train_anyway:
        options["train_anyway"] = True
    if args.train_unvalidated:
        options["train_unvalidated"] = args.train_unvalidated
    config = GRPOTrainingConfig(
        env_ids=[e.strip() for e in args.env.split(",") if e.strip()],
        out=args.out,
        device=args.device,
        use_vllm=args.use_vllm,
        **{k: v for k, v in options.items() if v is not None},
    )
    result = train(config, resume=args.resume)
    if not ranks.is_main():  # under a launcher, rank 0 speaks for the run
        return 0
    if args.json:
        print(json.dumps({k: str(v) if hasattr(v, "parts") else v for k, v in vars(result).items()}))
    else:
        reward = "n/a" if result.final_mean_reward is None else f"{result.final_mean_reward:.3f}"
        print(
            f"adapter: {result.adapter}  iterations {result.iterations}, rollouts {result.rollouts}, "
            f"last mean reward {reward}, log {result.log}"
        )
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from .training.sft import sft

    options = {
        "model": model_spec(args.model, args.chat_template),
        "min_reward": args.min_reward,
        "epochs": args.epochs,
        "learning_rate": args.lr,
        "batch_size": args.batch_size,
        "micro_batch": args.micro_batch,
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "max_tokens": args.max_tokens,
        "dtype": args.dtype,
        "torch_threads": args.threads,
        "seed": args.seed,
        "save_steps": args.save_steps,
    }
    config = SFTTrainingConfig(
        resume=args.resume,
        trajectories=[p.strip() for p in args.trajectories.split(",") if p.strip()],
        out=args.out,
        device=args.device,
        **{k: v for k, v in options.items() if v is not None},
    )
    result = sft(config)
    losses = "n/a" if result.first_loss is None else f"{result.first_loss:.3f} -> {result.last_loss:.3f}"
    print(
        f"policy: {result.policy}  ({result.episodes} demonstrations, {result.steps} steps, loss {losses}, "
        f"{result.wall_s:.0f} s; adapter {result.adapter})"
    )
    return 0


def cmd_baseline_gepa(args: argparse.Namespace) -> int:
    from .evaluation import results_table, write_results
    from .gepa_baseline import DEFAULT_SEED_PROMPT, GEPAConfig, GEPAError, evaluate_prompt, run_gepa
    from .llm import EMBEDDED_DEFAULT

    seed_prompt = args.seed_prompt or DEFAULT_SEED_PROMPT
    if seed_prompt.startswith("@"):
        try:
            seed_prompt = Path(seed_prompt[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise GEPAError(f"--seed-prompt {args.seed_prompt}: {exc.strerror}") from None
    config = GEPAConfig(
        env=args.env,
        budget=args.budget,
        out=args.out,
        model=model_spec(args.model or EMBEDDED_DEFAULT, args.chat_template),
        reflection=args.reflection,
        split=args.split,
        tasks=args.tasks,
        val_tasks=args.val_tasks,
        minibatch=args.minibatch,
        seed_prompt=seed_prompt,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        max_steps=args.max_steps,
        batch=args.batch,
        workers=args.workers,
        reflection_max_tokens=args.reflection_max_tokens,
        seed=args.seed,
    )
    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    outcome = run_gepa(config, resume=args.resume, say=say, progress=args.progress)
    result = None
    if not args.no_eval:
        say(f"the best prompt on the {args.eval_split} split")
        eval_dir = Path(args.out) / "eval"
        result = evaluate_prompt(
            config,
            outcome.best_prompt,
            eval_dir / "gepa.jsonl",
            split=args.eval_split,
            tasks=args.eval_tasks,
            samples=args.samples,
            cost={
                "train_rollouts": outcome.rollouts,
                "analyst_calls": outcome.reflection_calls,
                "wall_s": outcome.wall_s,
            },
        )
        write_results([result], eval_dir)
    if args.json:
        print(json.dumps({**outcome.as_dict(), "evaluation": result.as_dict() if result else None}))
        return 0
    print(
        f"best prompt: candidate {outcome.best_index} of {outcome.candidates}, validation score "
        f"{outcome.seed_val_score:.3f} (seed) -> {outcome.best_val_score:.3f} (best); {outcome.rollouts} of "
        f"{outcome.budget} episodes, {outcome.reflection_calls} reflection calls\n{outcome.best_prompt}"
    )
    if result is not None:
        print(results_table([result]), end="")
    if outcome.warning:
        print(f"WARNING: {outcome.warning}")
    print(f"search log: {Path(args.out) / 'search.jsonl'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .rollout import summarize
    from .store import read_trajectories

    rows = []
    for path in args.files:
        trajectories = read_trajectories(path)
        groups: dict[tuple[str, str], list] = {}
        for t in trajectories:
            groups.setdefault((t.agent, t.env_id), []).append(t)
        for (agent, env_id), group in sorted(groups.items()):
            s = summarize(group, env_id=env_id, agent=agent)
            rows.append(
                {
                    "agent": agent,
                    "env": env_id,
                    "episodes": str(s.episodes),
                    "pass rate": f"{s.successes / max(s.episodes, 1):.3f}",
                    "mean reward": f"{s.mean_reward:.3f}",
                    "file": path,
                }
            )
    print(format_table(rows, ["agent", "env", "episodes", "pass rate", "mean reward", "file"]))
    return 0


def format_table(rows: list[dict[str, str]], columns: list[str]) -> str:
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    line = lambda values: "  ".join(str(v).ljust(widths[c]) for c, v in zip(columns, values))  # noqa: E731
    out = [line(columns), line(["-" * widths[c] for c in columns])]
    out += [line([r.get(c, "") for c in columns]) for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
