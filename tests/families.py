"""Tokenizers and tiny random models of the chat-template families trace-gym plays:
the embedded model's, and Llama 3.1's, Qwen2.5's and Qwen3's stock templates (TRL's
copies) over the embedded tokenizer with that family's control tokens added, as the
real tokenizers have them. No weights are downloaded: the models are random."""

from __future__ import annotations

from pathlib import Path

import trl

TEMPLATES = Path(trl.__file__).parent / "chat_templates"
# template -> the control tokens its tokenizer has (added, so each encodes as one id)
FAMILIES = {
    "embedded": None,
    "llama3_1": [
        "<|begin_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ],
    "qwen2_5": ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"],
    "qwen3": [
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
    ],
}


def family_tokenizer(family: str):
    """The embedded tokenizer with ``family``'s control tokens and stock template."""
    from transformers import AutoTokenizer

    from trace_gym.llm.embedded import ensure_embedded_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    if FAMILIES[family]:  # as the real tokenizers have them: turn markers special, Qwen's tool and think tags not
        markers = [t for t in FAMILIES[family] if t.startswith("<|")]
        tokenizer.add_special_tokens({"additional_special_tokens": markers})
        tokenizer.add_tokens([t for t in FAMILIES[family] if t not in markers], special_tokens=False)
        tokenizer.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
    return tokenizer


def tiny_model(tokenizer, arch: str = "llama", seed: int = 0, layers: int = 1, init: float = 0.02):
    """A random ``arch`` model small enough to play τ² episodes on a CPU in seconds
    (``init``: its weights' standard deviation; larger makes its outputs depend more on
    position and context)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
        initializer_range=init,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def tiny_model_folder(folder: Path, family: str = "embedded", **model) -> Path:
    """A model folder as a user has it (``model=f"hf:{folder}"``): ``tiny_model``'s
    weights (``model``: its arguments) beside ``family``'s tokenizer and template."""
    tokenizer = family_tokenizer(family)
    tiny_model(tokenizer, **model).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def backend_for(family: str, template: str = "auto", **model):
    """``LocalHF`` over a tiny random model (``model``: ``tiny_model``'s arguments) with
    ``family``'s tokenizer and template."""
    from trace_gym.llm.local import LocalHF

    tokenizer = family_tokenizer(family)
    return LocalHF.from_model(tiny_model(tokenizer, **model), tokenizer, template=template)
