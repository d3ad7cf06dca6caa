"""The embedded default model against τ²-retail, offline, beside the oracle
(the ceiling) and a random agent (the floor): `python examples/compare_agents.py`.

The first run converts the embedded SmolLM2-135M
to safetensors (~30 s, once). The model runs on the CPU and plays full
episodes (no step cap beyond tau2's own) of the first test tasks, in one
lock-step batch: tau2's ~5k-token system prompt + tool schemas is computed once
and shared, and each episode's keys and values are extended turn by turn, so a
turn costs its new tokens, not the whole prompt again. The oracle and the
random agent play the whole test split (40 tasks). Trajectories land in
runs/compare_agents/; rerunning resumes instead of replaying.
"""

from pathlib import Path

from trace_gym.cli import format_table
from trace_gym.rollout import rollout

ENV = "trace/tau2-retail-v0"
OUT = Path("runs/compare_agents")
MODEL_EPISODES = 4  # full episodes with the embedded model
RUNS = [
    (
        "llm",
        "smollm2-135m-instruct (embedded)",
        dict(limit=MODEL_EPISODES, batch=MODEL_EPISODES, agent_kwargs={"max_new_tokens": 48}),
    ),
    ("oracle", "oracle (gold actions)", {}),
    ("random", "random (schema-valid calls)", {}),
]


def main() -> None:
    rows = []
    for agent, label, options in RUNS:
        summary = rollout(ENV, agent, OUT / f"{agent}.jsonl", split="test", resume=True, **options)
        tokens = (
            f"{(summary.prompt_tokens or 0) + (summary.completion_tokens or 0):,}" if summary.prompt_tokens else "-"
        )
        rows.append(
            {
                "agent": label,
                "episodes": str(summary.episodes),
                "pass rate": f"{summary.successes / summary.episodes:.3f}",
                "mean reward": f"{summary.mean_reward:.3f}",
                "tokens": tokens,
                "wall s": f"{summary.wall_s:.1f}",
            }
        )
    print(f"\n{ENV}, test split")
    print(format_table(rows, ["agent", "episodes", "pass rate", "mean reward", "tokens", "wall s"]))
    print(f"trajectories: {OUT}/  (trace-gym report {OUT}/*.jsonl)")


if __name__ == "__main__":
    main()
