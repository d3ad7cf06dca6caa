"""A local Hugging Face model through transformers, with peft LoRA adapters.

Batched generation across conversations (left padding), a seed for
reproducibility, the tokenizer's chat template with the tools, and adapters
loaded and switched by name. Loads only from local files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Completion, LLMError


class LocalHF:
    def __init__(self, path: str, *, name: str | None = None, adapters: dict[str, str] | None = None,
                 device: str | None = None, max_batch: int = 8):
        if not Path(path).exists():
            raise LLMError(f"no model at {path}: trace-gym loads local models only and never downloads weights")
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise LLMError(f"local models need torch and transformers ({exc}); run make setup") from None
        hf_logging.set_verbosity_error()
        self.torch = torch
        self.name = name or Path(path).name
        self.path = path
        self.max_batch = max_batch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).to(self.device)
        self.model.eval()
        self.adapters: dict[str, str] = {}
        for adapter_name, adapter_path in (adapters or {}).items():
            self.load_adapter(adapter_name, adapter_path)

    def load_adapter(self, name: str, path: str) -> None:
        """Load a peft LoRA adapter under ``name``; ``generate(adapter=name)`` uses it."""
        from peft import PeftModel

        if not Path(path).exists():
            raise LLMError(f"no adapter at {path}")
        if not self.adapters:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
        else:
            self.model.load_adapter(path, adapter_name=name)
        self.adapters[name] = path

    def generate(self, conversations: list[list[dict[str, Any]]], *, tools: list[dict[str, Any]] | None = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, seed: int | None = None,
                 adapter: str | None = None) -> list[Completion]:
        out: list[Completion] = []
        for start in range(0, len(conversations), self.max_batch):
            out += self._generate_batch(conversations[start:start + self.max_batch], tools, max_new_tokens, temperature, seed, adapter)
        return out

    def _generate_batch(self, conversations, tools, max_new_tokens, temperature, seed, adapter) -> list[Completion]:
        torch = self.torch
        prompts = [
            self.tokenizer.apply_chat_template(c, tools=tools or None, add_generation_prompt=True, tokenize=False)
            for c in conversations
        ]
        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        if seed is not None:
            torch.manual_seed(seed)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0} if temperature > 0 else {"do_sample": False}
        with torch.no_grad(), self._adapter(adapter):
            generated = self.model.generate(
                **encoded, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling
            )
        prompt_len = encoded["input_ids"].shape[1]
        completions = []
        for row, mask in zip(generated, encoded["attention_mask"]):
            new = row[prompt_len:]
            ended = (new == self.tokenizer.eos_token_id).nonzero()
            if len(ended):
                new = new[: int(ended[0])]
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            completions.append(Completion(
                text=text.strip(), prompt_tokens=int(mask.sum()), completion_tokens=int(len(new)),
                finish_reason="stop" if len(ended) else "length",
            ))
        return completions

    def _adapter(self, adapter: str | None):
        import contextlib

        if not self.adapters:
            if adapter:
                raise LLMError(f"adapter '{adapter}' is not loaded (no adapters are)")
            return contextlib.nullcontext()
        if adapter is None:
            return self.model.disable_adapter()
        if adapter not in self.adapters:
            raise LLMError(f"adapter '{adapter}' is not loaded; loaded: {', '.join(self.adapters)}")
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()
