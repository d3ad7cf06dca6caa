"""What every backend takes and returns, and its one error type.

- ``GenerationRequest``: one row of a batched generation, with its own
  sampling settings (seed, temperature, adapter), so a batch of episodes never
  borrows one episode's settings for all.
- ``Completion``: one model turn as text (what the env hears), plus, from a
  local model, the exact tokens (``TokenTurn``).
- ``TokenEpisode``: a whole multi-turn episode at the token level, the shape a
  GRPO trainer consumes (one id sequence, a mask that is 1 exactly on sampled
  tokens, the sampled tokens' logprobs).

Nothing here runs a model.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trace_gym.errors import TraceGymError


class LLMError(TraceGymError):
    """A model could not answer: unreachable endpoint, bad key, unknown model..."""


# The turn boundaries of the chat templates trace-gym supports (ChatML as SmolLM2 and
# Qwen write it; Llama 3.x), for a backend whose tokenizer we cannot see (an
# OpenAI-compatible server: vLLM renders the template and parses these as control
# ids). A local model uses its own tokenizer's added tokens instead.
CONTROL_STRINGS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
_JOINER = "\u2060"  # WORD JOINER: invisible, and no tokenizer merges it into a control token
_SURROGATE = re.compile("[\ud800-\udfff]")


def control_pattern(strings: Iterable[str]) -> re.Pattern[str]:
    """One regex matching any of ``strings`` (longest first); strings of one character
    cannot be split and are left out."""
    unique = sorted({s for s in strings if len(s) > 1}, key=len, reverse=True)
    return re.compile("|".join(re.escape(s) for s in unique)) if unique else re.compile(r"(?!x)x")


_DEFAULT_PATTERN = control_pattern(CONTROL_STRINGS)


def plain_text(text: str, pattern: re.Pattern[str] = _DEFAULT_PATTERN) -> str:
    """``text`` as data, never control: a lone surrogate (which no tokenizer or JSON
    writer accepts) becomes U+FFFD, and every control string in it is split by an
    invisible WORD JOINER after its first character, so the tokenizer reads it as
    ordinary text and no env, user simulator or tool can forge a turn boundary."""
    text = _SURROGATE.sub("\ufffd", text)
    for _ in range(8):  # a split cannot make a new match; the loop is a backstop
        escaped = pattern.sub(lambda m: m.group(0)[0] + _JOINER + m.group(0)[1:], text)
        if escaped == text:
            break
        text = escaped
    return text


def _walk(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return plain_text(value, pattern)
    if isinstance(value, dict):
        return {_walk(k, pattern): _walk(v, pattern) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, pattern) for v in value]
    return value


def plain_messages(
    messages: list[dict[str, Any]],
    pattern: re.Pattern[str] = _DEFAULT_PATTERN,
    turn_pattern: re.Pattern[str] | None = None,
) -> list[dict[str, Any]]:
    """A copy of ``messages`` (or tool schemas) with every string in them, keys
    included, made ``plain_text``: what a system prompt, a user (or its simulator),
    a tool or an env wrote. The ``role`` of each message is the template's. An
    assistant message may hold the model's own tool-call markup (Qwen's ``<tool_call>``
    is an added token), so only ``turn_pattern`` (the turn boundaries; default:
    ``pattern``) is split there: an oracle's or a log's assistant text taught by SFT
    can no more close a turn than an env's observation can."""
    turns = turn_pattern or pattern

    def walk(value: Any) -> Any:
        return _walk(value, pattern)

    def message(m: Any) -> Any:
        if not isinstance(m, dict):
            return walk(m)
        if m.get("role") == "assistant":
            return {k: v if k == "role" else _walk(v, turns) for k, v in m.items()}
        return {k: v if k == "role" else walk(v) for k, v in m.items()}

    return [message(m) for m in messages]


