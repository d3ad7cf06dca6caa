"""Model specs to backends: ``smollm2-135m-instruct``, ``openai:<model>``, ``hf:<path>``, ``vllm:<model>``."""

from __future__ import annotations

from typing import Any

from .base import LLMBackend, LLMError
from .embedded import EMBEDDED_MODELS, EMBEDDED_NAME

EMBEDDED_DEFAULT = EMBEDDED_NAME


def make_backend(spec: str, **kwargs: Any) -> LLMBackend:
    if spec in EMBEDDED_MODELS:
        from .embedded import TOOL_CHAT_TEMPLATE, local_model
        from .local_hf import LocalHF

        # The template is set here too, so a model cached by an older version gets the current one.
        return LocalHF(str(local_model(spec)), name=spec, chat_template=TOOL_CHAT_TEMPLATE, **kwargs)
    if spec.startswith("openai:"):
        from .openai_compat import OpenAICompatible

        return OpenAICompatible(spec.removeprefix("openai:"), **kwargs)
    if spec.startswith("hf:"):
        from .local_hf import LocalHF

        return LocalHF(spec.removeprefix("hf:"), **kwargs)
    if spec.startswith("vllm:"):
        from .vllm_tokens import VLLMTokens

        return VLLMTokens(spec.removeprefix("vllm:"), **kwargs)
    raise LLMError(f"unknown model '{spec}'; use {', '.join(EMBEDDED_MODELS)}, openai:<model>, hf:<local path> or "
                   "vllm:<model> (a vLLM server's token-id completions)")
