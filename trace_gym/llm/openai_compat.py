"""Any OpenAI-compatible chat endpoint (vLLM, OpenAI, ...) through the openai SDK.

Native tool calls; a time-out per request; retries with exponential back-off
on transient errors (connection, time-out, 429, 5xx) and none on errors that
will not go away (bad key, unknown model, bad request); bounded concurrency.
Base URL, key and model come from arguments or ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY``. Each request of a batch keeps its own seed, temperature
and adapter (a LoRA served by vLLM is addressed as its own model name).

``score(conversation, labels)`` asks for ``top_logprobs`` on the first token
of the reply and reads each label's first token there: labels must differ in
their first token (checked), and a label whose first token is outside the
server's top ``top_logprobs`` gets ``-inf``. A server that returns no logprobs
is an ``LLMError`` that says so; per-label sequence logprobs (prompt logprobs
with ``echo``) are not implemented.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any

from .base import Completion, GenerationRequest, LLMError, RemoteRequests, plain_messages, request_timeout


class OpenAICompatible(RemoteRequests):
    token_level = False

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        concurrency: int = 8,
    ):
        try:
            import openai
        except ImportError:
            raise LLMError("OpenAI-compatible models need the openai package") from None
        self.openai = openai
        self.model = model
        self.name = f"openai:{model}"
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=request_timeout(timeout, 60.0),
            max_retries=0,
        )
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.concurrency = max(1, concurrency)
        self.calls = 0
        self._lock = threading.Lock()

    def _one(self, r: GenerationRequest) -> Completion:
        request: dict[str, Any] = {
            "model": r.adapter or self.model,
            "messages": plain_messages(r.messages),
            "max_tokens": r.max_new_tokens,
            "temperature": r.temperature,
        }
        if r.tools:
            request["tools"] = plain_messages(r.tools)
        if r.seed is not None:
            request["seed"] = r.seed
        response = self._create(request)
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
            choice.message.content,
            calls,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            finish_reason=choice.finish_reason,
        )

    def score(
        self,
        conversation: list[dict[str, Any]],
        labels: list[str],
        *,
        tools: list[dict[str, Any]] | None = None,
        adapter: str | None = None,
        top_logprobs: int = 20,
    ) -> dict[str, float]:
        """``{label: logprob of its first token}`` from ``top_logprobs`` on the reply's first token."""
        if not labels:
            raise LLMError("score needs at least one label")
        request: dict[str, Any] = {
            "model": adapter or self.model,
            "messages": plain_messages(conversation),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": top_logprobs,
        }
        if tools:
            request["tools"] = plain_messages(tools)
        choice = self._create(request).choices[0]
        content = getattr(getattr(choice, "logprobs", None), "content", None)
        if not content or not content[0].top_logprobs:
            raise LLMError(
                f"{self.base_url} returned no top_logprobs for model '{request['model']}': this server offers "
                "neither first-token top_logprobs nor per-label logprobs, so it cannot score labels"
            )
        top = {entry.token: entry.logprob for entry in content[0].top_logprobs}
        out: dict[str, float] = {}
        owners: dict[str, str] = {}
        for label in labels:
            best = max(
                (t for t in top if t.strip() and label.startswith(t.strip())),
                key=lambda t: len(t.strip()),
                default=None,
            )
            if best is not None and best in owners:
                raise LLMError(
                    f"labels {owners[best]!r} and {label!r} share their first token {best!r}: first-token "
                    "logprobs cannot tell them apart"
                )
            if best is not None:
                owners[best] = label
            out[label] = top[best] if best is not None else -math.inf
        return out

    def _create(self, request: dict[str, Any]) -> Any:
        errors = self.openai
        model = request["model"]
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
            except (
                errors.APIConnectionError,
                errors.APITimeoutError,
                errors.RateLimitError,
                errors.InternalServerError,
            ) as exc:
                if attempt == self.max_retries:
                    raise LLMError(
                        f"no answer from {self.base_url} after {attempt + 1} tries ({_short(exc)})"
                    ) from None
                time.sleep(self.backoff_s * (2**attempt))
            except errors.APIStatusError as exc:
                raise LLMError(f"{self.base_url} refused the request ({_short(exc)})") from None
        return response


def _short(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
