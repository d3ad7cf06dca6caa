"""The training verbs: ``train`` (GRPO), ``sft`` (the warm start) and ``baseline gepa``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..llm.precision import DTYPES
from ..training.config import SFTTrainingConfig
from .common import TEMPLATE_HELP, count, model_spec, names, say


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add the ``train``, ``sft`` and ``baseline`` verbs to ``sub``, the top parser's subcommands."""
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
    warm.add_argument(
        "--whole-only",
        action="store_true",
        default=None,
        help="leave out a demonstration longer than --max-tokens instead of cutting it after its last agent turn "
        "that fits",
    )
    warm.add_argument(
        "--no-context-gradient",
        dest="context_gradient",
        action="store_false",
        default=None,
        help="gradients through the positions that predict the agent's tokens only, not through the tool "
        "results and user turns it read (about a forward pass a step; same forward)",
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


def add_torch_options(parser: argparse.ArgumentParser, resume_dtype: str) -> None:
    """Where and how a training verb runs the model: the same four options for GRPO and SFT
    (``resume_dtype``: what --resume does with --dtype, which differs between them)."""
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="model weights (default auto: bfloat16 on CUDA and on CPUs with bf16 instructions "
        f"(AVX512-BF16, AMX, Arm BF16), float32 elsewhere; the LoRA stays float32; {resume_dtype})",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=None)


def cmd_train(args: argparse.Namespace) -> int:
    from ..training import GRPOTrainingConfig, ranks, train

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
        env_ids=names(args.env, "--env"),
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
    from ..training.sft import sft

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
        "context_gradient": args.context_gradient,
        "whole_only": args.whole_only,
        "dtype": args.dtype,
        "torch_threads": args.threads,
        "seed": args.seed,
        "save_steps": args.save_steps,
    }
    config = SFTTrainingConfig(
        resume=args.resume,
        trajectories=names(args.trajectories, "--trajectories"),
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
    from ..evaluation import results_table, write_results
    from ..gepa_baseline import DEFAULT_SEED_PROMPT, GEPAConfig, GEPAError, evaluate_prompt, run_gepa
    from ..llm import EMBEDDED_DEFAULT

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
