"""Token sampling for a batch of generation rows, one step at a time.

Each row keeps its own generator (its seed), temperature and token budget, and
every sampled token comes with its logprob under the distribution it was drawn
from (the logits divided by the temperature; plain logits for greedy rows).
"""

from __future__ import annotations

from typing import Any

from ..base import LLMError


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
    ):
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
        for j, (i, token) in enumerate(zip(live, chosen.tolist())):
            self._append(i, token, picked[j])
            tokens[i] = token
        return tokens

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
        self.sampled[row].append(token)
        self.logprobs[row].append(logprob)
        if token in self.stop_ids or len(self.sampled[row]) >= self.budget[row]:
            self.finished[row] = True
