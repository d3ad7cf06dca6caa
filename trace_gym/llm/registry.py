"""Model specs to backends: ``smollm2-135m-instruct``, ``openai:<model>``, ``hf:<path>``, ``vllm:<model>``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .base import LLMBackend, LLMError
from .embedded import EMBEDDED_MODELS, EMBEDDED_NAME

EMBEDDED_DEFAULT = EMBEDDED_NAME


CHAT_ENDPOINT = "openai:"
TOKEN_ENDPOINT = "vllm:"
LOCAL_FOLDER = "hf:"
TEMPLATE_OPTION = "?template="
"""A local or ``vllm:`` spec may name the chat template its model plays under:
``hf:/models/qwen3-8b?template=qwen3_training`` (``templates.CHOICES``, a template's
name, ours or TRL's, or a ``.jinja`` path). ``[policy] chat_template`` and ``--chat-template`` write it so;
the spec then carries it through every stage, into run records and resume checks."""


def _names_a_model(spec: str, prefix: str) -> bool:
    """``spec`` is ``prefix`` followed by a model's name (a bare ``openai:`` names none)."""
    return spec.startswith(prefix) and bool(spec[len(prefix) :].strip())


def is_chat_endpoint(spec: str) -> bool:
    """An ``openai:<model>`` spec: a server that renders conversations itself, knows its
    adapters by name (vLLM's ``--lora-modules``) and is played by concurrent requests."""
    return _names_a_model(spec, CHAT_ENDPOINT)


def is_token_endpoint(spec: str) -> bool:
    """A ``vllm:<model>`` spec: a server answering token-id completions; the conversation
    is rendered here, under a local tokenizer's chat template."""
    return _names_a_model(spec, TOKEN_ENDPOINT)


def local_spec(folder: str | Path) -> str:
    """The model spec of a local model folder: ``hf:<folder>``."""
    return f"{LOCAL_FOLDER}{folder}"


def is_server(spec: str) -> bool:
    """A model behind a server (``openai:`` or ``vllm:``), which may take a base URL and key."""
    return is_chat_endpoint(spec) or is_token_endpoint(spec)


def is_local(spec: str) -> bool:
    """A model played in this process (the embedded one, an ``hf:`` folder), not through
    a server (``openai:``, ``vllm:``)."""
    model = split_spec(spec)[0]
    return model in EMBEDDED_MODELS or model.startswith(LOCAL_FOLDER)


def split_spec(spec: str) -> tuple[str, str]:
    """(model spec, chat template choice: ``auto`` unless the spec names one)."""
    model, sep, choice = spec.partition(TEMPLATE_OPTION)
    if sep and not choice.strip():
        raise LLMError(f"model '{spec}': '{TEMPLATE_OPTION}' names no template")
    return model, choice.strip() or "auto"


def with_template(spec: str, template: str | None) -> str:
    """``spec`` playing under chat template ``template`` (None or ``auto``: as it is). The one
    place a choice is checked: a name that is no template, a second template, or one for a
    server that renders its own is refused in one line."""
    from .templates import check_choice

    model, current = split_spec(spec)
    if not template or template == "auto":
        return spec
    check_choice(template)
    if current not in ("auto", template):
        raise LLMError(f"model '{spec}' already names chat template '{current}', not '{template}'")
    if is_chat_endpoint(model):
        raise LLMError(
            f"{model}: an OpenAI-compatible server renders conversations with its own chat template; "
            "set it on the server (vLLM: --chat-template), or use vllm:<model> to render here"
        )
    if template.endswith(".jinja"):  # a file: named absolutely, so that a later command elsewhere finds it
        template = str(Path(template).expanduser().resolve())
    return f"{model}{TEMPLATE_OPTION}{template}"


def local_folder(spec: str) -> tuple[str, str | None]:
    """(folder, chat template to set, or None) of a local model spec: an embedded model's
    name (its folder in the cache, under our tool-call template or the one its warm start
    ships, set every time so that a model cached by an older version plays under the
    current one) or ``hf:<folder>`` (a bare folder too). The one reading of a local spec: backends, training and the
    vLLM client's tokenizer all take it from here (a template choice in the spec is
    ``split_spec``'s to read). Never reaches a hub."""
    spec = split_spec(spec)[0]
    if spec in EMBEDDED_MODELS:
        from .embedded import chat_template_of, local_model

        return str(local_model(spec)), chat_template_of(spec)
    if is_server(spec):
        raise LLMError(
            f"{spec} is a model behind a server, not a local folder; use {EMBEDDED_NAME} or hf:<local folder>"
        )
    folder = spec.removeprefix(LOCAL_FOLDER)
    if not Path(folder).is_dir():
        raise LLMError(
            f"no local model folder at {folder}: trace-gym loads local models only and never downloads weights"
        )
    return folder, None


def load_tokenizer(folder: str, *, chat_template: str | None = None, appending: str | None = None) -> Any:
    """The tokenizer of a local model folder, under ``chat_template`` where given and
    with a pad token (its end-of-text where it has none). With ``appending`` (a
    ``templates.choose`` choice), it plays under that choice, and one that cannot append
    turn by turn is refused in one line. The one reading of a tokenizer folder: backends,
    the vLLM client, training and merges all take theirs from here (a backend over a
    tokenizer object handed in gives it its pad token through :func:`with_pad_token` too)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if appending is not None and appending != "auto":
        from .templates import CANNOT_APPEND, choose

        tokenizer.chat_template, note = choose(tokenizer, appending)
        if note.endswith(CANNOT_APPEND):
            raise LLMError(f"its chat template {note}")
    return with_pad_token(tokenizer)


def with_pad_token(tokenizer: Any) -> Any:
    """``tokenizer``, given its end-of-text as pad token where it has none (batches pad)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_local(
    folder: str, *, dtype: Any, device: str = "cpu", chat_template: str | None = None, appending: str | None = None
) -> tuple[Any, Any]:
    """(model, tokenizer) of a local model folder, weights in ``dtype`` on ``device``, the
    tokenizer as :func:`load_tokenizer` gives it (read first, so that a template that
    cannot append is refused before the weights load). The one loader: backends, training
    and merges all load through it."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(folder, chat_template=chat_template, appending=appending)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype)
    return (model.to(device) if device != "cpu" else model), tokenizer


def make_backend(spec: str, **kwargs: Any) -> LLMBackend:
    model, choice = split_spec(spec)
    if choice != "auto":
        with_template(model, choice)  # refuses what names no template, or one for a server that renders its own
        kwargs.setdefault("template", choice)
    if is_local(model):
        from .local import LocalHF

        folder, template = local_folder(model)
        kwargs.setdefault("name", spec)  # what run records compare: the folder and the template, not a folder's name
        return LocalHF(folder, **({"chat_template": template} if template else {}), **kwargs)
    if is_chat_endpoint(model):
        from .openai_compat import OpenAICompatible

        return OpenAICompatible(model.removeprefix(CHAT_ENDPOINT), **kwargs)
    if is_token_endpoint(model):
        from .vllm_tokens import VLLMTokens

        backend = VLLMTokens(model.removeprefix(TOKEN_ENDPOINT), **kwargs)
        backend.name = spec
        return backend
    raise LLMError(_unknown(spec))


def _unknown(spec: str) -> str:
    return (
        f"unknown model '{spec}'; use {', '.join(EMBEDDED_MODELS)}, openai:<model>, hf:<local path> or "
        "vllm:<model> (a vLLM server's token-id completions)"
    )


def check_spec(spec: str, *, endpoint: bool = True) -> None:
    """Refuses, in one line and before anything loads, a spec no backend can play: an
    unknown kind, a local folder that is not there, an ``openai:`` model with no endpoint
    set, a chat template that names none (or one for a server that renders its own)."""
    model, choice = split_spec(spec)
    with_template(model, choice)
    if model in EMBEDDED_MODELS:
        return
    if is_token_endpoint(model):  # a default, local address; the conversation is rendered here
        from .vllm_tokens import tokenizer_folder

        tokenizer_folder(model.removeprefix(TOKEN_ENDPOINT))
        return
    if is_local(model):
        local_folder(model)  # refuses a folder that is not there
        return
    if is_chat_endpoint(model):
        if endpoint and not os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
            raise LLMError(f"{model} needs an endpoint: set OPENAI_BASE_URL (and OPENAI_API_KEY)")
        return
    raise LLMError(_unknown(spec))
