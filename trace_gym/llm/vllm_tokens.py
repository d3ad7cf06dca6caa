"""A vLLM server (or ``trace-gym serve``) through its token-id completions: ids in,
sampled ids and their logprobs out, the same contract as a local model.

``vllm:<model>`` renders conversations here, with the model's own tokenizer
and the template ``LocalHF`` would choose (``TokenTemplate``), and sends the
ids to ``POST /v1/completions`` (``prompt`` a list of ids, ``logprobs``,
``return_tokens_as_token_ids``, ``return_token_ids``); so an episode played
through a server is the token sequence a local model would have played, and
GRPO can train on it. vLLM re-renders chat transcripts through its own parser;
this path never asks it to.

The tokenizer comes from ``tokenizer`` (a local folder or an embedded model's
name) or, by default, from ``<model>`` itself: ``vllm serve /models/Llama-3.1-8B``
names its model by that path. The server comes from ``base_url`` or
``OPENAI_BASE_URL``. Adapters are addressed by name (vLLM serves a LoRA as its
own model id); ``load_adapter`` loads one at run time through
``/v1/load_lora_adapter`` (vLLM needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).
vLLM's logprobs are the model's own unless it is started with
``--logprobs-mode processed_logprobs``; ``trace-gym serve`` returns those of
the distribution sampled from, as a local model records them. ``score`` (the
router's label scores) reads one greedy token's top logprobs, so labels must differ
in their first token.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .base import Completion, GenerationRequest, LLMError, RemoteRequests, request_timeout
from .registry import LOCAL_FOLDER, load_tokenizer, local_folder
from .token_template import TokenTemplate

_TOKEN_ID = "token_id:"
NEUTRAL_SAMPLING = {
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""Sent with every request: vLLM fills any sampling setting a request leaves out from the model's
generation_config.json (``--generation-config auto``, its default), e.g. Qwen2.5's top_p 0.8 and
repetition penalty 1.05; the local model samples from the plain tempered softmax."""