@dataclass
class GenerationRequest:
    """One conversation to continue, with its own settings.

    ``prompt_ids``, when given (token-level backends), are the exact ids to
    condition on; ``messages`` are then kept for reference only.
    ``session`` names the episode the request belongs to, so a backend that
    caches keys and values can extend that episode's cache turn by turn;
    ``prefix_len`` says how many leading ``prompt_ids`` are the shareable
    system prompt + tool schemas.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int | None = None
    adapter: str | None = None
    prompt_ids: list[int] | None = None
    prefix_len: int = 0
    session: str | None = None


@dataclass
class TokenTurn:
    """One agent turn at the token level.

    ``prompt_ids`` are exactly the ids the model was conditioned on;
    ``completion_ids`` exactly what it sampled (a closing end-of-turn token
    included when it sampled one); ``logprobs[i]`` is the log-probability of
    ``completion_ids[i]`` under the distribution it was sampled from (the
    logits divided by the temperature; plain logits for greedy decoding).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


@dataclass
class TokenEpisode:
    """A multi-turn episode as one token sequence.

    Turn ``k+1``'s prompt is turn ``k``'s prompt + completion + the ids of
    what the environment said in between (rendered with the chat template on
    its own, never by re-tokenizing decoded text), so the whole episode is
    the last prompt + the last completion, and ``mask`` is 1 exactly on the
    positions the model sampled (0 on the system prompt, tool schemas, tool
    results, user turns and template tokens).
    """

    turns: list[TokenTurn] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        if not self.turns:
            return []
        last = self.turns[-1]
        return [*last.prompt_ids, *last.completion_ids]

    def _spans(self) -> list[tuple[int, int]]:
        return [(len(t.prompt_ids), len(t.prompt_ids) + len(t.completion_ids)) for t in self.turns]

    @property
    def mask(self) -> list[int]:
        mask = [0] * len(self.ids)
        for start, end in self._spans():
            mask[start:end] = [1] * (end - start)
        return mask

    @property
    def logprobs(self) -> list[float]:
        """One value per position of ``ids``: the sampled token's logprob, 0.0 elsewhere."""
        out = [0.0] * len(self.ids)
        for (start, end), turn in zip(self._spans(), self.turns):
            out[start:end] = turn.logprobs
        return out

    def check(self) -> None:
        """Raise ``LLMError`` unless every turn extends the previous one token for token."""
        for k in range(1, len(self.turns)):
            before = [*self.turns[k - 1].prompt_ids, *self.turns[k - 1].completion_ids]
            if self.turns[k].prompt_ids[: len(before)] != before:
                raise LLMError(f"turn {k}'s prompt does not extend turn {k - 1}'s prompt + completion")

    def for_grpo(self) -> dict[str, list]:
        """The episode as TRL's ``GRPOTrainer`` ``rollout_func`` fields: the
        first prompt, everything after it as the "completion", the logprobs over
        that completion (0.0 on environment tokens) and ``env_mask`` (1 on sampled
        tokens, 0 on environment, user and template tokens)."""
        if not self.turns:
            return {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        start = len(self.turns[0].prompt_ids)
        return {
            "prompt_ids": list(self.turns[0].prompt_ids),
            "completion_ids": self.ids[start:],
            "logprobs": self.logprobs[start:],
            "env_mask": self.mask[start:],
        }


@dataclass
class Completion:
    """One model turn. ``text`` is what the agent sends to the env: the model's
    text, or its native tool calls written as ``<tool_call>`` blocks. ``tokens``
    holds the exact ids and logprobs when the backend is token-level."""

    text: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{"id", "name", "arguments"}]
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tokens: TokenTurn | None = None

    @classmethod
    def from_tool_calls(cls, content: str | None, calls: list[dict[str, Any]], **usage: Any) -> "Completion":
        """Native tool calls as text; arguments that were not valid JSON are kept as
        written, so the env's parser reports them as the model's mistake."""

        def block(call: dict[str, Any]) -> str:
            arguments = call["arguments"]
            rendered = json.dumps(arguments, ensure_ascii=False) if isinstance(arguments, dict) else str(arguments)
            return f'<tool_call>{{"name": {json.dumps(call["name"])}, "arguments": {rendered}}}</tool_call>'

        blocks = "".join(block(c) for c in calls)
        return cls(
            text=((content or "").strip() + "\n" + blocks).strip() if calls else (content or ""),
            tool_calls=calls,
            **usage,
        )


