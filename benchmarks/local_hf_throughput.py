"""LocalHF generation throughput on the embedded model: batch 1 against batch 8.

Eight short customer-service prompts, 64 new tokens each (greedy, no early
stop so every row generates the same count), timed as 8 single generations
and as one batch of 8. Target (issue #5): batching >= 3x the tokens/s.
Usage: python benchmarks/local_hf_throughput.py [NEW_TOKENS]
"""

from __future__ import annotations

import sys
import time

from trace_gym.llm import EMBEDDED_DEFAULT, make_backend

PROMPTS = [
    "Where is my order #W2378156?", "I want to return my headphones.", "Can you change my shipping address?",
    "Cancel order #W1234567, I ordered it by mistake.", "What is your refund policy?", "My keyboard arrived broken.",
    "How do I update my payment method?", "Exchange my thermostat for a Google Home one.",
]


def main(new_tokens: int = 64) -> None:
    backend = make_backend(EMBEDDED_DEFAULT)
    eos = backend.tokenizer.eos_token_id
    backend.model.generation_config.eos_token_id = None  # every row generates exactly new_tokens
    conversations = [[{"role": "system", "content": "You are a retail support agent."}, {"role": "user", "content": p}] for p in PROMPTS]
    backend.generate(conversations[:1], max_new_tokens=4)  # warm-up
    t0 = time.perf_counter()
    single = [backend.generate([c], max_new_tokens=new_tokens)[0] for c in conversations]
    t1 = time.perf_counter()
    batched = backend.generate(conversations, max_new_tokens=new_tokens)
    t2 = time.perf_counter()
    backend.model.generation_config.eos_token_id = eos
    tokens_single = sum(c.completion_tokens for c in single)
    tokens_batched = sum(c.completion_tokens for c in batched)
    rate1, rate8 = tokens_single / (t1 - t0), tokens_batched / (t2 - t1)
    print(f"device: {backend.device}, model: {EMBEDDED_DEFAULT}, {new_tokens} new tokens per prompt")
    print(f"batch 1: {tokens_single} tokens in {t1 - t0:.1f} s = {rate1:.1f} tokens/s")
    print(f"batch 8: {tokens_batched} tokens in {t2 - t1:.1f} s = {rate8:.1f} tokens/s")
    print(f"speed-up from batching: {rate8 / rate1:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
