"""Does GRPO make the policy better? The reward of a policy trained on a calibrated
reference env, iteration by iteration, through `trace_gym.training.train` (what
`trace-gym train` runs): calibration to the policy first, dynamic sampling on.

It prints, per iteration, the mean reward of the first draw of every group (an
unbiased sample of the policy on the env: redrawn groups are left out of it),
the informative groups the update saw and the episodes played; then the mean
reward of the first and the last 5 iterations, their difference with a 95%
bootstrap interval (groups resampled within each window: a group's K episodes
share a seed and are not independent), the informative-group share and the
wall time. Goal: the interval lies above 0.

Defaults: the quickstart's policy (the embedded model warm-started on
τ²-retail's train split), tool-precision, G4 x K4, 30 iterations, learning
rate 1e-4 (ours: the paper's 1e-5 is for 8B models and 40 iterations on GPUs;
a 135M model moves little at it in 30), everything else the paper's.

Usage: python benchmarks/learning_curve.py [--env trace/tool-precision-v0]
       [--model smollm2-135m-tau2-retail-sft] [--iterations 30] [--lr 1e-4] [--micro-batch N] [--threads N]
       [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trace_gym.cli import count  # noqa: E402 (after the environment is set)

WINDOW = 5


def window_groups(rows: list[dict], first: bool) -> list[list[float]]:
    chosen = rows[:WINDOW] if first else rows[-WINDOW:]
    return [[r for r in group if r is not None] for row in chosen for group in row["first_draw_groups"] if group]


def bootstrap_difference(
    before: list[list[float]], after: list[list[float]], draws: int = 10000, seed: int = 0
) -> tuple[float, float, float]:
    """(difference of means, 2.5th and 97.5th percentiles) of after - before, groups resampled."""
    rng = random.Random(seed)

    def mean(groups: list[list[float]]) -> float:
        return statistics.fmean(r for g in groups for r in g)

    samples = sorted(
        mean([rng.choice(after) for _ in after]) - mean([rng.choice(before) for _ in before]) for _ in range(draws)
    )
    return mean(after) - mean(before), samples[int(0.025 * draws)], samples[int(0.975 * draws) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="trace/tool-precision-v0")
    parser.add_argument("--model", default="smollm2-135m-tau2-retail-sft")
    parser.add_argument("--iterations", type=count, default=30)
    parser.add_argument("--groups", type=count, default=4)
    parser.add_argument("--rollouts-per-group", type=count, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-new-tokens", type=count, default=128)
    parser.add_argument(
        "--max-steps", type=count, default=None, help="agent actions per episode (default: the env's own)"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--micro-batch", type=count, default=None, help="episodes per forward/backward pass (default: K, one group)"
    )
    parser.add_argument("--threads", type=count, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="keep the run here (default: a temporary folder)")
    args = parser.parse_args()
    if args.iterations < 2 * WINDOW:
        print(f"learning_curve: --iterations must be at least {2 * WINDOW} (two windows of {WINDOW})", file=sys.stderr)
        return 2

    from trace_gym.errors import TraceGymError
    from trace_gym.training import GRPOTrainingConfig, train

    folder = args.out or tempfile.mkdtemp(prefix="learning-curve-")
    config = GRPOTrainingConfig(
        env_ids=[args.env],
        out=os.path.join(folder, "run"),
        model=args.model,
        iterations=args.iterations,
        groups=args.groups,
        rollouts_per_group=args.rollouts_per_group,
        learning_rate=args.lr,
        max_new_tokens=args.max_new_tokens,
        max_steps=args.max_steps,
        temperature=args.temperature,
        torch_threads=args.threads,
        micro_batch=args.micro_batch,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    try:
        result = train(config, progress=False, resume=os.path.exists(os.path.join(config.out, "run.json")))
    except TraceGymError as exc:
        print(f"learning_curve: {exc}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in result.log.read_text().splitlines()]
    calibration = json.loads((result.out / "calibration.json").read_text())["calibrations"][0]
    print(
        f"learning curve: {args.model} on {args.env}, G{args.groups} x K{args.rollouts_per_group}, lr {args.lr}, "
        f"temperature {args.temperature}, max_new_tokens {args.max_new_tokens}, max_steps {args.max_steps or 'env default'}, "
        f"{args.iterations} iterations, dynamic sampling up to {config.max_draws} draws, run in {folder}"
    )
    for figures in calibration["figures"]:
        print(
            f"calibration level {figures['level']}: mean reward {figures['mean_reward']}, "
            f"informative groups {figures['informative_groups']:.0%}, {figures['episodes']} episodes"
        )
    print(f"trained at level {calibration['level']}: {calibration['reason']}")
    history = json.loads((result.out / "run.json").read_text()).get("env_code", [])
    if history and history[0]["from_iteration"] > 1:  # (a run begun before runs recorded it)
        print(f"the env's code is recorded from iteration {history[0]['from_iteration']} on only")
    for change in history[1:]:  # (a resume over other env code: the curve spans two envs from there)
        print(f"WARNING: the env's code changed at iteration {change['from_iteration']} (a resume over new code)")
    print(f"{'iter':>4} {'reward':>7} {'informative':>11} {'draws':>5} {'episodes':>8} {'loss':>8} {'wall s':>7}")
    for r in rows:
        reward = "n/a" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}"
        print(
            f"{r['iteration']:>4} {reward:>7} {r['informative_groups']:>4}/{args.groups:<6} {r['draws']:>5} "
            f"{r['episodes_played']:>8} {r['loss']:>8.4f} {r['wall_s']:>7.1f}"
        )
    before, after = window_groups(rows, True), window_groups(rows, False)
    diff, low, high = bootstrap_difference(before, after)
    mean = lambda groups: statistics.fmean(x for g in groups for x in g)  # noqa: E731
    informative = sum(r["informative_groups"] for r in rows) / (len(rows) * args.groups)
    print(f"mean reward, first {WINDOW} iterations: {mean(before):.3f}; last {WINDOW}: {mean(after):.3f}")
    print(
        f"difference {diff:+.3f}, 95% bootstrap interval [{low:+.3f}, {high:+.3f}] "
        f"(goal: above 0: {'met' if low > 0 else 'NOT met'})"
    )
    print(
        f"informative groups in the update: {informative:.0%}; episodes: {rows[-1]['episodes_played']} trained + "
        f"{rows[-1]['calibration_episodes']} calibration; wall time {wall / 60:.1f} min (model load included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
