"""Quickstart: the oracle and the random agent on τ²-retail's test split, offline.

Run with `make quickstart`. Trajectories land in runs/quickstart/; rerunning
resumes (nothing already played is played again).
"""

from pathlib import Path

from trace_gym.cli import format_table
from trace_gym.rollout import rollout

ENV = "trace/tau2-retail-v0"
OUT = Path("runs/quickstart")


def main() -> None:
    rows = []
    for agent in ("oracle", "random"):
        summary = rollout(ENV, agent, OUT / f"{agent}.jsonl", split="test", resume=True)
        rows.append(
            {
                "agent": agent,
                "env": ENV,
                "episodes": str(summary.episodes),
                "pass rate": f"{summary.successes / summary.episodes:.3f}",
                "mean reward": f"{summary.mean_reward:.3f}",
                "wall s": f"{summary.wall_s:.1f}",
            }
        )
    print(format_table(rows, ["agent", "env", "episodes", "pass rate", "mean reward", "wall s"]))
    print(f"trajectories: {OUT}/")


if __name__ == "__main__":
    main()
