"""Greedy replies kept as drafts for later greedy requests on the same prompt.

Evaluation plays every method on the same tasks, and an adapter's greedy reply
is often word for word the base model's (24 of TRACE's 40 τ²-retail transcripts
were, in one CPU run). So each greedy reply is remembered under its prompt, and
a later greedy request on that exact prompt, by any adapter, feeds the
remembered reply in its prefill: the logits at the draft's positions say where
the request's own greedy choice first differs. The tokens up to there, plus the
request's own choice at that position, are its reply so far, and decoding goes
on from there (nothing, if the whole draft and its end were its own choices).

A draft is a guess and nothing more: every token kept is the request's own
argmax, so the reply is the request's greedy reply whatever the draft (up to
the float rounding that differs between a prefill and a decode step, as it does
between batch sizes). The gain is speed: a prefill runs a reply's tokens in one
forward, a decode step one token per row.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .sampling import check_finite

MAX_DRAFTS = 4096  # prompts remembered, least recently used out first
MIN_DRAFT = 2  # tokens: a one-token draft saves nothing


class DraftBook:
    """The latest greedy reply of each prompt, bounded. A prompt is known by a
    hash of its token ids only (a collision costs a rejected draft, never a
    wrong reply: ``verify`` keeps only the row's own choices); for the same
    reason the book outlives a change of weights (``clear_cache``)."""

    def __init__(self, max_entries: int = MAX_DRAFTS):
        self.max_entries = max_entries
        self.replies: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    def record(self, prompt: list[int], reply: list[int]) -> None:
        if len(reply) < MIN_DRAFT:
            return
        key = hash(tuple(prompt))
        self.replies[key] = tuple(reply)
        self.replies.move_to_end(key)
        while len(self.replies) > self.max_entries:
            self.replies.popitem(last=False)

    def draft(self, prompt: list[int], budget: int) -> list[int]:
        """The reply last recorded for this prompt, cut to ``budget`` tokens;
        empty when there is none worth verifying."""
        key = hash(tuple(prompt))
        reply = self.replies.get(key)
        if reply is None or min(len(reply), budget) < MIN_DRAFT:
            return []
        self.replies.move_to_end(key)
        return list(reply[:budget])


def verify(torch: Any, logits: Any, draft: list[int], model_name: str) -> tuple[list[int], list[float]]:
    """A greedy row's reply from a draft: ``logits`` [len(draft), vocabulary] are
    the row's logits at the last prompt position and at each fed draft token but
    the last. Returns the draft's tokens up to the first the row would not have
    chosen, then the row's own choice there, each with its logprob. Non-finite
    logits are refused, as ``RowSampler`` refuses them."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    check_finite(torch, logp, model_name)
    chosen = logp.argmax(dim=-1).tolist()
    tokens: list[int] = []
    for want, got in zip(draft, chosen):
        tokens.append(got)
        if got != want:
            break
    at = torch.tensor(tokens, device=logp.device)
    logprobs = logp[torch.arange(len(tokens), device=logp.device), at].tolist()
    return tokens, logprobs