def requests_for(
    conversations: list[list[dict[str, Any]]],
    *,
    tools: list[dict[str, Any]] | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int | None = None,
    adapter: str | None = None,
) -> list[GenerationRequest]:
    """Conversations that share one set of settings, as requests (``generate``'s path)."""
    return [
        GenerationRequest(
            messages=c, tools=tools, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, adapter=adapter
        )
        for c in conversations
    ]


class Generates:
    """``generate`` for a backend whose ``complete`` takes requests (every backend here)."""

    def complete(self, requests: list[GenerationRequest]) -> list[Completion]:
        raise NotImplementedError

    def generate(
        self,
        conversations: list[list[dict[str, Any]]],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        adapter: str | None = None,
    ) -> list[Completion]:
        return self.complete(
            requests_for(
                conversations,
                tools=tools,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
                adapter=adapter,
            )
        )


REQUEST_TIMEOUT_ENV = "TRACE_GYM_REQUEST_TIMEOUT"


def request_timeout(given: float | None, default: float) -> float:
    """Seconds a remote backend waits for one answer: ``given``, else
    ``TRACE_GYM_REQUEST_TIMEOUT``, else ``default`` (a CPU server answering a
    batch of long prompts can need more than a GPU's default)."""
    if given is not None:
        return given
    raw = os.environ.get(REQUEST_TIMEOUT_ENV, "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise LLMError(f"{REQUEST_TIMEOUT_ENV}={raw!r}: give a number of seconds above 0")
    return seconds


class RemoteRequests(Generates):
    """``complete`` for a backend that sends each request to a server (``_one``),
    ``concurrency`` at a time: the server batches what arrives together."""

    concurrency: int = 8

    def _one(self, request: GenerationRequest) -> Completion:
        raise NotImplementedError

    def complete(self, requests: list[GenerationRequest]) -> list[Completion]:
        if len(requests) == 1:
            return [self._one(requests[0])]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))


class LLMBackend(Protocol):
    name: str
    token_level: bool  # True: completions carry ``tokens`` and requests may carry ``prompt_ids``

    def complete(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One completion per request, each under its own settings."""

    def generate(
        self,
        conversations: list[list[dict[str, Any]]],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        adapter: str | None = None,
    ) -> list[Completion]:
        """One completion per conversation (OpenAI chat messages), shared settings."""

    def score(
        self,
        conversation: list[dict[str, Any]],
        labels: list[str],
        *,
        tools: list[dict[str, Any]] | None = None,
        adapter: str | None = None,
    ) -> dict[str, float]:
        """The log-probability of each label as the model's next reply to ``conversation``."""


# What some backends can do beyond LLMBackend; callers test for them with isinstance.
@runtime_checkable
class KeepsSessions(Protocol):
    def release(self, session: str) -> None:
        """Forget what is cached for episode ``session`` (it has ended)."""


@runtime_checkable
class LoadsAdapters(Protocol):
    def load_adapter(self, name: str, path: str) -> None:
        """Serve LoRA adapter ``path`` under ``name`` (local models; a vLLM server that allows it)."""


@runtime_checkable
class SumsAdapters(Protocol):
    def add_summed_adapter(self, name: str, sources: list[str]) -> None:
        """A new adapter ``name``, the sum of the ``sources``' weight updates."""

    def save_adapter(self, name: str, folder: str | Path) -> Path:
        """Write adapter ``name`` as a PEFT folder; returns it."""


@runtime_checkable
class NextTokenLogprobs(Protocol):
    def next_token_logprobs(
        self, ids: list[int], *, prefix_len: int = 0, adapter: str | None = None, k: int = 20
    ) -> list[tuple[int, float]]:
        """The ``k`` likeliest next tokens after ``ids`` with their logprobs."""
