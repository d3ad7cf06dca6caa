"""A local Hugging Face model through transformers, with peft LoRA adapters,
token in, token out.

- Chat templates, applied once per segment: a conversation's first prompt is
  the system turn (system prompt + tool schemas: the shareable prefix) and the
  rest; each later turn appends only the new messages, rendered on their own
  (``encode_continuation``), to the ids already sampled. Decoded text is never
  re-tokenized.
- Generation is our own loop over the model's forward (not ``generate``), so
  that each row of a batch keeps its own seed, temperature, adapter and token
  budget, and every sampled token comes with its logprob.
- Keys and values are cached: the prefix of each (adapter, prefix ids) is
  computed once and shared by every episode that starts with it; an episode's
  cache (``GenerationRequest.session``) is extended turn by turn. Prompts are
  prefilled row by row from their cache (no padding in what is computed), then
  decoded in one batch over a preallocated static cache. The store is bounded
  (``cache_bytes``, least recently used first out). A cache belongs to one set
  of weights: call ``clear_cache()`` after changing them (a trainer's step).
- Shared-prefix attention (``shared_prefix.py``): rows that extend one cached
  prefix attend to it in one product per batch, and only their own tokens are
  copied into the decode cache; at τ²'s 5k-token prefix this, not the weights,
  is what a decode step costs. Exact attention; Llama-family models only (others
  take the plain path).
- Greedy drafts (``drafts.py``): a greedy request on a prompt some earlier
  greedy request already answered (evaluation plays every method on the same
  tasks) feeds that reply in its prefill and keeps it up to its own first
  different choice, then decodes on. The reply is the request's own greedy one.
- ``score(conversation, labels)``: each label's full token sequence logprob as
  the next reply.

Loads only from local files; never downloads weights. The package's
``__init__`` says which file holds which concern.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from . import shared_prefix
from ..base import Completion, GenerationRequest, Generates, LLMError
from .drafts import DraftBook, verify
from .kv_cache import KVEntry, KVStore, cache_budget, in_place_groups, own_segments, write_right_aligned
from .lora import LoraAdapters
from .prefill import CachedPrefill
from ..precision import engine_dtype, local_device
from ..registry import load_local
from .sampling import RowSampler
from .strict_calls import CallGrammar, strict_from_env
from ..token_template import TokenTemplate

DROP_FINISHED = 0.25  # rows that have stopped leave the decode batch once they are this share of it


class LocalHF(CachedPrefill, LoraAdapters, TokenTemplate, Generates):
    """Args:
    path: a local model folder (``from_model`` takes a model object instead).
    adapters: LoRA adapters to load, name -> folder.
    max_batch: rows per batched generation.
    kv_cache: reuse keys and values across turns and episodes (off: every
        prompt is prefilled from scratch, as a baseline).
    cache_bytes: the cap on cached keys and values; None sizes it
        (``kv_cache.cache_budget``: ``TRACE_GYM_KV_CACHE_GIB``; half a GPU's free
        memory for a model loaded from ``path``; else 4 GiB).
    shared_prefix_attention: attend to a shared prefix once per batch instead of
        once per row (exact; off: every row's cache holds its own copy).
    dtype: the weights' dtype for a model loaded from ``path``: ``auto``,
        ``float32`` or ``bfloat16``; None reads ``TRACE_GYM_DTYPE``, else ``auto``
        (bfloat16 on CUDA and on a CPU with bf16 matrix instructions, float32
        elsewhere: ``precision``). A model object keeps its own.
    chat_template: replaces the tokenizer's own.
    greedy_drafts: verify the last greedy reply to the same prompt as a draft
        for a greedy request (``drafts.py``; off: every greedy reply is decoded
        token by token).
    template: which template to play with (``templates.choose``): ``auto`` keeps
        one that appends turn for turn, else takes TRL's training template for the
        family; ``stock`` keeps the tokenizer's; or a template's name (ours or
        TRL's) or a ``.jinja`` path. ``template_note`` says what was chosen and why.
    strict_tools: hold every tool call a request with ``tools`` opens to their
        schemas as it is decoded (``strict_calls.py``; no greedy drafts for those
        requests); ``"ids"`` also holds its id arguments to the id-like words of the
        request's messages; None reads ``TRACE_GYM_STRICT_TOOLS`` (``1``: on, ``ids``),
        else off.
    """

    token_level = True

    def __init__(
        self,
        path: str | None = None,
        *,
        name: str | None = None,
        adapters: dict[str, str] | None = None,
        device: str | None = None,
        max_batch: int = 8,
        kv_cache: bool = True,
        cache_bytes: int | None = None,
        chat_template: str | None = None,
        template: str = "auto",
        model: Any = None,
        tokenizer: Any = None,
        shared_prefix_attention: bool = True,
        dtype: str | None = None,
        greedy_drafts: bool = True,
        strict_tools: bool | str | None = None,
    ):
        try:
            import torch
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise LLMError(f"local models need torch and transformers ({exc}); run make setup") from None
        hf_logging.set_verbosity_error()
        self.torch = torch
        self.max_batch = max_batch
        self.kv_cache = kv_cache
        self.adapters: dict[str, str] = {}
        self.last_stats: dict[str, Any] = {}
        self._lock = threading.RLock()
        if model is not None:
            if dtype is not None:
                raise LLMError("an in-memory model runs in its own dtype; dtype applies to a model loaded from a path")
            if tokenizer is None:
                raise LLMError("an in-memory model needs its tokenizer")
            self.model, self.tokenizer, self.path = model, tokenizer, None
            self.name = name or getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
            self.device = str(next(model.parameters()).device)
            self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
            peft_config = getattr(model, "peft_config", None) or {}
            self.adapters = {n: "(in memory)" for n in peft_config}
        else:
            if path is None or not Path(path).exists():
                raise LLMError(f"no model at {path}: trace-gym loads local models only and never downloads weights")
            self.path = path
            self.name = name or Path(path).name
            self.device = device or local_device()
            self.dtype = engine_dtype(dtype, self.device)
            self.model, self.tokenizer = load_local(path, dtype=getattr(torch, self.dtype), device=self.device)
            self.model.eval()
        if cache_bytes is None:
            alone = model is None and self.device.startswith("cuda")  # (not a model a trainer is updating)
            free = torch.cuda.mem_get_info(self.device)[0] if alone else None
            cache_bytes = cache_budget(self.device, free)
        self.store = KVStore(cache_bytes)
        self.drafts = DraftBook() if greedy_drafts else None
        self.strict_tools = strict_from_env() if strict_tools is None else strict_tools
        if not (type(self.strict_tools) is bool or self.strict_tools == "ids"):
            raise LLMError(f"strict_tools must be False, True or 'ids', got {self.strict_tools!r}")
        self._grammars: dict[str, CallGrammar] = {}
        self._pieces: list[str] | None = None
        self._set_template(
            chat_template, template, getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        )
        self.shared_prefix = shared_prefix_attention and shared_prefix.supported(getattr(self.model, "config", None))
        self.context_size: int | None = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        for adapter_name, adapter_path in (adapters or {}).items():
            self.load_adapter(adapter_name, adapter_path)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, name: str | None = None, **kwargs: Any) -> "LocalHF":
        """Wrap a model object already in memory (e.g. the policy a trainer is
        updating; a ``PeftModel``'s adapters are usable by name). Call
        ``clear_cache()`` whenever its weights change."""
        return cls(model=model, tokenizer=tokenizer, name=name, **kwargs)

    # --- caches (the adapters are lora.LoraAdapters') ------------------------------
    def clear_cache(self) -> None:
        """Forget every cached key and value (after the weights change)."""
        with self._lock:
            self.store.clear()

    def release(self, session: str) -> None:
        """Forget an episode's cache (it has ended)."""
        with self._lock:
            self.store.drop(("session", session))

    def cache_stats(self) -> dict[str, Any]:
        return {
            "entries": len(self.store.entries),
            "bytes": self.store.nbytes,
            "max_bytes": self.store.max_bytes,
            "hits": self.store.hits,
            "misses": self.store.misses,
        }

    # --- generation -----------------------------------------------------------------
    def complete(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, each with its own seed, temperature,
        adapter and token budget; batched ``max_batch`` rows at a time."""
        for request in requests:
            self._check_adapter(request.adapter)
            if request.max_new_tokens < 1:
                raise LLMError(f"max_new_tokens must be at least 1, got {request.max_new_tokens}")
            length = len(request.prompt_ids) if request.prompt_ids is not None else None
            if length is not None and self.context_size and length + request.max_new_tokens > self.context_size:
                raise LLMError(
                    f"a prompt of {length} tokens with max_new_tokens {request.max_new_tokens} passes "
                    f"{self.name}'s context of {self.context_size} tokens"
                )
        out: list[Completion] = []
        # prefill_tokens: computed for these prompts (prefix_tokens of them: a shared prefix computed for the
        # first time); cached_tokens: reused from the cache.
        stats = {
            "prefill_tokens": 0,
            "prefix_tokens": 0,
            "cached_tokens": 0,
            "decode_tokens": 0,
            "draft_tokens": 0,  # tokens of the drafts offered (all but each one's last fed with its prompt)
            "draft_accepted": 0,  # of which kept: the rows' own choices
            "ttft_s": 0.0,
            "total_s": 0.0,
        }
        with self._lock, self._inference():
            for start in range(0, len(requests), self.max_batch):
                out += self._complete_batch(requests[start : start + self.max_batch], stats)
        self.last_stats = stats
        return out

    @contextlib.contextmanager
    def _inference(self):
        torch = self.torch
        training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            if training:
                self.model.train()

    def _forward(self, adapters: list[str | None], **inputs: Any) -> Any:
        """The model's forward with each row's adapter. A batch whose rows all use
        the peft model's active adapter takes peft's plain path; any other batch
        its per-row path (``adapter_names``; ``__base__`` for the base model), whose
        per-layer indexing costs about a sixth of a decode step at batch 16. (The
        adapters are never switched on the model: another caller may be using it.)"""
        if hasattr(self.model, "peft_config"):
            active = getattr(self.model, "active_adapters", None)
            own = callable(active)  # transformers' own peft integration (a method there): no per-row adapters
            active = list((active() if own else active) or [])
            if len(set(adapters)) == 1 and adapters[0] is not None and active == [adapters[0]]:
                return self.model(**inputs, use_cache=True)
            if own:
                raise LLMError(
                    f"{self.name} holds its adapters through transformers' own peft integration, which "
                    f"runs only the active one ({', '.join(active) or 'none'}); asked for "
                    f"{', '.join(sorted({str(a) for a in adapters}))}. Wrap the base model in "
                    "peft.PeftModel to choose an adapter (or the base model) per request"
                )
            inputs["adapter_names"] = [a if a is not None else "__base__" for a in adapters]
        return self.model(**inputs, use_cache=True)

    def _complete_batch(self, requests: list[GenerationRequest], stats: dict[str, Any]) -> list[Completion]:
        """Prefill every row from its cache, sample the first tokens, decode the rest
        in one batch, and keep each session's cache for its next turn."""
        t0 = time.perf_counter()
        prompts: list[list[int]] = []
        for r in requests:
            if r.prompt_ids is not None:
                prompts.append(list(r.prompt_ids))
            else:
                ids, prefix_len = self.encode_conversation(r.messages, r.tools)
                r.prefix_len = r.prefix_len or prefix_len
                prompts.append(ids)
        starts = [self._find_start(r, ids, stats) for r, ids in zip(requests, prompts)]
        grammars = [self._grammar(r.tools) for r in requests]
        drafts = [
            self.drafts.draft(ids, r.max_new_tokens)
            if self.drafts is not None and r.temperature <= 0 and grammar is None
            else []
            for r, ids, grammar in zip(requests, prompts, grammars)
        ]
        fed = [[*ids, *draft[:-1]] for ids, draft in zip(prompts, drafts)]
        rows = self._prefill_rows(
            [(ids, start, r.adapter) for r, ids, start in zip(requests, fed, starts)],
            stats,
            keep=[max(len(d), 1) for d in drafts],
        )
        sampler = RowSampler(
            self.torch,
            requests,
            device=self.device,
            stop_ids=self.stop_ids,
            pad_id=self.tokenizer.pad_token_id,
            model_name=self.name,
            grammars=[
                None if g is None else g.start(r.messages if self.strict_tools == "ids" else None)
                for r, g in zip(requests, grammars)
            ],
            pieces=self._token_pieces() if any(g is not None for g in grammars) else None,
        )
        plain = [i for i, d in enumerate(drafts) if not d]
        tokens = [self.tokenizer.pad_token_id] * len(requests)
        if plain:
            tokens = sampler(self.torch.stack([rows[i][1][-1] for i in plain]), rows=plain)
        for i, draft in enumerate(drafts):
            if draft:
                rows[i], tokens[i] = self._take_draft(sampler, i, rows[i], draft, stats)
        stats["ttft_s"] += time.perf_counter() - t0
        decoded = self._decode([entry for entry, _ in rows], [r.adapter for r in requests], sampler, tokens)
        stats["decode_tokens"] += sum(len(s) for s in sampler.sampled)
        completions = []
        for i, (request, ids) in enumerate(zip(requests, prompts)):
            if request.session is not None and self.kv_cache:
                self._keep_session(request.session, ids, rows[i][0], sampler.sampled[i], decoded[i])
            completions.append(self._completion(ids, sampler.sampled[i], sampler.logprobs[i]))
            if self.drafts is not None and request.temperature <= 0 and grammars[i] is None:
                self.drafts.record(ids, sampler.sampled[i])
        stats["total_s"] += time.perf_counter() - t0
        return completions

    def _grammar(self, tools: list[dict[str, Any]] | None) -> CallGrammar | None:
        """The grammar of ``tools``' calls, built once per set of tools (None: free)."""
        if not self.strict_tools or not tools:
            return None
        key = json.dumps(tools, sort_keys=True)
        if key not in self._grammars:
            self._grammars[key] = CallGrammar(tools)
        return self._grammars[key]

    def _token_pieces(self) -> list[str]:
        """Each token id's text, as the grammars read it (built once)."""
        if self._pieces is None:
            size = max(len(self.tokenizer), int(getattr(self.model.config, "vocab_size", 0) or 0))
            self._pieces = self.tokenizer.batch_decode([[i] for i in range(size)])
        return self._pieces

    def _take_draft(
        self, sampler: RowSampler, row: int, prefilled: tuple[KVEntry, Any], draft: list[int], stats: dict[str, Any]
    ) -> tuple[tuple[KVEntry, Any], int]:
        """Verify a greedy row's draft from its prefill (``drafts.verify``), record
        the tokens kept in ``sampler``, and cut the row's cache to the tokens fed
        before its last kept one. Returns the cut row and the token it decodes
        from (the pad token once it has finished)."""
        entry, logits = prefilled
        kept, logprobs = verify(self.torch, logits, draft, self.name)
        taken = sampler.accept(row, kept, logprobs)
        stats["draft_tokens"] += len(draft)
        stats["draft_accepted"] += sum(1 for a, b in zip(kept[:taken], draft) if a == b)
        extra = (len(draft) - 1) - (taken - 1)  # draft tokens fed after the last kept one
        if extra:
            entry = KVEntry(
                entry.ids[: len(entry.ids) - extra],
                entry.adapter,
                [(k[:, :, : k.shape[2] - extra], v[:, :, : v.shape[2] - extra]) for k, v in entry.layers],
                base=entry.base,
            )
        token = self.tokenizer.pad_token_id if sampler.finished[row] else sampler.sampled[row][-1]
        return (entry, None), token

    def _decode(
        self,
        rows: list[KVEntry],
        adapters: list[str | None],
        sampler: RowSampler,
        tokens: list[int],
    ) -> list[list[tuple[Any, Any]]]:
        """Decode every row after the tokens it has (its first, or a draft's), over
        one static cache, from ``tokens`` (each row's last, not yet fed): each row's
        own tokens right-aligned at ``longest`` (left padding masked out), then one
        slot per step. Returns, per row, the keys and values of the tokens it fed
        (per layer ``[1, kv_heads, fed, head_dim]``; none for a row that finished at
        its first token).

        Rows that extend a shared prefix attend to it in place; the decode cache
        holds their own tokens only (for a prefix that only one row extends, plain
        attention over a copy is as fast). Rows that have stopped leave the batch
        once they are ``DROP_FINISHED`` of it (their fed tokens kept aside): a batch
        decodes until its longest reply ends, and each row left in costs a step
        its share of the attention."""
        from transformers import StaticCache

        torch = self.torch
        steps = max(sampler.budget) - 1
        lengths = [len(entry.ids) for entry in rows]  # each row's tokens in its cache
        first = [len(s) for s in sampler.sampled]  # tokens each row had before decoding
        bases = [entry.base if self.shared_prefix else None for entry in rows]
        sharing = Counter(id(b) for b in bases if b is not None)
        bases = [b if b is not None and sharing[id(b)] > 1 else None for b in bases]
        held = [n - (len(b.ids) if b is not None else 0) for n, b in zip(lengths, bases)]  # tokens in the decode cache
        longest = max(held)
        fed: list[list[tuple[Any, Any]]] = [[] for _ in rows]
        if sampler.done:
            return fed
        cache = StaticCache(config=self.model.config, max_cache_len=longest + steps)
        n_layers = len(rows[0].layers)
        layers = cache.layers[:n_layers]
        for layer_index, layer in enumerate(layers):
            k0, v0 = rows[0].layers[layer_index]
            layer.lazy_initialization(
                k0.new_zeros((len(rows), k0.shape[1], 1, k0.shape[3])),
                v0.new_zeros((len(rows), v0.shape[1], 1, v0.shape[3])),
            )
            for i, entry in enumerate(rows):
                write_right_aligned(
                    layer.keys, layer.values, i, own_segments(entry, bases[i] is not None, layer_index), longest
                )
            layer.cumulative_length.fill_(longest)

        def own(position: int, row: int) -> list[tuple[Any, Any]]:  # the tokens row fed, at its place in the cache
            n = len(sampler.sampled[row]) - first[row]
            cut = slice(longest, longest + n)
            return [
                (layer.keys[position : position + 1, :, cut], layer.values[position : position + 1, :, cut])
                for layer in layers
            ]

        active = list(range(len(rows)))  # the rows in the decode cache, in its order
        extra = in_place_groups(bases)
        with shared_prefix.use_shared_prefix(self.model.config) if extra else contextlib.nullcontext():
            for step in range(steps):
                if sampler.done:
                    break
                stopped = [p for p, i in enumerate(active) if sampler.finished[i]]
                if stopped and len(stopped) >= DROP_FINISHED * len(active):
                    for p in stopped:
                        fed[active[p]] = [(k.clone(), v.clone()) for k, v in own(p, active[p])]
                    keep = [p for p, i in enumerate(active) if not sampler.finished[i]]
                    at = torch.tensor(keep, device=self.device)
                    for layer in layers:
                        layer.keys, layer.values = layer.keys.index_select(0, at), layer.values.index_select(0, at)
                        layer.batch_size = len(keep)
                    active = [active[p] for p in keep]
                    extra = in_place_groups([bases[i] for i in active])
                # this step's token is written at slot longest + step; nothing after it is visible
                mask = shared_prefix.own_mask(
                    len(active),
                    1,
                    longest + steps,
                    [longest - held[i] for i in active],
                    [longest + step] * len(active),
                    self.device,
                )
                output = self._forward(
                    [adapters[i] for i in active],
                    input_ids=torch.tensor([[tokens[i]] for i in active], device=self.device),
                    attention_mask=mask,
                    position_ids=torch.tensor([[lengths[i] + step] for i in active], device=self.device),
                    past_key_values=cache,
                    logits_to_keep=1,
                    **extra,
                )
                tokens = sampler(output.logits[:, -1], rows=active)
        for p, i in enumerate(active):
            fed[i] = own(p, i)
        return fed

    def _keep_session(
        self, session: str, ids: list[int], entry: KVEntry, sampled: list[int], fed: list[tuple[Any, Any]]
    ) -> None:
        """Store a session's cache for its next turn: its entry (the prompt, and the
        reply's tokens fed with it: a draft's) extended by the tokens it fed while
        decoding (``fed``, per layer; the last sampled token has not been through
        the model)."""
        if fed and fed[0][0].shape[2] > 0:
            torch = self.torch
            done = len(entry.ids) - len(ids)
            extended = [
                (torch.cat([k, dk], dim=2), torch.cat([v, dv], dim=2)) for (k, v), (dk, dv) in zip(entry.layers, fed)
            ]
            entry = KVEntry(
                [*entry.ids, *sampled[done : done + fed[0][0].shape[2]]], entry.adapter, extended, base=entry.base
            )
        self.store.put(("session", session), entry)

    # --- label scoring --------------------------------------------------------------
    def score(
        self,
        conversation: list[dict[str, Any]],
        labels: list[str],
        *,
        tools: list[dict[str, Any]] | None = None,
        adapter: str | None = None,
    ) -> dict[str, float]:
        """``{label: log p(label | conversation)}``: the logprob of each label's
        whole token sequence as the start of the model's next reply."""
        if not labels:
            raise LLMError("score needs at least one label")
        self._check_adapter(adapter)
        torch = self.torch
        ids, prefix_len = self.encode_conversation(conversation, tools)
        out: dict[str, float] = {}
        with self._lock, self._inference():
            start = (
                self._prefix_entry(ids[:prefix_len], adapter) if self.kv_cache and 0 < prefix_len < len(ids) else None
            )
            prompt, last_logits = self._prefill(ids, start, adapter)
            first = torch.log_softmax(last_logits, dim=-1)
            for label in labels:
                label_ids = self._encode(label)
                if not label_ids:
                    raise LLMError(f"label {label!r} has no tokens")
                total = float(first[label_ids[0]])
                if len(label_ids) > 1:
                    _, rest = self._score_tail(prompt, label_ids, adapter)
                    total += rest
                out[label] = total
        return out

    def next_token_logprobs(
        self, ids: list[int], *, prefix_len: int = 0, adapter: str | None = None, k: int = 20
    ) -> list[tuple[int, float]]:
        """The ``k`` likeliest next tokens after ``ids`` with their logprobs, likeliest
        first: a served label-scoring request (vLLM's ``logprobs`` on one token)."""
        self._check_adapter(adapter)
        torch = self.torch
        with self._lock, self._inference():
            start = (
                self._prefix_entry(ids[:prefix_len], adapter) if self.kv_cache and 0 < prefix_len < len(ids) else None
            )
            _, last_logits = self._prefill(ids, start, adapter)
            values, indices = torch.topk(torch.log_softmax(last_logits.float(), dim=-1), k)
        return [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist())]

    def _score_tail(self, prompt: KVEntry, label_ids: list[int], adapter: str | None) -> tuple[None, float]:
        from transformers import DynamicCache

        torch = self.torch
        n = len(prompt.ids)
        cache = DynamicCache(ddp_cache_data=[prompt.full(i) for i in range(len(prompt.layers))])
        fed = label_ids[:-1]
        output = self._forward(
            [adapter],
            input_ids=torch.tensor([fed], device=self.device),
            attention_mask=torch.ones(1, n + len(fed), dtype=torch.long, device=self.device),
            position_ids=torch.arange(n, n + len(fed), device=self.device).unsqueeze(0),
            past_key_values=cache,
            logits_to_keep=len(fed),
        )
        logp = torch.log_softmax(output.logits[0].float(), dim=-1)
        return None, float(sum(logp[j, label_ids[j + 1]] for j in range(len(fed))))
