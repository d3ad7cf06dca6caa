"""What a τ² episode costs without a model: the oracle on the first N tasks of a
domain, reset to score, through ``gym.make``; seconds per episode.

Each reset builds tau2's domain database from JSON and each score builds two
more (tau2's evaluator replays the episode and the gold actions). The target
pauses Python's cyclic collector around both (``collector_paused``); this
prints the cost with the pause, as shipped, and with it switched off here, in
alternating rounds so that both see the same machine.
Usage: python benchmarks/tau2_env_cost.py [DOMAIN] [TASKS] [ROUNDS]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from unittest import mock

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trace_gym.cli import count  # noqa: E402 (after the environment is set)


def main(domain: str = "retail", n_tasks: int = 30, rounds: int = 3) -> None:
    import gymnasium as gym

    import trace_gym  # noqa: F401
    from trace_gym.agents import OracleAgent
    from trace_gym.rollout import Episode, run_episode

    env = gym.make(f"trace/tau2-{domain}-v0", split="base")
    tasks = env.unwrapped.task_ids[:n_tasks]

    def per_episode() -> float:
        t0 = time.perf_counter()
        for task in tasks:
            run_episode(env, OracleAgent(), env.spec.id, Episode(task, 0, 0))
        return (time.perf_counter() - t0) / len(tasks)

    per_episode()  # warm-up: imports, first database
    paused, running = [], []
    for _ in range(rounds):
        paused.append(per_episode())
        with mock.patch("trace_gym.targets.tau2.env.collector_paused", contextlib.nullcontext):
            running.append(per_episode())
    env.close()
    p, r = statistics.median(paused), statistics.median(running)
    print(
        f"{env.spec.id}, oracle on {len(tasks)} tasks x {rounds} rounds: {p:.3f} s per episode with the "
        f"collector paused (shipped), {r:.3f} s without the pause ({r / p:.1f}x)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "domain", nargs="?", type=str, default="retail", help="τ² domain (retail, airline, ...) (default: %(default)s)"
    )
    parser.add_argument("tasks", nargs="?", type=count, default=30, help="tasks per round (default: %(default)s)")
    parser.add_argument(
        "rounds",
        nargs="?",
        type=count,
        default=3,
        help="alternating rounds with and without the pause (default: %(default)s)",
    )
    args = parser.parse_args()
    main(args.domain, args.tasks, args.rounds)
