"""The in-process model: ``LocalHF`` (``model.py``) is the facade, built from one mixin or
helper per concern:

- ``kv_cache.py``: the LRU store of each conversation's keys and values, and its memory budget;
- ``prefill.py``: prefilling a batch from that store (``CachedPrefill``);
- ``shared_prefix.py``: rows that extend one cached prefix attend to it without copying it;
- ``lora.py``: adapters loaded by name and applied per row (``LoraAdapters``);
- ``sampling.py``: each row's own temperature, top-p and seed (``RowSampler``).

Rendering a conversation to token ids (``TokenTemplate``) lives one level up, in
``trace_gym.llm.token_template``: the vLLM client renders the same way.
"""

from .model import LocalHF

__all__ = ["LocalHF"]
