"""LocalHF on the real workload: τ²-retail's first prompt (system policy + 15
tool schemas, ~5k tokens) and a 4-turn episode, with the embedded model.

1. Time per turn with the KV cache off and on, in one run, on the same greedy
   episode (cached and uncached generation give the same tokens, so the turns
   are the same work): time to first token and whole turn, and their ratios
   over the turns after the first. Targets (issue #11): >= 10x less time to
   first token, whole turn >= 3x faster.
2. Decode tokens/s at batch 1 and batch 8 on that prompt (every row
   generates exactly NEW_TOKENS: no early stop), decode time only, with
   shared-prefix attention off (each row's cache holds its own copy of the
   5k-token prefix) and on (the rows attend to one copy, read once per step).

Usage: python benchmarks/local_hf_throughput.py [NEW_TOKENS] [TURNS]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym

import trace_gym  # noqa: F401
from trace_gym.agents import LLMAgent
from trace_gym.llm import EMBEDDED_DEFAULT, GenerationRequest, make_backend
from trace_gym.rollout import Episode, _start
from trace_gym.cli import count

ENV = "trace/tau2-retail-v0"


def play_timed(backend, env, task: str, turns: int, new_tokens: int) -> list[dict]:
    """One greedy episode; each turn's time to first token, whole time and ids."""
    agent = LLMAgent(backend, max_new_tokens=new_tokens)
    run = _start(env, agent, Episode(task, 0, 0))
    timings = []
    for _ in range(turns):
        t0 = time.perf_counter()
        [completion] = backend.complete([agent.request()])
        stats = dict(
            backend.last_stats,
            turn_s=time.perf_counter() - t0,
            ids=completion.tokens.completion_ids,
            prompt=len(completion.tokens.prompt_ids),
        )
        timings.append(stats)
        action = agent.receive(completion)
        observation, _, terminated, truncated, info = env.step(action)
        run.stepped(agent, action, observation, info)  # the agent hears what the env answered
        if terminated or truncated:
            break
    agent.end_episode()
    return timings


def main(new_tokens: int = 32, turns: int = 4) -> None:
    backend = make_backend(EMBEDDED_DEFAULT)
    backend.drafts = None  # the cache-on episode replays the cache-off one: drafts would decode none of it
    env = gym.make(ENV, split="test", max_steps=2 * turns + 2)  # tau2 counts every message, the greeting too
    task = env.unwrapped.task_ids[1]
    print(
        f"device: {backend.device} ({backend.dtype}), model: {EMBEDDED_DEFAULT}, {ENV} task {task}, up to {turns} turns, "
        f"{new_tokens} new tokens at most per turn (greedy)"
    )

    backend.kv_cache = False
    off = play_timed(backend, env, task, turns, new_tokens)
    backend.kv_cache = True
    backend.clear_cache()
    on = play_timed(backend, env, task, turns, new_tokens)
    same = [t["ids"] for t in off] == [t["ids"] for t in on]
    print(
        f"\n{'turn':>4} {'prompt':>7} {'prefill off':>11} {'prefill on':>10} {'TTFT off s':>10} {'TTFT on s':>9} "
        f"{'turn off s':>10} {'turn on s':>9}"
    )
    for k, (a, b) in enumerate(zip(off, on), 1):
        print(
            f"{k:>4} {b['prompt']:>7} {a['prefill_tokens']:>11} {b['prefill_tokens']:>10} {a['ttft_s']:>10.2f} "
            f"{b['ttft_s']:>9.2f} {a['turn_s']:>10.2f} {b['turn_s']:>9.2f}"
        )
    later = list(zip(off, on))[1:]
    if later:
        ttft = statistics.mean(a["ttft_s"] for a, _ in later) / statistics.mean(b["ttft_s"] for _, b in later)
        whole = statistics.mean(a["turn_s"] for a, _ in later) / statistics.mean(b["turn_s"] for _, b in later)
        print(
            f"turns after the first, cache off / on: time to first token {ttft:.1f}x (target >= 10x), "
            f"whole turn {whole:.1f}x (target >= 3x); same tokens: {same}"
        )
    else:
        print("the episode ended after one turn: no later turn to compare")
    # Decode throughput on the real first prompt.
    agent = LLMAgent(backend)
    _start(env, agent, Episode(task, 0, 0))
    prompt = agent.request()
    eos = set(backend.stop_ids)
    backend.stop_ids = set()  # every row decodes exactly new_tokens
    supported = backend.shared_prefix
    rates = {}
    try:
        for shared in (False, True) if supported else (False,):
            backend.shared_prefix = shared
            label = "shared-prefix attention " + ("on" if shared else "off")
            for size in (1, 8):
                requests = [
                    GenerationRequest(
                        prompt.messages,
                        prompt_ids=prompt.prompt_ids,
                        prefix_len=prompt.prefix_len,
                        max_new_tokens=new_tokens,
                        temperature=1.0,
                        seed=s,
                    )
                    for s in range(size)
                ]
                backend.complete(requests)
                stats = backend.last_stats
                decode_s = stats["total_s"] - stats["ttft_s"]
                tokens = stats["decode_tokens"] - size  # the first token of each row comes with the prefill
                rates[shared, size] = tokens / decode_s
                print(
                    f"decode at batch {size}, {label}: {tokens} tokens in {decode_s:.1f} s = "
                    f"{rates[shared, size]:.1f} tokens/s (prompt {len(prompt.prompt_ids)} tokens)"
                )
            print(f"{label}: batch 8 / batch 1 decode throughput {rates[shared, 8] / rates[shared, 1]:.2f}x")
        if supported:
            print(f"batch 8 decode, shared-prefix attention on / off: {rates[True, 8] / rates[False, 8]:.2f}x")
        else:
            print("shared-prefix attention is not supported by this model: measured without it")
    finally:
        backend.stop_ids = eos
        backend.shared_prefix = supported
    agent.end_episode()
    env.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("new_tokens", nargs="?", type=count, default=32, help="tokens per turn (default: %(default)s)")
    parser.add_argument("turns", nargs="?", type=count, default=4, help="turns of the episode (default: %(default)s)")
    args = parser.parse_args()
    main(args.new_tokens, args.turns)
