"""Analyst calls and tokens per 100 trajectories: one call per (trajectory,
capability) pair against one call per trajectory for all capabilities.

Labels 100 planted-deficit trajectories of τ²-retail with the six gold
capabilities through a local OpenAI-compatible server whose answers replay the
gold analyst, counting requests and tokens. Tokens are counted with a real
tokenizer, the embedded SmolLM2's (offline, from the model cache): each
request's messages through its chat template, and each answer's text. Another
analyst model's tokenizer gives somewhat different counts; where transformers
is not installed the script says so and prints a characters / 4 estimate.
The answers are the gold labels with a short placeholder evidence quote, so completion
tokens are a lower bound (a real analyst quotes longer evidence); prompt
tokens, which dominate, are exactly what our prompts cost.
Usage: python benchmarks/analyst_cost.py [N]   (N trajectories, default 100; figures are per 100)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from openai_double import OpenAIDouble  # noqa: E402

from trace_gym.identification import GOLD_CAPABILITIES, GoldActionAnalyst, make_analyst  # noqa: E402
from trace_gym.rollout import rollout  # noqa: E402
from trace_gym.store import read_trajectories  # noqa: E402
from trace_gym.cli import count


def token_counter():
    """(count prompt tokens of a message list, count tokens of a text, label), from the embedded model's tokenizer."""
    try:
        from transformers import AutoTokenizer

        from trace_gym.llm.embedded import ensure_embedded_model
    except ImportError:
        chars = lambda text: len(text) // 4  # noqa: E731
        return (
            (lambda messages: sum(chars(m["content"] or "") for m in messages)),
            chars,
            "ESTIMATE (characters / 4; no tokenizer)",
        )
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()), local_files_only=True)
    text = lambda value: len(tokenizer.encode(value, add_special_tokens=False))  # noqa: E731
    prompt = lambda messages: text(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))  # noqa: E731
    return prompt, text, "counted with the SmolLM2-135M tokenizer"


def main(count: int = 100) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "planted.jsonl"
        rollout("trace/tau2-retail-v0", "planted", out, split="base", limit=count, progress=False)
        trajectories = read_trajectories(out)
    gold = {(x.episode_id, x.capability): x.label for t in trajectories for x in GoldActionAnalyst().label(t)}

    count_prompt, count_text, how = token_counter()
    counted = {"prompt": 0, "completion": 0}

    def answer(body):
        prompt = body["messages"][0]["content"]
        episode = prompt.split("episode ", 1)[1].split(",", 1)[0]
        if prompt.startswith("Label every capability"):
            labels = [
                {"capability": c, "label": gold[(episode, c)], "evidence": {"quote": "..."}} for c in GOLD_CAPABILITIES
            ]
            reply = json.dumps({"labels": labels})
        else:
            name = prompt.split('Capability "', 1)[1].split('"', 1)[0]
            reply = json.dumps({"label": gold[(episode, name)], "evidence": {"quote": "..."}})
        counted["prompt"] += count_prompt(body["messages"])
        counted["completion"] += count_text(reply)
        return {"content": reply}

    print(f"{len(trajectories)} trajectories x {len(GOLD_CAPABILITIES)} capabilities; tokens {how}")
    for per_trajectory in (False, True):
        counted.update(prompt=0, completion=0)
        with OpenAIDouble(answer) as server:
            analyst = make_analyst(
                "openai:double", base_url=server.base_url, api_key="test-key", per_trajectory=per_trajectory
            )
            analyst.label_all(trajectories, GOLD_CAPABILITIES)
        mode = "one call per trajectory" if per_trajectory else "one call per pair     "
        scale = 100 / len(trajectories)
        total = counted["prompt"] + counted["completion"]
        print(
            f"{mode}: {analyst.calls * scale:6.0f} calls, {total * scale:9,.0f} tokens per 100 trajectories "
            f"({counted['prompt'] * scale:,.0f} prompt + {counted['completion'] * scale:,.0f} completion)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "count",
        nargs="?",
        type=count,
        default=100,
        help="trajectories to label (figures are per 100) (default: %(default)s)",
    )
    args = parser.parse_args()
    main(args.count)
