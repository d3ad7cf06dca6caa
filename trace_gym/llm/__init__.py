"""Model backends for policies, routers and analysts.

A backend turns chat conversations into completions::

    backend = make_backend("smollm2-135m-instruct")     # the embedded default, offline
    backend = make_backend("openai:gpt-4o-mini")         # any OpenAI-compatible server
    backend = make_backend("hf:/path/to/model")          # a local Hugging Face model
    [completion] = backend.generate([messages], tools=tools)
    completions = backend.complete([GenerationRequest(messages, tools=tools, seed=1, temperature=0.7), ...])
    backend.score(messages, ["refund", "exchange"])      # {label: logprob}, the router's input

Local models are token-level: each ``Completion`` carries the exact prompt and
sampled ids with logprobs (``TokenTurn``); an episode's turns make a
``TokenEpisode`` (one id sequence + the mask of sampled tokens).
Nothing here downloads weights from a hub.
"""

from __future__ import annotations

from .base import Completion, GenerationRequest, LLMBackend, LLMError, TokenEpisode, TokenTurn
from .registry import EMBEDDED_DEFAULT, make_backend

__all__ = [
    "Completion",
    "GenerationRequest",
    "LLMBackend",
    "LLMError",
    "TokenEpisode",
    "TokenTurn",
    "EMBEDDED_DEFAULT",
    "make_backend",
]
