"""How much of its demonstrations does a warm start see, and how well does it fit them?

Two figures about an SFT warm start and the data it was made from (the Makefile's
`warm-start`: the oracle on a target's train split):

1. What fits the model's context. SFT cuts each demonstration after its last agent
   turn within the context (`sft --max-tokens`, the model's by default): every turn past
   the cut is never trained on. Per demonstration: its tokens, and how many of its writes
   (state-changing calls) survive the cut.
2. What the policy reproduces under teacher forcing, on the demonstrations as trained
   (cut as SFT cuts them): the share of agent turns whose every token is the policy's
   greedy choice given the demonstration so far, for reads and for writes, and the first
   token a write turn gets wrong. A turn the policy cannot reproduce even here it will not
   produce in a rollout either.

Forward passes only (no generation): about 60 s a demonstration of 8k tokens on one
thread here. `--model` takes a spec with a template (`smollm2-135m-instruct?template=
chatml_compact_tools`) and `--fit 0` skips the forward passes: how much another template
would let SFT see, in a minute.

Usage: python benchmarks/warm_start_fit.py [--env trace/tau2-retail-v0]
       [--model smollm2-135m-tau2-retail-sft] [--trajectories FILE] [--tasks N]
       [--fit N] [--out runs/warm-start-fit]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trace_gym.cli import count  # noqa: E402 (after the environment is set)


def turn_spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s: one agent turn each."""
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="trace/tau2-retail-v0")
    parser.add_argument("--model", default="smollm2-135m-tau2-retail-sft")
    parser.add_argument(
        "--trajectories", default=None, help="demonstrations (default: the oracle on --env's train split)"
    )
    parser.add_argument(
        "--tasks", type=count, default=None, help="the oracle on the first N train tasks (default: all)"
    )
    parser.add_argument("--fit", type=int, default=16, help="demonstrations the teacher-forced check reads (0: none)")
    parser.add_argument("--max-tokens", type=count, default=None, help="SFT's cut (default: the model's context)")
    parser.add_argument("--threads", type=count, default=None)
    parser.add_argument("--out", default="runs/warm-start-fit")
    args = parser.parse_args()

    import torch

    from trace_gym.actions import parse_action
    from trace_gym.llm import make_backend
    from trace_gym.rollout import rollout
    from trace_gym.tools import changes_state
    from trace_gym.training.sft import demonstration_episode, demonstration_rows, env_tools, load_demonstrations

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = args.trajectories
    if path is None:
        path = str(out / "oracle-train.jsonl")
        rollout(args.env, "oracle", path, split="train", limit=args.tasks, progress=False, resume=Path(path).exists())
    demos, _ = load_demonstrations([path], 1.0)
    backend = make_backend(args.model)
    context = args.max_tokens or backend.context_size or 8192  # as sft cuts
    tools: dict[str, list] = {}

    lengths, writes_all, writes_kept, lost_all, with_writes = [], 0, 0, 0, 0
    for demo in demos:
        if demo.env_id not in tools:
            tools[demo.env_id] = env_tools(demo.env_id)
        episode = demonstration_episode(backend, demo, tools[demo.env_id])
        lengths.append(len(episode.ids))
        agent = [m for m in demo.messages if m.raw is not None]
        writes = [any(changes_state(c.name) for c in m.tool_calls or []) for m in agent]
        while episode.turns and len(episode.ids) > context:
            episode.turns.pop()
        kept = sum(writes[: len(episode.turns)])
        with_writes += any(writes)
        writes_all += sum(writes)
        writes_kept += kept
        lost_all += bool(sum(writes)) and not kept
    print(f"warm_start_fit: {args.model} on {len(demos)} demonstrations of {args.env} ({path})")
    print(
        f"  tokens: median {statistics.median(lengths):.0f}, max {max(lengths)}; over the {context}-token context: "
        f"{sum(n > context for n in lengths)} of {len(demos)}"
    )
    print(
        f"  writes kept by SFT's cut: {writes_kept} of {writes_all}; demonstrations with writes that lose every one: "
        f"{lost_all} of {with_writes}"
    )

    if not args.fit:
        return
    tokenizer, model = backend.tokenizer, backend.model
    model.eval()
    t0 = time.perf_counter()
    counts = {"read": [0, 0], "write": [0, 0], "message": [0, 0]}
    misses: list[str] = []
    rows = demonstration_rows(backend, demos[: args.fit], context)
    for row in rows:
        ids = torch.tensor([[*row["prompt_ids"], *row["completion_ids"]]], device=backend.device)
        keep = len(row["completion_ids"])
        with torch.no_grad():
            greedy = model(input_ids=ids, logits_to_keep=keep + 1).logits[0, :-1].argmax(-1).tolist()
        gold = row["completion_ids"]
        for start, end in turn_spans(row["completion_mask"]):
            action = parse_action(tokenizer.decode(gold[start:end], skip_special_tokens=True))
            kind = "message" if not action.is_tool_call else "read"
            if any(changes_state(call.name) for call in action.tool_calls):
                kind = "write"
            wrong = next((k for k in range(start, end) if greedy[k] != gold[k]), None)
            counts[kind][0] += 1
            counts[kind][1] += wrong is None
            if kind == "write" and wrong is not None:
                misses.append(
                    f"    ...{tokenizer.decode(gold[max(start, wrong - 12) : wrong])!r}: "
                    f"{tokenizer.decode(gold[wrong : wrong + 4])!r} taught, {tokenizer.decode([greedy[wrong]])!r} chosen"
                )
    print(
        f"  teacher-forced, greedy, in {backend.dtype}, {len(rows)} demonstrations as SFT cuts them "
        f"({time.perf_counter() - t0:.0f} s):"
    )
    for kind, (n, exact) in counts.items():
        if n:
            print(f"    {kind} turns reproduced token for token: {exact} of {n} ({exact / n:.2f})")
    if misses:
        print("  where each missed write turn first goes wrong:")
        print("\n".join(misses))


if __name__ == "__main__":
    main()
