"""peft LoRA adapters on a local model: load one by name, add several into one
(the summed baseline), save one as a folder peft and vLLM read. A mixin of
``LocalHF``: it holds the model, the loaded adapters and the KV store whose
entries of a changed adapter must go."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

from ..base import LLMError
from .kv_cache import KVStore


DEPRECATED_CHECKPOINTING_CALLS = (
    "is_gradient_checkpointing",
    "gradient_checkpointing_enable",
    "gradient_checkpointing_disable",
)


@contextlib.contextmanager
def without_checkpointing_deprecations() -> Iterator[None]:
    """peft (as it wraps a model in an adapter) and TRL 1.16 (as it trains) call
    ``model.is_gradient_checkpointing`` and ``gradient_checkpointing_enable``/``_disable``,
    which transformers 5.x deprecates with a FutureWarning at every run: nothing a user
    can act on, so they are not shown (every other warning still is, our own arguments'
    names included)."""
    with warnings.catch_warnings():
        for name in DEPRECATED_CHECKPOINTING_CALLS:
            warnings.filterwarnings("ignore", message=f"`{name}` is deprecated", category=FutureWarning)
        yield


def adds_nothing(folder: str | Path) -> bool:
    """Whether the peft LoRA in ``folder`` leaves the model as it is: every layer's
    update ``B @ A`` is exactly 0 because one of its factors is all zeros. peft starts
    B at 0, and an adapter whose every gradient was 0 (GRPO on constant rewards) is
    saved so; its outputs are the base model's bit for bit. Anything but plain
    ``lora_A``/``lora_B`` pairs (DoRA magnitudes, embeddings) answers False."""
    from safetensors import safe_open

    path = Path(folder) / "adapter_model.safetensors"
    if not path.exists():
        raise LLMError(f"no adapter weights at {path}")
    factors: dict[str, list[bool]] = {}
    with safe_open(str(path), framework="pt") as weights:
        for key in weights.keys():
            for part in (".lora_A.", ".lora_B."):
                if part in key:
                    zero = not bool(weights.get_tensor(key).any())
                    factors.setdefault(key.split(part)[0], []).append(zero)
                    break
            else:
                return False
    return bool(factors) and all(len(z) == 2 and any(z) for z in factors.values())


class LoraAdapters:
    """Adapters by name over ``self.model`` (made a peft model by the first one)."""

    model: Any
    name: str
    adapters: dict[str, str]  # name -> where it came from
    store: KVStore
    _lock: Any

    def load_adapter(self, name: str, path: str) -> None:
        """Load a peft LoRA adapter under ``name``; requests with ``adapter=name`` use it."""
        from peft import PeftModel

        if not Path(path).exists():
            raise LLMError(f"no adapter at {path}")
        with self._lock:
            if not hasattr(self.model, "peft_config"):
                with without_checkpointing_deprecations():
                    self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            else:
                self.model.load_adapter(path, adapter_name=name)
            self.model.eval()
            self.adapters[name] = path
            self._drop_adapter_cache(name)

    def add_summed_adapter(self, name: str, sources: list[str]) -> None:
        """A new adapter ``name`` whose weight update is the sum of the ``sources``' updates
        (peft ``add_weighted_adapter``, ``cat``: the LoRA factors are concatenated, so
        B A = sum of B_i A_i exactly, whatever the ranks): the "adapters' weights added"
        baseline that routing is compared with."""
        for source in sources:
            self._check_adapter(source)
        if len(sources) < 2:
            raise LLMError(f"summing adapters needs at least two, got {sources}")
        with self._lock:
            self.model.add_weighted_adapter(
                adapters=list(sources), weights=[1.0] * len(sources), adapter_name=name, combination_type="cat"
            )
            self.model.eval()
            self.adapters[name] = "sum of " + " + ".join(sources)
            self._drop_adapter_cache(name)

    def save_adapter(self, name: str, folder: str | Path) -> Path:
        """Write adapter ``name`` (a summed one too) as a PEFT folder that peft, vLLM
        (``--lora-modules name=folder``) and ``load_adapter`` read; returns the folder."""
        self._check_adapter(name)
        if name not in getattr(self.model, "peft_config", {}):
            raise LLMError(f"{self.name} holds no peft adapter named '{name}'")
        folder = Path(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))  # beside it: one rename away
        old = folder.with_name(f".{folder.name}-old")
        try:
            with self._lock:
                self.model.save_pretrained(str(tmp / "saved"), selected_adapters=[name])
            written = tmp / "saved" / name if (tmp / "saved" / name / "adapter_config.json").exists() else tmp / "saved"
            shutil.rmtree(old, ignore_errors=True)
            if folder.exists():
                folder.rename(old)  # the old folder stays whole until the new one is in place
            written.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return folder

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter is None:
            return
        if not self.adapters:
            raise LLMError(f"adapter '{adapter}' is not loaded (no adapters are)")
        if adapter not in self.adapters:
            raise LLMError(f"adapter '{adapter}' is not loaded; loaded: {', '.join(self.adapters)}")

    def _drop_adapter_cache(self, adapter: str | None) -> None:
        for key in [k for k, e in self.store.entries.items() if e.adapter == adapter]:
            self.store.drop(key)
