"""Model backends for policies, routers and analysts.

A backend turns chat conversations into completions::

    backend = make_backend("smollm2-135m-instruct")     # the embedded default, offline
    backend = make_backend("openai:gpt-4o-mini")         # any OpenAI-compatible server
    backend = make_backend("hf:/path/to/model")          # a local Hugging Face model
    [completion] = backend.generate([messages], tools=tools)

Nothing here downloads weights from a hub.
"""

from __future__ import annotations

from .base import Completion, LLMBackend, LLMError
from .registry import EMBEDDED_DEFAULT, make_backend

__all__ = ["Completion", "LLMBackend", "LLMError", "EMBEDDED_DEFAULT", "make_backend"]
