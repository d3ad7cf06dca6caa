"""The synthesis analyst: the identification analyst's client, asked for code in a conversation.

It talks through the identification analyst's client (``analyst_backend``:
time-outs, back-off on transient errors) and caches answers in an on-disk
``AnswerCache``; the cache key is the whole
conversation, so a re-run (``--resume``) replays every attempt at no cost.
Calls, tokens and cache hits are counted. It returns text; it never runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trace_gym.identification.llm_analyst import AnswerCache, analyst_backend


class SynthesisAnalyst:
    def __init__(
        self,
        spec: str,
        *,
        cache_dir: str | Path | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_new_tokens: int = 8192,
        temperature: float = 0.0,
    ):
        self.name = spec
        self.backend = analyst_backend(
            spec, base_url=base_url, api_key=api_key, offline=("registry",)
        )  # refuses a spec naming no server
        self.cache = AnswerCache(Path(cache_dir) if cache_dir else None)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.calls = 0
        self.tokens = 0
        self.cache_hits = 0

    @property
    def model(self) -> str:
        return self.backend.model

    def converse(self, messages: list[dict[str, Any]]) -> str:
        """The model's answer to the conversation so far (from the cache when it was asked before)."""
        key = self.cache.key(self.model, json.dumps(messages, sort_keys=True, ensure_ascii=False))
        cached = self.cache.get(key)
        if cached is not None:
            self.cache_hits += 1
            return cached
        [completion] = self.backend.generate(
            [messages], max_new_tokens=self.max_new_tokens, temperature=self.temperature
        )
        self.calls += 1
        self.tokens += (completion.prompt_tokens or 0) + (completion.completion_tokens or 0)
        text = completion.text or ""
        self.cache.put(key, text)
        return text