class VLLMTokens(TokenTemplate, RemoteRequests):
    token_level = True

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        concurrency: int = 8,
        template: str = "auto",
        max_retries: int = 3,
        backoff_s: float = 0.5,
    ):
        try:
            from transformers import AutoConfig
        except ImportError as exc:
            raise LLMError(f"vllm: models need transformers for their tokenizer ({exc}); run make setup") from None

        self.model = model
        self.name = f"vllm:{model}"
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "http://127.0.0.1:8000/v1").rstrip("/")
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout, self.concurrency = request_timeout(timeout, 120.0), max(1, concurrency)
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self.adapters: dict[str, str] = {}
        folder, chat_template = tokenizer_folder(tokenizer or model)
        self.tokenizer = load_tokenizer(folder)
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError):
            config = None
        self.context_size: int | None = getattr(config, "max_position_embeddings", None)
        try:
            from transformers import GenerationConfig

            generation_eos = GenerationConfig.from_pretrained(folder, local_files_only=True).eos_token_id
        except OSError:  # no generation_config.json: what transformers derives from the model's config
            generation_eos = GenerationConfig.from_model_config(config).eos_token_id if config is not None else None
        self._set_template(chat_template, template, generation_eos)

    # --- the backend protocol -------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        """Ask the server to load a LoRA (a folder it can read) under ``name``; one it
        already holds under that name counts as loaded."""
        try:
            self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}, text=True)
        except LLMError as exc:
            if "already" not in str(exc):
                raise
        self.adapters[name] = str(path)

    def score(
        self,
        conversation: list[dict[str, Any]],
        labels: list[str],
        *,
        tools: list[dict[str, Any]] | None = None,
        adapter: str | None = None,
        top_logprobs: int = 20,
    ) -> dict[str, float]:
        """``{label: logprob of its first token}`` as the start of the next reply: one
        greedy token with the server's ``top_logprobs`` first tokens (vLLM's ``logprobs:
        k``); a label outside them scores -inf. Only the first token counts, as with any
        server: labels must differ in it (the router's ``A``, ``B``, ``none`` do)."""
        if not labels:
            raise LLMError("score needs at least one label")
        firsts: dict[int, str] = {}
        for label in labels:
            ids = self._encode(label)
            if not ids:
                raise LLMError(f"label {label!r} has no tokens")
            if ids[0] in firsts:
                raise LLMError(
                    f"labels {firsts[ids[0]]!r} and {label!r} share their first token: first-token logprobs "
                    "cannot tell them apart"
                )
            firsts[ids[0]] = label
        ids, prefix_len = self.encode_conversation(conversation, tools)
        body = {
            "model": adapter or self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            **NEUTRAL_SAMPLING,
            "logprobs": top_logprobs,
            "return_tokens_as_token_ids": True,
            "prefix_len": prefix_len,
        }
        answer = self._post("/completions", body)
        try:
            top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
            scores = {int(str(key).removeprefix(_TOKEN_ID)): float(value) for key, value in top.items()}
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise LLMError(
                f"{self.base_url}/completions gave no top logprobs of the first token (a vLLM server answers "
                "them to logprobs: k with return_tokens_as_token_ids)"
            ) from None
        return {label: scores.get(first, -math.inf) for first, label in firsts.items()}

    def release(self, session: str) -> None:
        """Nothing to release: the server keeps its own caches."""

    def clear_cache(self) -> None:
        """Nothing to clear here (the server's prefix cache follows its weights)."""

    # --- one request ------------------------------------------------------------------------------
    def _one(self, request: GenerationRequest) -> Completion:
        if request.prompt_ids is not None:
            ids, prefix_len = list(request.prompt_ids), request.prefix_len
        else:
            ids, prefix_len = self.encode_conversation(request.messages, request.tools)
        if self.context_size and len(ids) + request.max_new_tokens > self.context_size:
            raise LLMError(
                f"a prompt of {len(ids)} tokens with max_new_tokens {request.max_new_tokens} passes "
                f"{self.name}'s context of {self.context_size} tokens"
            )
        body = {
            "model": request.adapter or self.model,
            "prompt": ids,
            "max_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            **NEUTRAL_SAMPLING,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": sorted(self.stop_ids),
            "prefix_len": prefix_len,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        answer = self._post("/completions", body)
        try:
            choice = answer["choices"][0]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            sampled = choice.get("token_ids")
            if sampled is None:
                sampled = [int(t.removeprefix(_TOKEN_ID)) for t in choice["logprobs"]["tokens"]]
            sampled = [int(i) for i in sampled]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise LLMError(
                f"{self.base_url}/completions gave no sampled token ids with logprobs (a vLLM server "
                "answers them to return_tokens_as_token_ids and logprobs)"
            ) from None
        if len(sampled) != len(logprobs):
            raise LLMError(f"{self.base_url}/completions gave {len(sampled)} token ids and {len(logprobs)} logprobs")
        return self._completion(ids, sampled, logprobs)

    def _post(self, path: str, body: dict[str, Any], text: bool = False) -> Any:
        data = json.dumps(body).encode("utf-8")
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(
                url,
                data=data,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read().decode("utf-8")
                return raw if text else json.loads(raw)
            except urllib.error.HTTPError as exc:
                detail = _error_message(exc)
                if exc.code not in (429, 502, 503):  # only a busy or restarting server is asked again
                    raise LLMError(f"{url}: {exc.code} {detail}") from None
                failure = f"{exc.code} {detail}"
            except (TimeoutError, urllib.error.URLError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                    # the server may still be generating it: asking again would only add load
                    raise LLMError(f"{url}: no answer within {self.timeout:.0f} s") from None
                failure = str(reason)
            except ConnectionError as exc:
                failure = str(exc)
            except json.JSONDecodeError:
                raise LLMError(f"{url} answered something that is not JSON") from None
            if attempt < self.max_retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise LLMError(f"{url}: no answer after {self.max_retries + 1} tries ({failure})")


def _error_message(exc: Any) -> str:
    """The server's words for an HTTP error; the error's connection is closed once read."""
    try:
        payload = json.loads(exc.read().decode("utf-8"))
        return str(payload.get("error", {}).get("message") or payload)
    except Exception:  # noqa: BLE001 - whatever the body was, the status says enough
        return exc.reason or ""
    finally:
        exc.close()


def tokenizer_folder(spec: str) -> tuple[str, str | None]:
    """(local folder, chat template to set or None) of a tokenizer spec: an embedded
    model's name, ``hf:<folder>`` or a folder."""
    try:
        folder, template = local_folder(spec)
    except LLMError:
        folder, template = spec.removeprefix(LOCAL_FOLDER), None
    if not (Path(folder) / "tokenizer_config.json").exists():
        raise LLMError(
            f"vllm:{spec}: no tokenizer at {folder}; the client renders conversations itself, so it needs "
            "the model's tokenizer here (tokenizer=<local folder> or an embedded model's name)"
        )
    return folder, template
