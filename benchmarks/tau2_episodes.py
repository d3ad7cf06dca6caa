"""Full τ²-retail episodes with the embedded model (no step cap beyond the
env's own), in lock-step batches with the KV cache: wall time for N episodes.

Target (issue #11): >= 10 full episodes in under 10 minutes on a 2-core CPU.
Usage: python benchmarks/tau2_episodes.py [EPISODES] [BATCH] [MAX_NEW_TOKENS]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from trace_gym.rollout import rollout
from trace_gym.cli import count

ENV = "trace/tau2-retail-v0"


def main(episodes: int = 10, batch: int = 10, max_new_tokens: int = 64) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary = rollout(
            ENV,
            "llm",
            Path(tmp) / "smol.jsonl",
            split="test",
            limit=episodes,
            batch=batch,
            agent_kwargs={"max_new_tokens": max_new_tokens},
        )
        wall = time.perf_counter() - t0
    print(
        f"{summary.episodes} full {ENV} episodes with the embedded model, batch {batch}, "
        f"<= {max_new_tokens} new tokens per turn: {wall:.0f} s wall (target < 600 s), "
        f"{wall / max(summary.episodes, 1):.1f} s per episode"
    )
    print(
        f"terminations: {summary.by_termination}; pass rate {summary.pass_at_1:.3f}; "
        f"tokens: {summary.prompt_tokens} prompt (conditioned on, mostly cached), {summary.completion_tokens} sampled"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("episodes", nargs="?", type=count, default=10, help="τ²-retail episodes (default: %(default)s)")
    parser.add_argument(
        "batch", nargs="?", type=count, default=10, help="episodes generated together (default: %(default)s)"
    )
    parser.add_argument(
        "max_new_tokens", nargs="?", type=count, default=64, help="tokens per model turn (default: %(default)s)"
    )
    args = parser.parse_args()
    main(args.episodes, args.batch, args.max_new_tokens)
