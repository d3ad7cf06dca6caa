"""Does a capability adapter change what the policy does on the target itself? The policy
with and without one adapter on the target's held-out tasks, greedy, the same caps, each
episode labelled by an analyst (the gold one by default): pass rate, mean reward, every
capability's LACKING rate with a 95% Wilson interval, and per capability the paired change
(adapter minus base, on the tasks where it applies to both) with a 95% bootstrap interval
over tasks. A pass rate of 0 for both says nothing about the capabilities; these do.

Only the test split is played (evaluation's data: nothing trains on it). Both rollouts are
resumable trajectory files in --out (base.jsonl, adapter.jsonl).

Usage: python benchmarks/adapter_on_target.py --adapter DIR [--env trace/tau2-retail-v0]
       [--model smollm2-135m-tau2-retail-sft] [--tasks N] [--max-steps 16] [--max-new-tokens 128]
       [--batch 8] [--analyst gold] [--out runs/adapter-on-target]
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trace_gym.cli import count  # noqa: E402 (after the environment is set)


def paired_change(base: dict[str, str], other: dict[str, str], rng: random.Random) -> tuple[int, float, float, float]:
    """Over the tasks where the capability applies in both: (tasks, mean change in LACKING, 95% interval)."""
    from trace_gym.identification.stats import LACKING, PRESENT

    tasks = [k for k in base if base[k] in (LACKING, PRESENT) and other.get(k) in (LACKING, PRESENT)]
    diffs = [(other[k] == LACKING) - (base[k] == LACKING) for k in tasks]
    if not diffs:
        return 0, float("nan"), float("nan"), float("nan")
    boot = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(10_000))
    return len(diffs), sum(diffs) / len(diffs), boot[249], boot[9749]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", default=None, help="the LoRA adapter folder (e.g. a learning_curve.py run's)")
    parser.add_argument("--env", default="trace/tau2-retail-v0")
    parser.add_argument("--model", default="smollm2-135m-tau2-retail-sft")
    parser.add_argument("--tasks", type=count, default=None, help="only the first N test tasks (default: all)")
    parser.add_argument("--max-steps", type=count, default=16)
    parser.add_argument("--max-new-tokens", type=count, default=128)
    parser.add_argument("--batch", type=count, default=8)
    parser.add_argument("--analyst", default="gold", help="gold, milestone or reference (no LLM)")
    parser.add_argument("--out", default="runs/adapter-on-target")
    args = parser.parse_args()
    if args.adapter is None:  # `make bench` runs every script bare: nothing to compare without an adapter
        print("adapter_on_target.py: SKIPPED: it needs --adapter DIR, a capability adapter to compare with the base")
        return

    from trace_gym.evaluation.results import lacking_rates
    from trace_gym.identification import make_analyst
    from trace_gym.rollout import rollout
    from trace_gym.store import read_trajectories

    out = Path(args.out)
    analyst = make_analyst(args.analyst)
    labels, played = {}, {}
    for who in ("base", "adapter"):
        agent = {"model": args.model, "max_new_tokens": args.max_new_tokens}
        agent |= {"adapter": args.adapter} if who == "adapter" else {}
        path = out / f"{who}.jsonl"
        summary = rollout(
            args.env, "llm", path, agent_kwargs=agent, split="test", limit=args.tasks, resume=True,
            env_kwargs={"max_steps": args.max_steps}, batch=args.batch, progress=False,
        )  # fmt: skip
        played[who] = {t.task_id: t for t in read_trajectories(path)}
        labels[who] = [label for t in played[who].values() for label in analyst.label(t)]
        print(
            f"{who}: {summary.episodes} episodes, pass rate {summary.successes / max(summary.episodes, 1):.3f}, "
            f"mean reward {summary.mean_reward:.3f}, given up {sum(bool(t.error) for t in played[who].values())}"
        )
    capabilities = sorted({label.capability for label in labels["base"]})
    task_of = {t.episode_id: t.task_id for who in played for t in played[who].values()}
    rng = random.Random(0)
    print("\n| capability | base LACKING | adapter LACKING | paired change (tasks) |")
    print("| --- | --- | --- | --- |")
    rates = {who: lacking_rates(labels[who], capabilities) for who in labels}
    for capability in capabilities:
        cells = []
        for who in ("base", "adapter"):
            r = rates[who][capability]
            cells.append(
                "-"
                if r["rate"] is None
                else f"{r['rate']:.3f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] (n={r['episodes']})"
            )
        by_task = {
            who: {task_of[x.episode_id]: x.label for x in labels[who] if x.capability == capability} for who in labels
        }
        n, change, low, high = paired_change(by_task["base"], by_task["adapter"], rng)
        print(f"| {capability} | {cells[0]} | {cells[1]} | {change:+.3f} [{low:+.3f}, {high:+.3f}] ({n}) |")


if __name__ == "__main__":
    main()
