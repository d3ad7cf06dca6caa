"""Analyst calls and tokens per 100 trajectories: one call per (trajectory,
capability) pair against one call per trajectory for all capabilities.

Labels 100 planted-deficit trajectories of τ²-retail with the six gold
capabilities through a local OpenAI-compatible server whose answers replay the
gold analyst, counting requests and the prompt tokens our prompts cost (the
server counts 4 characters a token, as a tokenizer-free estimate).
Usage: python benchmarks/analyst_cost.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from openai_double import OpenAIDouble  # noqa: E402

from trace_gym.identification import GOLD_CAPABILITIES, GoldActionAnalyst, make_analyst  # noqa: E402
from trace_gym.rollout import rollout  # noqa: E402
from trace_gym.store import read_trajectories  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "planted.jsonl"
        rollout("trace/tau2-retail-v0", "planted", out, split="base", limit=100, progress=False)
        trajectories = read_trajectories(out)
    gold = {(l.episode_id, l.capability): l.label for t in trajectories for l in GoldActionAnalyst().label(t)}

    def answer(body):
        prompt = body["messages"][-1]["content"]
        episode = prompt.split("episode ", 1)[1].split(",", 1)[0]
        if prompt.startswith("Label every capability"):
            return {"content": json.dumps({"labels": [{"capability": c, "label": gold[(episode, c)]} for c in GOLD_CAPABILITIES]})}
        name = prompt.split('Capability "', 1)[1].split('"', 1)[0]
        return {"content": json.dumps({"label": gold[(episode, name)]})}

    print(f"{len(trajectories)} trajectories x {len(GOLD_CAPABILITIES)} capabilities")
    for per_trajectory in (False, True):
        with OpenAIDouble(answer) as server:
            analyst = make_analyst("openai:double", base_url=server.base_url, api_key="test-key", per_trajectory=per_trajectory)
            analyst.label_all(trajectories, GOLD_CAPABILITIES)
        mode = "one call per trajectory" if per_trajectory else "one call per pair     "
        scale = 100 / len(trajectories)
        print(f"{mode}: {analyst.calls * scale:6.0f} calls, {analyst.tokens * scale:9,.0f} tokens per 100 trajectories")


if __name__ == "__main__":
    main()
