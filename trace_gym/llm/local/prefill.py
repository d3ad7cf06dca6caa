"""Prefilling prompts from cached keys and values: ``LocalHF``'s mixin.

A prompt starts from the longest cached prefix the backend holds (its episode's
own cache, else the shared system-prompt prefix, computed once), and only its
new tokens are run. Rows that continue a cached entry run together in one
forward, each attending to its shared prefix in place; identical rows run once.

What the mixin reads of its host: ``torch``, ``device``, ``model`` (its config),
``tokenizer`` (the pad id), ``store`` (a ``KVStore``), ``kv_cache`` and
``shared_prefix`` (switches), and ``_forward(adapters, **inputs)``.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

from . import shared_prefix
from ..base import GenerationRequest
from .kv_cache import KVEntry, in_place_groups, own_segments, write_right_aligned

PREFILL_TOKENS = 2048  # new tokens (padding included) per batched prefill forward
PREFILL_SLOTS = 32768  # key slots (rows x (own cached + new tokens), padding included) per batched prefill forward


class CachedPrefill:
    """``_find_start`` finds a prompt's cached start; ``_prefill_rows`` runs the rest."""

    def _prefix_entry(self, ids: list[int], adapter: str | None, stats: dict[str, Any] | None = None) -> KVEntry:
        key = ("prefix", adapter, hashlib.sha256(str(ids).encode()).hexdigest())
        entry = self.store.get(key)
        if entry is None:
            if stats is not None:
                stats["prefix_tokens"] = stats.get("prefix_tokens", 0) + len(ids)  # computed now, once
            entry = self._prefill(ids, None, adapter)[0]
            entry.shared = True
            self.store.put(key, entry)
        return entry

    def _prefill(self, ids: list[int], start: KVEntry | None, adapter: str | None) -> tuple[KVEntry, Any]:
        """Run ``ids`` after ``start``'s cached tokens; the entry (beside ``start``'s
        shared prefix, if it has one) and the last logits."""
        return self._prefill_rows([(ids, start, adapter)])[0]

    def _prefill_rows(
        self,
        items: list[tuple[list[int], KVEntry | None, str | None]],
        stats: dict[str, Any] | None = None,
        keep: list[int] | None = None,
    ) -> list[tuple[KVEntry, Any]]:
        """``_prefill`` for each (ids, start, adapter); with ``keep``, each row's
        logits at its last ``keep[i]`` positions (``[keep[i], vocabulary]``: a draft
        to verify) instead of the last position's. Rows that continue a cached
        entry run together, up to ``PREFILL_TOKENS`` new tokens and
        ``PREFILL_SLOTS`` key slots (padded) per forward (a row larger than that
        runs alone), attending to their shared prefixes in place; identical rows
        (the K rollouts of a group opening on one prompt) run once and share the
        entry, and ``stats`` (counted per request by ``_find_start``) then count
        the repeats' tokens as cached. A row with nothing cached, or a model
        without shared-prefix attention, runs alone under the model's own masks."""
        tails = keep or [1] * len(items)
        keys = [(adapter, id(start), tuple(ids), n) for (ids, start, adapter), n in zip(items, tails)]
        firsts: dict[tuple, tuple[list[int], KVEntry | None, str | None]] = {}
        for key, (ids, start, adapter) in zip(keys, items):
            if key in firsts and stats is not None:  # (a row's last keep - 1 tokens are a draft's, counted apart)
                repeated = len(ids) - (len(start.ids) if start is not None else 0) - (key[-1] - 1)
                stats["prefill_tokens"] -= repeated
                stats["cached_tokens"] += repeated
            firsts.setdefault(key, (ids, start, adapter))
        results: dict[tuple, tuple[KVEntry, Any]] = {}
        batched = []
        for key, (ids, start, adapter) in firsts.items():
            if self.shared_prefix and start is not None:
                batched.append(key)
            else:
                results[key] = self._prefill_whole(ids, start, adapter, key[-1])

        def new_tokens(key: tuple) -> int:
            return len(firsts[key][0]) - len(firsts[key][1].ids)

        def held_tokens(key: tuple) -> int:  # the row's own cached tokens (a shared prefix is attended to in place)
            start = firsts[key][1]
            base = start if start.shared else start.base
            return len(start.ids) - (len(base.ids) if base is not None else 0)

        def fits(keys: list[tuple]) -> bool:  # padded to the widest row, as _prefill_batch lays them out
            new, held = max(map(new_tokens, keys)), max(map(held_tokens, keys))
            return new * len(keys) <= PREFILL_TOKENS and (held + new) * len(keys) <= PREFILL_SLOTS

        batched.sort(key=new_tokens)  # similar lengths together: less padding
        chunk: list[tuple] = []
        for key in [*batched, None]:
            if chunk and (key is None or not fits([*chunk, key])):
                results.update(zip(chunk, self._prefill_batch([firsts[k] for k in chunk], [k[-1] for k in chunk])))
                chunk = []
            if key is not None:
                chunk.append(key)
        out = [results[key] for key in keys]
        return out if keep is not None else [(entry, logits[-1]) for entry, logits in out]

    def _prefill_whole(
        self, ids: list[int], start: KVEntry | None, adapter: str | None, keep: int = 1
    ) -> tuple[KVEntry, Any]:
        """One row, its whole cache (prefix included) copied in front of it; the
        logits of its last ``keep`` positions."""
        from transformers import DynamicCache

        torch = self.torch
        done = len(start.ids) if start is not None else 0
        base = (start if start.shared else start.base) if start is not None else None
        new = torch.tensor([ids[done:]], device=self.device)
        positions = torch.arange(done, len(ids), device=self.device).unsqueeze(0)
        cache = (
            DynamicCache(ddp_cache_data=[start.full(i) for i in range(len(start.layers))]) if start else DynamicCache()
        )
        mask = torch.ones(1, len(ids), dtype=torch.long, device=self.device)
        output = self._forward(
            [adapter],
            input_ids=new,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            logits_to_keep=keep,
        )
        layers = [(layer.keys, layer.values) for layer in output.past_key_values.layers]
        entry = KVEntry(list(ids), adapter, layers)
        if base is not None:  # keep only this episode's own tokens beside the shared prefix
            cut = len(base.ids)
            entry = KVEntry(
                entry.ids,
                adapter,
                [(k[:, :, cut:].contiguous(), v[:, :, cut:].contiguous()) for k, v in layers],
                base=base,
            )
        logits = output.logits[0, -keep:]
        return entry, logits.float() if keep == 1 else logits  # (a draft's: converted row by row as verified)

    def _prefill_batch(
        self, items: list[tuple[list[int], KVEntry, str | None]], keep: list[int]
    ) -> list[tuple[KVEntry, Any]]:
        """Rows that each continue a cached entry, in one forward (row i's logits
        at its last ``keep[i]`` positions). Layout of row i's
        key slots: its own cached tokens right-aligned in the first ``H`` slots (the
        shared prefix, if any, is attended to in place), then its new tokens
        right-aligned in the last ``Q``, so every row's last token is the last
        column. A padding query sees its own slot, so no softmax is empty."""
        from transformers import DynamicCache

        torch = self.torch
        starts = [start for _, start, _ in items]
        bases = [start if start.shared else start.base for start in starts]
        news = [ids[len(start.ids) :] for ids, start, _ in items]
        n_layers = len(starts[0].layers)
        owns = [
            [own_segments(start, base is not None, layer) for layer in range(n_layers)]
            for start, base in zip(starts, bases)
        ]
        held = [sum(k.shape[2] for k, _ in own[0]) for own in owns]
        h, q, rows = max(held), max(map(len, news)), len(items)
        lead = [q - len(n) for n in news]  # padding before each row's new tokens
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * n + new for n, new in zip(lead, news)], device=self.device)
        positions = (
            torch.tensor([len(s.ids) - n for s, n in zip(starts, lead)], device=self.device)[:, None]
            + torch.arange(q, device=self.device)[None, :]
        ).clamp(min=0)
        own_slots = shared_prefix.own_mask(rows, q, h, [h - n for n in held], [h - 1] * rows, self.device)
        new_slots = shared_prefix.own_mask(rows, q, q, lead, [0] * rows, self.device)
        new_slots |= torch.eye(q, dtype=torch.bool, device=self.device)  # (a padding query: its own slot)
        mask = torch.cat([own_slots, new_slots], dim=-1)  # [rows, 1, q, h + q]
        cache = DynamicCache()
        if h:
            layers = []
            for layer in range(n_layers):
                k0, v0 = next(own[layer][0] for own in owns if own[layer])
                keys = k0.new_zeros((rows, k0.shape[1], h, k0.shape[3]))
                values = v0.new_zeros((rows, v0.shape[1], h, v0.shape[3]))
                for i, own in enumerate(owns):
                    write_right_aligned(keys, values, i, own[layer], h)
                layers.append((keys, values))
            cache = DynamicCache(ddp_cache_data=layers)
        extra = in_place_groups(bases)
        with shared_prefix.use_shared_prefix(self.model.config) if extra else contextlib.nullcontext():
            output = self._forward(
                [adapter for _, _, adapter in items],
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                logits_to_keep=max(keep),
                **extra,
            )
        out_layers = [(layer.keys, layer.values) for layer in output.past_key_values.layers]
        results = []
        for i, (ids, _, adapter) in enumerate(items):
            mine = [*range(h - held[i], h), *range(h + lead[i], h + q)]  # the row's own and new slots
            index = torch.tensor(mine, device=self.device)
            layers = [(k[i : i + 1].index_select(2, index), v[i : i + 1].index_select(2, index)) for k, v in out_layers]
            logits = output.logits[i, output.logits.shape[1] - keep[i] :]
            logits = logits.float() if keep[i] == 1 else logits  # (a draft's: converted row by row as verified)
            results.append((KVEntry(list(ids), adapter, layers, base=bases[i]), logits))
        return results

    def _find_start(self, request: GenerationRequest, ids: list[int], stats: dict[str, Any]) -> KVEntry | None:
        """The longest cached prefix of a prompt this backend holds: the episode's
        own cache, else the shared prefix (computed now if new), else nothing."""
        start: KVEntry | None = None
        before = stats["prefix_tokens"]
        if self.kv_cache:
            if request.session is not None:
                session = self.store.get(("session", request.session))
                if (
                    session is not None
                    and session.adapter == request.adapter
                    and len(session.ids) < len(ids)
                    and ids[: len(session.ids)] == session.ids
                ):
                    start = session
            if start is None and 0 < request.prefix_len < len(ids):
                start = self._prefix_entry(ids[: request.prefix_len], request.adapter, stats)
            if start is None:
                self.store.misses += 1
            else:
                self.store.hits += 1
        done = len(start.ids) if start else 0
        fresh_prefix = stats["prefix_tokens"] - before
        stats["cached_tokens"] += done - fresh_prefix
        stats["prefill_tokens"] += len(ids) - done + fresh_prefix
        return start
