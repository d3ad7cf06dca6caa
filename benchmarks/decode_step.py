"""A decode step of the embedded model as evaluation runs it on τ²-retail.

The workload: 16 rows over τ²-retail's real shared prefix (system policy + tool
schemas, ~5.2k tokens), each row with its own tokens drawn at random from that
prompt (300 to 2,600 of them, as an episode's history grows), sampled greedily.
The rows stop at different lengths (per-row token budgets drawn from
``--min-new``..``--max-new``; stop tokens are switched off so the lengths are the
budgets), as a batch of replies does: the batch decodes until its longest row
ends. Each configuration is timed on the same rows after a warm-up call (which
fills the prefix cache, so prefill is the rows' own tokens only).

Two configurations, on the same rows: rows that have stopped kept in the batch
to its end (as before they were dropped), and dropped once they are
``DROP_FINISHED`` of it (the default). Prints, per run, the prefill +
first-token time, the decode time, the decode steps, seconds per step, and the
share of a full batch's row-steps that belong to rows that had already stopped
(what dropping them can save); then whether every run sampled the same tokens.
``--profile`` adds torch.profiler's top operators for one call of the default.

Usage: python benchmarks/decode_step.py [--rows 16] [--min-new 16] [--max-new 96] [--repeats 2] [--profile]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import gymnasium as gym

import trace_gym  # noqa: F401
from trace_gym.agents import LLMAgent
from trace_gym.cli import count
from trace_gym.llm import EMBEDDED_DEFAULT, GenerationRequest, make_backend
from trace_gym.llm.local import model as local_model
from trace_gym.rollout import Episode, _start

ENV = "trace/tau2-retail-v0"


def workload(backend, rows: int, min_new: int, max_new: int, seed: int = 0) -> list[GenerationRequest]:
    env = gym.make(ENV, split="test", max_steps=4)
    agent = LLMAgent(backend, max_new_tokens=8)
    _start(env, agent, Episode(env.unwrapped.task_ids[1], 0, 0))
    request = agent.request()
    ids, prefix_len = backend.encode_conversation(request.messages, request.tools)
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        own = [rng.choice(ids) for _ in range(rng.randint(300, 2600))]
        out.append(
            GenerationRequest(
                messages=request.messages,
                tools=request.tools,
                prompt_ids=ids[:prefix_len] + own,
                prefix_len=prefix_len,
                max_new_tokens=rng.randint(min_new, max_new),
            )
        )
    return out


def timed(backend, requests: list[GenerationRequest]) -> dict:
    t0 = time.perf_counter()
    completions = backend.complete(requests)
    wall = time.perf_counter() - t0
    stats = backend.last_stats
    lengths = [len(c.tokens.completion_ids) for c in completions]
    steps = max(lengths) - 1
    idle = sum(steps - (n - 1) for n in lengths)  # row-steps of rows that had already stopped
    decode = stats["total_s"] - stats["ttft_s"]
    return {
        "wall": wall,
        "ttft": stats["ttft_s"],
        "decode": decode,
        "steps": steps,
        "step_s": decode / max(steps, 1),
        "idle": idle / max(steps * len(lengths), 1),
        "ids": [c.tokens.completion_ids for c in completions],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=count, default=16)
    parser.add_argument("--min-new", type=count, default=16)
    parser.add_argument("--max-new", type=count, default=96)
    parser.add_argument("--repeats", type=count, default=2)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.min_new > args.max_new:
        parser.error(f"--min-new ({args.min_new}) is above --max-new ({args.max_new})")

    backend = make_backend(EMBEDDED_DEFAULT)
    backend.max_batch = args.rows
    backend.stop_ids = set()
    backend.drafts = None  # every repeat decodes: with drafts, a repeat would take the first run's replies whole
    requests = workload(backend, args.rows, args.min_new, args.max_new)
    prefix = requests[0].prefix_len
    own = [len(r.prompt_ids) - prefix for r in requests]
    print(
        f"device: {backend.device} ({backend.dtype}), {EMBEDDED_DEFAULT}, {ENV}: {args.rows} rows over a "
        f"{prefix}-token shared prefix, {min(own)}..{max(own)} own tokens, {args.min_new}..{args.max_new} new "
        "tokens a row (greedy, no stop tokens)"
    )
    backend.complete([GenerationRequest(**{**vars(requests[0]), "max_new_tokens": 1})])  # the prefix, cached
    configs = {"keep stopped rows": 2.0, "drop stopped rows": local_model.DROP_FINISHED}  # (2.0: never dropped)
    runs = {}
    for name, share in configs.items():
        local_model.DROP_FINISHED = share
        runs[name] = [timed(backend, requests) for _ in range(args.repeats)]
    print(
        f"{'configuration':<18} {'run':>3} {'wall s':>7} {'prefill s':>9} {'decode s':>8} {'steps':>5} "
        f"{'s/step':>7} {'stopped row-steps':>17}"
    )
    for name, done in runs.items():
        for k, r in enumerate(done, 1):
            print(
                f"{name:<18} {k:>3} {r['wall']:>7.1f} {r['ttft']:>9.1f} {r['decode']:>8.1f} {r['steps']:>5} "
                f"{r['step_s']:>7.3f} {r['idle']:>17.0%}"
            )
    every = [r for done in runs.values() for r in done]
    same = all(r["ids"] == every[0]["ids"] for r in every)
    medians = {name: statistics.median(r["step_s"] for r in done) for name, done in runs.items()}
    keep, drop = medians.values()
    print(
        f"median s/step: {keep:.3f} keeping stopped rows, {drop:.3f} dropping them ({drop / keep - 1:+.0%}); "
        f"every run's tokens {'agree' if same else 'DIFFER'}"
    )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            backend.complete(requests)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
