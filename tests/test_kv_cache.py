"""The bound on a local model's cached keys and values: set by the user, or sized
from where the model runs; a store that honours it."""

import pytest

from trace_gym.llm import GenerationRequest, LLMError, make_backend
from trace_gym.llm.local.kv_cache import CACHE_ENV, DEFAULT_CACHE_BYTES, cache_budget

GIB = 2**30


def test_the_cache_is_sized_from_the_device_unless_the_user_sets_it(monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert cache_budget("cpu") == DEFAULT_CACHE_BYTES == 4 * GIB
    assert cache_budget("cuda:0", free_bytes=60 * GIB) == 30 * GIB  # half of what the GPU has free
    assert cache_budget("cuda", free_bytes=2 * GIB) == DEFAULT_CACHE_BYTES  # never below the CPU's figure
    monkeypatch.setenv(CACHE_ENV, "12.5")
    assert cache_budget("cpu") == cache_budget("cuda", free_bytes=60 * GIB) == int(12.5 * GIB)


@pytest.mark.parametrize("given", ["0", "-2", "lots", "nan", "inf"])
def test_a_cache_size_that_is_not_a_positive_number_is_refused(monkeypatch, given):
    monkeypatch.setenv(CACHE_ENV, given)
    with pytest.raises(LLMError, match=f"TRACE_GYM_KV_CACHE_GIB must be a positive number of GiB, got '{given}'"):
        cache_budget("cpu")


def test_a_local_model_keeps_its_cache_within_the_bound_the_user_set(monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(4 * 2**20 / GIB))  # 4 MiB: two short turns' keys and values, not three
    backend = make_backend("smollm2-135m-instruct")
    assert backend.cache_stats()["max_bytes"] == 4 * 2**20
    for word in ("apples", "pears", "plums"):
        messages = [{"role": "user", "content": f"Name three {word}."}]
        backend.complete([GenerationRequest(messages=messages, max_new_tokens=2, session=word)])  # an episode's turn
    stats = backend.cache_stats()
    assert stats["entries"] == 2 and stats["bytes"] <= stats["max_bytes"], stats
    assert ("session", "apples") not in backend.store.entries  # the least recently used went out
