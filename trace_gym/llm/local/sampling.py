"""Token sampling for a batch of generation rows, one step at a time.

Each row keeps its own generator (its seed), temperature and token budget, and
every sampled token comes with its logprob under the distribution it was drawn
from (the logits divided by the temperature; plain logits for greedy rows).

A row may be held to a grammar (``strict_calls.Progress``: a tool call that keeps
to its schemas). While it is, its token is drawn from the model's distribution
restricted to the tokens the grammar accepts: the row draws as a free row does,
and only a token the grammar refuses is drawn again from the restriction (which
makes the draw the restricted distribution's: p(t)/A = p(t) + (1 - A) p(t)/A).
Candidates for that second draw are examined in the model's order until the mass
not yet examined is below ``TAIL`` of the accepted mass. A token's recorded
logprob is the model's own (unrestricted), as for a free row: what the policy
gives the token, which a trainer's ratios are about.
"""

from __future__ import annotations

from typing import Any

from ..base import LLMError

TAIL = 1e-3  # a constrained row's candidates are examined until the rest weigh less than this share of the accepted
FIRST = 64  # candidates looked at first (by the model's order); all of them if none of these is accepted


def check_finite(torch: Any, logp: Any, model_name: str) -> None:
    """Refuse logprobs [rows, vocabulary] with a NaN or +inf logit in any row
    (one spoils its whole row's softmax)."""
    if not bool(torch.isfinite(logp.amax(dim=-1)).all()):
        raise LLMError(
            f"{model_name} produced non-finite logits (overflow in its weights or dtype); cannot sample from them"
        )


class RowSampler:
    """Draws one token per unfinished row at each step and records it.

    Rows are sampled by inverse CDF: one uniform number per row and step from the
    row's own generator, the token at that point of its cumulative distribution
    (``torch.multinomial`` would draw one per vocabulary entry). A row finishes on
    a stop token or when its budget is spent; finished rows get the pad token.
    """

    def __init__(
        self,
        torch: Any,
        requests: list[Any],
        *,
        device: Any,
        stop_ids: set[int] | frozenset[int],
        pad_id: int,
        model_name: str,
        grammars: list[Any] | None = None,
        pieces: list[str] | None = None,
    ):
        """``grammars``: each row's ``Progress`` (None: the row is free);
        ``pieces``: each token id's text, which the grammars read."""
        self.torch = torch
        self.temperatures = [r.temperature for r in requests]
        self.budget = [r.max_new_tokens for r in requests]
        self.stop_ids, self.pad_id, self.model_name = stop_ids, pad_id, model_name
        self.generators = []
        for r in requests:
            g = torch.Generator(device=device)
            g.manual_seed(r.seed if r.seed is not None else int(torch.randint(0, 2**31 - 1, ()).item()))
            self.generators.append(g)
        self.device = device
        self.sampled: list[list[int]] = [[] for _ in requests]
        self.logprobs: list[list[float]] = [[] for _ in requests]
        self.finished = [False] * len(requests)
        self.grammars = grammars or [None] * len(requests)
        if any(g is not None for g in self.grammars) and pieces is None:
            raise ValueError("rows held to a grammar need the tokens' text (pieces)")
        self.pieces = pieces

    @property
    def done(self) -> bool:
        return all(self.finished)

    def __call__(self, step_logits: Any, rows: list[int] | None = None) -> list[int]:
        """The next token of every row (the pad token for finished ones), given
        the step's logits [rows, vocabulary]; ``rows``: which row each line of
        ``step_logits`` is (a batch that has dropped rows), else every row in order."""
        torch = self.torch
        line = {i: j for j, i in enumerate(rows if rows is not None else range(len(self.finished)))}
        live = [i for i in line if not self.finished[i]]
        tokens = [self.pad_id] * len(self.finished)
        if not live:
            return tokens
        logits = step_logits[[line[i] for i in live]].float()
        t = torch.tensor(
            [self.temperatures[i] if self.temperatures[i] > 0 else 1.0 for i in live], device=logits.device
        )
        logp = torch.log_softmax(logits / t[:, None], dim=-1)
        check_finite(torch, logp, self.model_name)
        chosen = logp.argmax(dim=-1)
        sampling = [j for j, i in enumerate(live) if self.temperatures[i] > 0]
        if sampling:
            at = torch.tensor(sampling, device=logp.device)
            wide = torch.float32 if logp.device.type == "mps" else torch.float64  # (MPS has no float64)
            cdf = logp[at].to(wide).exp().cumsum(dim=-1)
            u = torch.cat(
                [torch.rand(1, generator=self.generators[live[j]], device=self.device, dtype=wide) for j in sampling]
            )
            drawn = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
            chosen[at] = drawn.clamp(max=logp.shape[-1] - 1)
        picked = logp.gather(1, chosen[:, None]).squeeze(1).tolist()
        chosen = chosen.tolist()
        for j, i in enumerate(live):
            grammar = self.grammars[i]
            if grammar is not None and grammar.constrained and not self._allowed(grammar, chosen[j]):
                chosen[j] = self._constrained(i, logp[j])
                picked[j] = float(logp[j, chosen[j]])
        for j, (i, token) in enumerate(zip(live, chosen)):
            self._append(i, token, picked[j])
            tokens[i] = token
        return tokens

    def _allowed(self, grammar: Any, token: int) -> bool:
        if token in self.stop_ids:
            return not grammar.in_call
        return grammar.accepts(self.pieces[token])

    def _constrained(self, row: int, logp: Any) -> int:
        """A token for ``row`` from ``logp`` [vocabulary] restricted to what its
        grammar accepts (called when the token drawn unrestricted was refused:
        drawing again from the restriction makes the whole draw the restricted
        distribution's)."""
        torch = self.torch
        grammar = self.grammars[row]
        accepted: list[tuple[int, float]] = []
        mass = seen = 0.0
        for wide in (False, True):
            if wide:
                order = torch.argsort(logp, descending=True)[FIRST:]
            else:
                order = torch.topk(logp, min(FIRST, logp.shape[-1])).indices
            for token, p in zip(order.tolist(), logp[order].double().exp().tolist()):
                if accepted and 1.0 - seen < TAIL * mass:
                    break
                seen += p
                if self._allowed(grammar, token):
                    accepted.append((token, p))
                    mass += p
            if accepted:
                break
        if not accepted:  # (cannot happen: a call's JSON can always go on)
            raise LLMError(f"{self.model_name}: no token keeps row {row}'s tool call to its schema")
        if self.temperatures[row] <= 0:
            return accepted[0][0]
        u = float(torch.rand(1, generator=self.generators[row], device=self.device, dtype=torch.float64)) * mass
        for token, p in accepted:
            u -= p
            if u <= 0:
                return token
        return accepted[-1][0]

    def accept(self, row: int, tokens: list[int], logprobs: list[float]) -> int:
        """Record tokens chosen elsewhere (a verified draft) for ``row``, up to its
        first stop token or its budget; returns how many were taken."""
        taken = 0
        for token, logprob in zip(tokens, logprobs):
            if self.finished[row]:
                break
            self._append(row, token, logprob)
            taken += 1
        return taken

    def _append(self, row: int, token: int, logprob: float) -> None:
        if self.grammars[row] is not None and token not in self.stop_ids:
            self.grammars[row].advance(self.pieces[token])
        self.sampled[row].append(token)
        self.logprobs[row].append(logprob)
        if token in self.stop_ids or len(self.sampled[row]) >= self.budget[row]:
            self.finished[row] = True
