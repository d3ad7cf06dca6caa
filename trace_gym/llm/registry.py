"""Model specs to backends: ``smollm2-135m-instruct``, ``openai:<model>``, ``hf:<path>``, ``vllm:<model>``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import LLMBackend, LLMError
from .embedded import EMBEDDED_MODELS, EMBEDDED_NAME

EMBEDDED_DEFAULT = EMBEDDED_NAME


REMOTE_PREFIXES = ("openai:", "vllm:")


def local_folder(spec: str) -> tuple[str, str | None]:
    """(folder, chat template to set, or None) of a local model spec: an embedded model's
    name (its folder in the cache, under our tool-call template, set every time so that
    a model cached by an older version plays under the current one) or ``hf:<folder>``
    (a bare folder too). The one reading of a local spec: backends, training and the
    vLLM client's tokenizer all take it from here. Never reaches a hub."""
    if spec in EMBEDDED_MODELS:
        from .embedded import TOOL_CHAT_TEMPLATE, local_model

        return str(local_model(spec)), TOOL_CHAT_TEMPLATE
    if spec.startswith(REMOTE_PREFIXES):
        raise LLMError(f"{spec} is a model behind a server, not a local folder; use {EMBEDDED_NAME} or hf:<local folder>")
    folder = spec.removeprefix("hf:")
    if not Path(folder).is_dir():
        raise LLMError(f"no local model folder at {folder}: trace-gym loads local models only and never downloads weights")
    return folder, None


def make_backend(spec: str, **kwargs: Any) -> LLMBackend:
    if spec in EMBEDDED_MODELS or spec.startswith("hf:"):
        from .local_hf import LocalHF

        folder, template = local_folder(spec)
        names = {"name": spec} if spec in EMBEDDED_MODELS else {}
        return LocalHF(folder, **names, **({"chat_template": template} if template else {}), **kwargs)
    if spec.startswith("openai:"):
        from .openai_compat import OpenAICompatible

        return OpenAICompatible(spec.removeprefix("openai:"), **kwargs)
    if spec.startswith("vllm:"):
        from .vllm_tokens import VLLMTokens

        return VLLMTokens(spec.removeprefix("vllm:"), **kwargs)
    raise LLMError(f"unknown model '{spec}'; use {', '.join(EMBEDDED_MODELS)}, openai:<model>, hf:<local path> or "
                   "vllm:<model> (a vLLM server's token-id completions)")
