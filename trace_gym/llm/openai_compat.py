"""Any OpenAI-compatible chat endpoint (vLLM, OpenAI, ...) through the openai SDK.

Native tool calls; a time-out per request; retries with exponential back-off
on transient errors (connection, time-out, 429, 5xx) and none on errors that
will not go away (bad key, unknown model, bad request); bounded concurrency.
Base URL, key and model come from arguments or ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .base import Completion, LLMError


class OpenAICompatible:
    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 3, backoff_s: float = 0.5, concurrency: int = 8):
        try:
            import openai
        except ImportError:
            raise LLMError("OpenAI-compatible models need the openai package") from None
        self.openai = openai
        self.model = model
        self.name = f"openai:{model}"
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
                                    timeout=timeout, max_retries=0)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.concurrency = max(1, concurrency)
        self.calls = 0
        self._lock = threading.Lock()

    def generate(self, conversations: list[list[dict[str, Any]]], *, tools: list[dict[str, Any]] | None = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, seed: int | None = None,
                 adapter: str | None = None) -> list[Completion]:
        # A LoRA served by vLLM is addressed as its own model name.
        model = adapter or self.model
        one = lambda messages: self._complete(model, messages, tools, max_new_tokens, temperature, seed)  # noqa: E731
        if len(conversations) == 1:
            return [one(conversations[0])]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(one, conversations))

    def _complete(self, model, messages, tools, max_new_tokens, temperature, seed) -> Completion:
        errors = self.openai
        request: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_new_tokens, "temperature": temperature}
        if tools:
            request["tools"] = tools
        if seed is not None:
            request["seed"] = seed
        for attempt in range(self.max_retries + 1):
            try:
                with self._lock:
                    self.calls += 1
                response = self.client.chat.completions.create(**request)
                break
            except errors.AuthenticationError as exc:
                raise LLMError(f"the API key was refused by {self.base_url} ({_short(exc)})") from None
            except errors.NotFoundError as exc:
                raise LLMError(f"unknown model '{model}' at {self.base_url} ({_short(exc)})") from None
            except (errors.APIConnectionError, errors.APITimeoutError, errors.RateLimitError, errors.InternalServerError) as exc:
                if attempt == self.max_retries:
                    raise LLMError(f"no answer from {self.base_url} after {attempt + 1} tries ({_short(exc)})") from None
                time.sleep(self.backoff_s * (2 ** attempt))
            except errors.APIStatusError as exc:
                raise LLMError(f"{self.base_url} refused the request ({_short(exc)})") from None
        choice = response.choices[0]
        usage = response.usage
        calls = []
        for call in choice.message.tool_calls or []:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = call.function.arguments  # kept as written: the env will say what is wrong
            calls.append({"id": call.id, "name": call.function.name, "arguments": arguments})
        return Completion.from_tool_calls(
            choice.message.content, calls, prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None), finish_reason=choice.finish_reason,
        )


def _short(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
