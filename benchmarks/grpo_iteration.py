"""Wall time per GRPO iteration (G=4 seeds x K=4 rollouts, one optimizer step)
on CPU with the embedded SmolLM2-135M on a reference env, through the same
`trace_gym.training.train` that `trace-gym train` runs.

Goal: <= 60 s per iteration, so the paper's 40 iterations take under 40
minutes on CPU. The first iteration includes warm-up (sandbox workers
started, first prefill); the figure to compare is the mean over the later
ones, printed separately, split into episode play (rollout) and the TRL
update (reference and policy forward passes, backward, optimizer, checkpoint).
Timings depend on the machine's load: take them on an idle machine.

The update scores the rows' shared prompt once per micro-batch
(``shared_prefix_update``, the default); ``--whole-rows`` times TRL's own
passes, every row run whole, for comparison. While the adapter is fresh
(iteration 1) the policy is its own KL reference and TRL's reference pass is
skipped; ``--keep-reference-pass`` runs it, for comparison.

At the paper's scale, on a GPU: ``--random-model llama-3.1-8b`` (or qwen2.5-7b,
qwen3-8b) builds a model of that family's shapes from its config with random
weights, on the machine (nothing downloaded), with the embedded model's
tokenizer and tool-call template, and trains it; ``--env trace/tau2-retail-v0``
gives τ²-length prompts (its train split, the scripted user). Random weights
sample junk, so every group's reward is constant and the update's loss 0: the
figures are the work's time and memory, not learning (and the model's vocabulary is
its family's, larger than the tokenizer's: about two thirds of its samples decode to
nothing, so its turns are short on text; the tokens sampled are what is timed). ``--random-layers N``
keeps N layers (a smoke run on a CPU). Peak GPU memory is printed on cuda.

Usage: python benchmarks/grpo_iteration.py [--env trace/tool-precision-v0]
       [--iterations 3] [--max-new-tokens 64] [--threads N] [--device cpu] [--micro-batch N] [--dtype auto|float32|bfloat16] [--whole-rows] [--keep-reference-pass]
       [--model SPEC | --random-model llama-3.1-8b [--random-layers N]] [--gradient-checkpointing]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trace_gym.cli import count  # noqa: E402 (after the environment is set)
from trace_gym.llm.precision import DTYPES  # noqa: E402

GOAL_S = 60.0
EMBEDDED = "smollm2-135m-instruct"
FAMILIES = {  # the shapes of each family's config.json (public), nothing else of theirs
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
    ),
}


def random_model(family: str, folder: str, layers: int | None, device: str) -> tuple[str, int]:
    """Writes a bf16 model of ``family``'s shapes with random weights into ``folder``,
    with the embedded model's tokenizer (its ids fit any of these vocabularies) and
    tool-call template; returns (its ``hf:`` spec, its parameter count)."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trace_gym.llm.registry import local_folder, local_spec

    dims = dict(FAMILIES[family])
    kind = dims.pop("model_type")
    if layers:
        dims["num_hidden_layers"] = layers
    config = AutoConfig.for_model(kind, tie_word_embeddings=False, **dims)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    del model
    embedded, template = local_folder(EMBEDDED)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(embedded, name), folder)
    with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as out:
        out.write(template or "")
    return local_spec(folder), parameters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="trace/tool-precision-v0", help="reference env id")
    parser.add_argument("--iterations", type=count, default=3, help="iterations to time (the first is warm-up)")
    parser.add_argument("--groups", type=count, default=4)
    parser.add_argument("--rollouts-per-group", type=count, default=4)
    parser.add_argument("--max-new-tokens", type=count, default=64, help="tokens per model turn")
    parser.add_argument("--max-steps", type=count, default=None, help="agent actions per episode (default: the env's)")
    parser.add_argument("--threads", type=count, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--micro-batch", type=count, default=None, help="episodes per forward/backward pass (default: K)"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="model weights (auto: bfloat16 where the CPU has bf16 instructions)",
    )
    parser.add_argument("--whole-rows", action="store_true", help="TRL's own update passes (no shared prompt)")
    parser.add_argument(
        "--keep-reference-pass",
        action="store_true",
        help="run TRL's KL reference pass also while the fresh adapter is its own reference (iteration 1)",
    )
    parser.add_argument("--model", default=EMBEDDED, help="the policy: a model spec (default: the embedded model)")
    parser.add_argument(
        "--random-model", choices=sorted(FAMILIES), help="a random-weight model of this family's shapes instead"
    )
    parser.add_argument("--random-layers", type=count, default=None, help="layers of the random model (default: all)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in the backward")
    args = parser.parse_args()
    if args.random_layers is not None and not args.random_model:
        print("grpo_iteration: --random-layers needs --random-model", file=sys.stderr)
        return 2

    from trace_gym.errors import TraceGymError
    from trace_gym.training import GRPOTrainingConfig, train

    with tempfile.TemporaryDirectory(prefix="grpo-bench-") as folder:
        model, parameters = args.model, None
        if args.random_model:
            os.mkdir(os.path.join(folder, "model"))
            t0 = time.perf_counter()
            model, parameters = random_model(
                args.random_model, os.path.join(folder, "model"), args.random_layers, args.device
            )
            print(f"built {args.random_model} ({parameters / 1e9:.2f}B parameters) in {time.perf_counter() - t0:.0f} s")
            if args.device == "cuda":
                import torch

                torch.cuda.reset_peak_memory_stats()  # (the figure below is training's, not the build's)
        config = GRPOTrainingConfig(
            env_ids=[args.env],
            model=model,
            gradient_checkpointing=args.gradient_checkpointing,
            out=os.path.join(folder, "run"),
            iterations=args.iterations,
            groups=args.groups,
            rollouts_per_group=args.rollouts_per_group,
            max_new_tokens=args.max_new_tokens,
            max_steps=args.max_steps,
            torch_threads=args.threads,
            device=args.device,
            shared_prefix_update=not args.whole_rows,
            micro_batch=args.micro_batch,
            dtype=args.dtype,
            # the iteration's own work, as timed since the first version: no calibration, no redraws
            calibrate=False,
            train_anyway=True,
            max_draws=1,
        )
        t0 = time.perf_counter()
        try:
            result = train(config, progress=False, on_trainer=keep_reference_pass if args.keep_reference_pass else None)
        except TraceGymError as exc:  # a bad setting (e.g. --micro-batch 3) is one line
            print(f"grpo_iteration: {exc}", file=sys.stderr)
            return 2
        total = time.perf_counter() - t0
        rows = [json.loads(line) for line in result.log.read_text().splitlines()]
    import torch

    name = f"random {args.random_model} ({parameters / 1e9:.2f}B)" if args.random_model else args.model
    print(
        f"GRPO iteration on {args.env}, {name}, {args.device}, G{args.groups} x K{args.rollouts_per_group}, "
        f"max_new_tokens {args.max_new_tokens}, torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, "
        f"update: {'every row whole (TRL)' if args.whole_rows else 'shared prompt once per micro-batch'}, "
        f"micro-batch {args.micro_batch or args.rollouts_per_group}, weights {rows[0]['dtype'] if rows else '?'} (--dtype {args.dtype}), "
        f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}, "
        f"reference pass at iteration 1 {'kept' if args.keep_reference_pass else 'skipped (the fresh adapter is its own)'}"
    )
    print(f"{'iter':>4} {'wall s':>8} {'rollout s':>10} {'update s':>9} {'tokens':>7} {'reward':>7}")
    for r in rows:
        update = r["wall_s"] - r["rollout_s"]
        reward = "n/a" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}"
        print(
            f"{r['iteration']:>4} {r['wall_s']:>8.1f} {r['rollout_s']:>10.1f} {update:>9.1f} {r['tokens_sampled']:>7} {reward:>7}"
        )
    steady = [r["wall_s"] for r in rows[1:]] or [r["wall_s"] for r in rows]
    per_iteration = statistics.fmean(steady)
    print(
        f"wall time per GRPO iteration (G{args.groups}xK{args.rollouts_per_group}, "
        f"{'after warm-up' if len(rows) > 1 else 'one iteration, warm-up included'}): {per_iteration:.1f} s "
        + (  # (the goal is the embedded model's on a CPU)
            f"(goal <= {GOAL_S:.0f} s: {'met' if per_iteration <= GOAL_S else 'NOT met'}); "
            if args.model == EMBEDDED and not args.random_model and args.device == "cpu"
            else "; "
        )
        + f"40 iterations at this rate: {per_iteration * 40 / 60:.0f} min (an estimate); whole run incl. model load {total:.0f} s"
    )
    import resource

    # (the trainer runs in this process; sandbox workers, where an env needs them, are other processes)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
        1 if sys.platform == "darwin" else 1024
    )  # (KiB on Linux)
    print(f"peak resident memory of this process (rollout and update): {peak / 2**30:.2f} GiB")
    if args.device == "cuda":
        print(f"peak GPU memory allocated (rollout and update): {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    return 0


def keep_reference_pass(trainer) -> None:
    trainer.skip_identity_reference = False


if __name__ == "__main__":
    sys.exit(main())
