"""Shared-prefix attention is exact: the same numbers as plain attention over
prefix + own tokens, for one group of rows, several groups (mixed adapters) and
rows that hold all their tokens themselves, in decode and in prefill."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from trace_gym.llm.local import shared_prefix  # noqa: E402

HEADS, KV_HEADS, DIM = 6, 2, 8


def reference(query, keys, values, visible):
    """Plain attention, one row at a time: query [H, Q, D], keys [KVH, T, D], visible [Q, T]."""
    groups = HEADS // KV_HEADS
    k = keys.repeat_interleave(groups, dim=0)
    v = values.repeat_interleave(groups, dim=0)
    scores = query @ k.transpose(1, 2) * DIM**-0.5
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def case(q_len: int, held: list[int], prefixes: list[int | None]):
    """Rows with ``held[i]`` own tokens (left-padded to the longest) and prefix
    group ``prefixes[i]`` (an index into shared prefixes of lengths 5 and 9, or None)."""
    torch.manual_seed(0)
    rows, slots = len(held), max(held)
    shared = [(torch.randn(1, KV_HEADS, n, DIM), torch.randn(1, KV_HEADS, n, DIM)) for n in (5, 9)]
    query = torch.randn(rows, HEADS, q_len, DIM)
    key, value = torch.randn(rows, KV_HEADS, slots, DIM), torch.randn(rows, KV_HEADS, slots, DIM)
    first = [slots - n for n in held]
    mask = shared_prefix.own_mask(rows, q_len, slots, first, [slots - q_len] * rows, "cpu")
    expected = []
    for i in range(rows):
        own_k, own_v, own_visible = key[i, :, first[i] :], value[i, :, first[i] :], mask[i, 0, :, first[i] :]
        if prefixes[i] is not None:
            pk, pv = shared[prefixes[i]]
            own_k, own_v = torch.cat([pk[0], own_k], dim=1), torch.cat([pv[0], own_v], dim=1)
            own_visible = torch.cat([torch.ones(q_len, pk.shape[2], dtype=torch.bool), own_visible], dim=1)
        expected.append(reference(query[i], own_k, own_v, own_visible))
    groups: dict = {}
    for i, p in enumerate(prefixes):
        groups.setdefault(p, []).append(i)
    layers = {p: [shared[p]] if p is not None else None for p in groups}
    spec = [(layers[p], None if len(groups) == 1 else rows_of) for p, rows_of in groups.items()]
    return (query, key, value, mask, spec), torch.stack(expected)  # expected: [B, H, Q, D]


def attend(query, key, value, mask, spec, grad=False):
    """As ``LocalHF`` calls it: gradients off (``grad=True``: on)."""
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=HEADS // KV_HEADS)
    with torch.set_grad_enabled(grad):
        out, _ = shared_prefix.shared_prefix_attention(
            module, query, key, value, mask, scaling=DIM**-0.5, shared_prefix=spec
        )
    return out.transpose(1, 2)


@pytest.fixture(params=["cpu-kernel", "matmul"])
def path(request, monkeypatch):
    """Both ways ``_attend`` computes: PyTorch's fused CPU attention joined by
    log-sum-exps (CPU inference) and plain matrix products (other devices, gradients)."""
    monkeypatch.setattr(shared_prefix, "CPU_KERNEL", request.param == "cpu-kernel")
    return request.param


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("prefixes", [[0, 0, 0], [0, 1, None], [None, None, 1]])
def test_shared_prefix_attention_equals_attention_over_prefix_and_own_tokens(q_len, prefixes, path):
    inputs, expected = case(q_len, [4, 7, 5], prefixes)
    torch.testing.assert_close(attend(*inputs), expected, rtol=1e-5, atol=1e-5)


def test_the_cpu_kernel_is_taken_for_cpu_inference_only(monkeypatch):
    calls = []
    for name in ("_attend_cpu", "_attend_matmul"):
        original = getattr(shared_prefix, name)
        monkeypatch.setattr(shared_prefix, name, lambda *a, _n=name, _f=original: calls.append(_n) or _f(*a))
    (query, key, value, mask, spec), expected = case(1, [4, 7], [0, 0])
    attend(query, key, value, mask, spec)
    attend(query, key, value, mask, spec, grad=True)  # gradients on: the differentiable path
    attend(query, key.clone().requires_grad_(), value, mask, spec, grad=True)  # (a LoRA on k_proj only, say)
    attend(query.double(), key.double(), value.double(), mask, [([tuple(t.double() for t in spec[0][0][0])], None)])
    assert calls == ["_attend_cpu", "_attend_matmul", "_attend_matmul", "_attend_matmul"]


def test_an_empty_prefix_leaves_the_rows_own_attention(path):
    (query, key, value, mask, spec), _ = case(1, [4, 7], [None, None])
    empty = [([(torch.zeros(1, KV_HEADS, 0, DIM), torch.zeros(1, KV_HEADS, 0, DIM))], None)]
    torch.testing.assert_close(attend(query, key, value, mask, empty), attend(query, key, value, mask, spec))


@pytest.mark.parametrize("prefixes", [[0, 0], [None, None], [0, None]])
def test_a_query_that_sees_none_of_its_own_tokens_attends_to_its_prefix_alone(prefixes, path):
    """(The fused CPU kernel gives such a query a log-sum-exp of 0, as if it had seen
    tokens of total weight 1; taken as it is, the prefix's share would be halved.)"""
    (query, key, value, mask, spec), expected = case(2, [4, 7], prefixes)
    mask[0, 0, 1] = False  # row 0's second query sees nothing of its own
    got = attend(query, key, value, mask, spec)
    if prefixes[0] is None:
        torch.testing.assert_close(got[0, :, 1], torch.zeros_like(got[0, :, 1]))
    else:
        ((prefix_keys, prefix_values),) = spec[0][0]
        alone = reference(query[0, :, 1:2], prefix_keys[0], prefix_values[0], torch.ones(1, 5, dtype=torch.bool))
        torch.testing.assert_close(got[0, :, 1:2], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0, :, 0], expected[0, :, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-5)


def test_the_comparison_catches_a_padded_slot_made_visible(path):
    (query, key, value, mask, spec), expected = case(1, [2, 7], [0, 0])
    leaky = shared_prefix.own_mask(2, 1, 7, [0, 0], [6, 6], "cpu")  # the first row's left padding made visible
    assert not torch.allclose(attend(query, key, value, leaky, spec)[0], expected[0], atol=1e-3)
    torch.testing.assert_close(attend(query, key, value, mask, spec), expected, rtol=1e-5, atol=1e-5)


def test_own_mask_sees_the_rows_own_tokens_and_nothing_after_the_query():
    mask = shared_prefix.own_mask(2, 2, 5, [3, 0], [3, 3], "cpu")[:, 0]
    assert mask[0].tolist() == [[False, False, False, True, False], [False, False, False, True, True]]
    assert mask[1].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_only_llama_family_configs_take_the_shared_prefix_path():
    llama = SimpleNamespace(
        model_type="llama", _attn_implementation="sdpa", num_attention_heads=9, num_key_value_heads=3
    )
    assert shared_prefix.supported(llama)
    assert not shared_prefix.supported(SimpleNamespace(**{**vars(llama), "model_type": "gpt2"}))
    assert not shared_prefix.supported(SimpleNamespace(**{**vars(llama), "sliding_window": 4096}))
    assert shared_prefix.supported(
        SimpleNamespace(**{**vars(llama), "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False})
    )
    assert not shared_prefix.supported(
        SimpleNamespace(**{**vars(llama), "layer_types": ["full_attention", "sliding_attention"]})
    )
    assert not shared_prefix.supported(SimpleNamespace(**{**vars(llama), "_attn_implementation": "flash_attention_2"}))
    assert not shared_prefix.supported(SimpleNamespace(**{**vars(llama), "_attn_implementation": "eager"}))
    assert not shared_prefix.supported(None)


def tiny_model(family: str):
    """A tiny random model of ``family`` with the embedded model's tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trace_gym.llm.embedded import ensure_embedded_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    config = AutoConfig.for_model(
        family,
        vocab_size=len(tokenizer),
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    return model, tokenizer


def chats_of(questions: list[str]) -> list[list[dict]]:
    system = "You are an agent. " + " ".join(f"Rule {i}: check order #{i}." for i in range(30))
    return [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in questions]


def next_turns(backend, first, replies, *, max_new_tokens: int, seed: int):
    """Each episode's second turn: its prompt, the reply, and a user's "Go on."."""
    from trace_gym.llm import GenerationRequest

    return [
        GenerationRequest(
            r.messages,
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            seed=seed,
            session=r.session,
            prefix_len=r.prefix_len,
            prompt_ids=[
                *c.tokens.prompt_ids,
                *c.tokens.completion_ids,
                *backend.encode_continuation(
                    {"role": "assistant", "content": c.text},
                    [{"role": "user", "content": "Go on."}],
                    c.tokens.completion_ids,
                ),
            ],
        )
        for r, c in zip(first, replies)
    ]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_batch_decodes_the_same_tokens_with_and_without_shared_prefix_attention(family, monkeypatch):
    """Tiny random models of both families behind LocalHF: four episodes of one
    system prompt (two of them open on the same prompt), two turns each; the
    same ids and logprobs either way. With it, each turn's prompts are prefilled
    in one forward, the repeated prompt once."""
    from trace_gym.llm import GenerationRequest
    from trace_gym.llm.local import prefill
    from trace_gym.llm.local import LocalHF

    model, tokenizer = tiny_model(family)
    chats = chats_of(["Hi.", "Where is order 7?", "Cancel #W1 now.", "Hi."])
    runs, prefills, tokens, slots = {}, {}, prefill.PREFILL_TOKENS, prefill.PREFILL_SLOTS
    for mode in ("off", "on", "on, 40 key slots per forward", "on, 1 new token per forward"):
        on = mode != "off"
        backend = LocalHF.from_model(model, tokenizer, shared_prefix_attention=on)
        assert backend.shared_prefix is on
        forward = backend._forward
        prefills[mode] = []
        monkeypatch.setattr(prefill, "PREFILL_SLOTS", 40 if "40 key" in mode else slots)
        monkeypatch.setattr(prefill, "PREFILL_TOKENS", 1 if "1 new" in mode else tokens)

        def spy(adapters, forward=forward, seen=prefills[mode], **inputs):
            if inputs["input_ids"].shape[1] > 1:
                seen.append(inputs["input_ids"].shape[0])  # rows of a prefill forward
            return forward(adapters, **inputs)

        backend._forward = spy
        first = [
            GenerationRequest(c, max_new_tokens=6, temperature=1.0, seed=i, session=f"{i}") for i, c in enumerate(chats)
        ]
        turn1 = backend.complete(first)
        prompts = [c.tokens.prompt_ids for c in turn1]
        prefix = first[0].prefix_len  # computed once; then three distinct prompts, the repeated one counted as cached
        assert backend.last_stats["prefill_tokens"] == prefix + sum(
            len(p) - prefix for p in map(list, {tuple(p) for p in prompts})
        )
        assert backend.last_stats["prefill_tokens"] + backend.last_stats["cached_tokens"] == sum(map(len, prompts))
        second = next_turns(backend, first, turn1, max_new_tokens=6, seed=9)
        turn2 = backend.complete(second)
        assert backend.last_stats["prefill_tokens"] < 20 * len(second)  # turn 2 extended each episode's cache
        runs[mode] = [(c.tokens.completion_ids, c.tokens.logprobs) for c in [*turn1, *turn2]]
    assert prefills["on"] == [1, 3, 4]  # the shared prefix; turn 1's three distinct prompts; turn 2's four rows
    assert prefills["off"] == [1] * 8  # one row at a time, the repeated prompt once
    split = prefills["on, 40 key slots per forward"]
    assert split[0] == 1 and max(split) < 4 and sum(split[1:]) == 7  # (a few rows fill 40 slots)
    assert prefills["on, 1 new token per forward"] == [1] * 8  # each row alone, though larger than the bound
    for mode in ("on", "on, 40 key slots per forward", "on, 1 new token per forward"):
        assert [ids for ids, _ in runs[mode]] == [ids for ids, _ in runs["off"]], mode
        for (_, got), (_, off) in zip(runs[mode], runs["off"]):
            assert max(abs(a - b) for a, b in zip(got, off)) < 1e-4, mode


@pytest.mark.parametrize("kv_cache", [True, False])  # (without a cache no row has a start to tell adapters apart)
def test_one_prompt_under_different_adapters_is_prefilled_once_per_adapter(kv_cache):
    """The same prompt for adapters x, y, the base model, x, y: the rows of one
    adapter share a prefill, the adapters never do (each row gives what it gives
    asked alone, on a fresh backend)."""
    from peft import LoraConfig, get_peft_model

    from trace_gym.llm import GenerationRequest
    from trace_gym.llm.local import LocalHF

    model, tokenizer = tiny_model("llama")
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    torch.manual_seed(1)
    model = get_peft_model(model, lora, adapter_name="x")
    model.add_adapter("y", lora)
    model.eval()
    chat = chats_of(["Where is order 7?"])[0]
    requests = [
        GenerationRequest(chat, max_new_tokens=4, temperature=1.0, seed=i, adapter=a)
        for i, a in enumerate(["x", "y", None, "x", "y"])
    ]
    backend = LocalHF.from_model(model, tokenizer, kv_cache=kv_cache)
    forward, prefills = backend._forward, []

    def spy(adapters, **inputs):
        if inputs["input_ids"].shape[1] > 1:
            prefills.append(sorted(map(str, adapters)))
        return forward(adapters, **inputs)

    backend._forward = spy
    together = backend.complete(requests)
    if kv_cache:  # three prefixes, then one row per adapter
        assert prefills == [["x"], ["y"], ["None"], ["None", "x", "y"]]
    else:  # one row per adapter, each whole
        assert sorted(prefills) == [["None"], ["x"], ["y"]]
    alone = [LocalHF.from_model(model, tokenizer, shared_prefix_attention=False).complete([r])[0] for r in requests]
    for got, want in zip(together, alone):
        assert got.tokens.completion_ids == want.tokens.completion_ids
        assert max(abs(a - b) for a, b in zip(got.tokens.logprobs, want.tokens.logprobs)) < 1e-4
    assert together[0].tokens.logprobs != together[1].tokens.logprobs  # (the adapters do differ)


def test_bf16_scores_are_summed_in_fp32(path):
    """bf16 inputs: the output is the fp64 reference of those inputs, rounded to bf16
    once (scores rounded to bf16 before the softmax were 4x further off)."""
    (query, key, value, mask, spec), _ = case(1, [300, 260], [1, 1])
    torch.manual_seed(1)
    prefix = (torch.randn(1, KV_HEADS, 2000, DIM) * 3, torch.randn(1, KV_HEADS, 2000, DIM))
    query = query * 3
    low = [t.bfloat16() for t in (query, key, value)]
    got = attend(*low, mask, [([tuple(t.bfloat16() for t in prefix)], None)]).double()
    exact = attend(*(t.double() for t in low), mask, [([tuple(t.bfloat16().double() for t in prefix)], None)])
    assert got.dtype == torch.float64 and (got - exact).abs().max() < 2e-2


def test_scores_stay_in_fp32_under_a_bf16_autocast(path):
    """Accelerate runs a bf16 model's forward under autocast, rollouts included: the
    matrix-product path (a GPU's) must not have its fp32 scores cast back to bf16
    (that was 10x further off than SDPA on a GPU)."""
    (query, key, value, mask, spec), _ = case(1, [300, 260], [1, 1])
    torch.manual_seed(1)
    prefix = [(torch.randn(1, KV_HEADS, 2000, DIM) * 3, torch.randn(1, KV_HEADS, 2000, DIM))]
    query = query * 3
    plain = attend(query, key, value, mask, [(prefix, None)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = attend(query, key, value, mask, [(prefix, None)])
    assert under.dtype == torch.float32 and (under - plain).abs().max() < 1e-5


def test_a_plain_forward_during_the_switch_keeps_its_padding_mask_and_overlapping_switches_restore():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama",
        vocab_size=64,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=6,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 64, (2, 7))
    padding = torch.ones(2, 7, dtype=torch.long)
    padding[0, :3] = 0
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=padding).logits
        with shared_prefix.use_shared_prefix(model.config):
            with shared_prefix.use_shared_prefix(model.config):  # another backend over the same model
                assert model.config._attn_implementation == shared_prefix.NAME
            assert model.config._attn_implementation == shared_prefix.NAME  # still inside the first
            during = model(input_ids=ids, attention_mask=padding).logits
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(during[:, 3:], plain[:, 3:], rtol=1e-5, atol=1e-5)


def test_the_kernel_mask_is_built_once_per_forward_and_only_for_its_own_mask(monkeypatch):
    """Every layer of a forward gets the same mask; its kernel form is built in the
    first and reused by the rest, inside the switch only, and never for another mask
    of the same shape (which would hand one step's visibility to the next)."""
    builds = []
    grouped = shared_prefix._grouped_visible
    monkeypatch.setattr(shared_prefix, "_grouped_visible", lambda *a: builds.append(1) or grouped(*a))
    (query, key, value, mask, spec), expected = case(1, [4, 7, 5], [0, 0, 1])
    other = shared_prefix.own_mask(3, 1, 7, [5, 0, 1], [6, 6, 6], "cpu")  # the next step's: other rows visible
    assert other.shape == mask.shape and not torch.equal(other, mask)
    fresh = attend(query, key, value, other, spec)  # (outside the switch: built afresh)
    assert not torch.allclose(fresh, expected, atol=1e-3)
    builds.clear()
    with shared_prefix.use_shared_prefix(SimpleNamespace(_attn_implementation="sdpa")):
        for _ in range(3):  # three layers of one forward
            torch.testing.assert_close(attend(query, key, value, mask, spec), expected, rtol=1e-5, atol=1e-5)
        assert len(builds) == 1
        torch.testing.assert_close(attend(query, key, value, other, spec), fresh)  # the next forward's mask
        assert len(builds) == 2
    assert shared_prefix._kernel_masks.last is None  # dropped with the block
    attend(query, key, value, mask, spec)
    attend(query, key, value, mask, spec)
    assert len(builds) == 4 and shared_prefix._kernel_masks.last is None  # outside the switch: built every time


def test_a_decode_step_builds_its_kernel_mask_once_for_all_layers(monkeypatch):
    """Through the model's own layers (transformers hands each the caller's mask)."""
    from trace_gym.llm import GenerationRequest
    from trace_gym.llm.local import LocalHF

    model, tokenizer = tiny_model("llama")
    assert model.config.num_hidden_layers == 2
    backend = LocalHF.from_model(model, tokenizer)
    builds, forwards = [], []
    grouped = shared_prefix._grouped_visible
    monkeypatch.setattr(shared_prefix, "_grouped_visible", lambda *a: builds.append(1) or grouped(*a))
    forward = backend._forward
    backend._forward = lambda adapters, **inputs: (
        forwards.append("shared_prefix" in inputs) or forward(adapters, **inputs)
    )
    chats = chats_of(["Hi.", "Where is order 7?", "Cancel #W1 now."])
    backend.stop_ids = set()
    backend.complete([GenerationRequest(c, max_new_tokens=5) for c in chats])
    in_place = sum(forwards)
    assert in_place >= 4 and len(builds) == in_place  # (the prompts' prefill forward and four decode steps)


@pytest.mark.parametrize("shared", [True, False])
def test_rows_that_stop_leave_the_decode_batch_and_nothing_they_or_the_rest_sample_changes(shared, monkeypatch):
    """Six episodes with budgets 1 to 12 tokens, sampled, two turns: dropping the rows
    that have stopped from the batch (each time they are a quarter of it, or never)
    gives the same ids and logprobs, and the next turn, which extends each episode's
    cache by the tokens it fed, the same too (a row's fed tokens read from the wrong
    place in the shrunken cache would change it)."""
    from trace_gym.llm import GenerationRequest
    from trace_gym.llm.local import LocalHF
    from trace_gym.llm.local import model as local_model

    model, tokenizer = tiny_model("llama")
    chats = chats_of(["Hi.", "Where is order 7?", "Cancel #W1 now.", "Refund it.", "Hello?", "Bye."])
    budgets = [12, 1, 5, 3, 9, 12]
    runs, batches = {}, {}
    for drop in (0.25, 2.0):  # (2.0: never)
        monkeypatch.setattr(local_model, "DROP_FINISHED", drop)
        backend = LocalHF.from_model(model, tokenizer, shared_prefix_attention=shared)
        backend.stop_ids = set()
        forward = backend._forward
        batches[drop] = []

        def spy(adapters, forward=forward, seen=batches[drop], **inputs):
            if inputs["input_ids"].shape[1] == 1:
                seen.append(inputs["input_ids"].shape[0])  # rows of a decode step
            return forward(adapters, **inputs)

        backend._forward = spy
        first = [
            GenerationRequest(c, max_new_tokens=n, temperature=1.0, seed=i, session=f"{i}")
            for i, (c, n) in enumerate(zip(chats, budgets))
        ]
        turn1 = backend.complete(first)
        second = next_turns(backend, first, turn1, max_new_tokens=4, seed=7)
        turn2 = backend.complete(second)
        assert backend.last_stats["cached_tokens"] > 0 and backend.last_stats["prefill_tokens"] < 20 * len(second)
        runs[drop] = [(c.tokens.completion_ids, c.tokens.logprobs) for c in [*turn1, *turn2]]
    assert [len(ids) for ids, _ in runs[0.25][:6]] == budgets
    assert batches[2.0][:11] == [6] * 11  # every row in every step of turn 1
    # stopped rows leave once they are a quarter of the batch: 2 of 6 (budgets 1 and 3), 1 of 4, 1 of 3
    assert batches[0.25][:11] == [6, 6, 4, 4, 3, 3, 3, 3, 2, 2, 2]
    assert [ids for ids, _ in runs[0.25]] == [ids for ids, _ in runs[2.0]]
    for (_, got), (_, kept) in zip(runs[0.25], runs[2.0]):
        assert max(abs(a - b) for a, b in zip(got, kept)) < 1e-4


def greedy_episodes(backend, chats, *, adapter=None, tag="", budget=8):
    from trace_gym.llm import GenerationRequest

    requests = [
        GenerationRequest(c, max_new_tokens=budget, temperature=0.0, adapter=adapter, session=f"{tag}{i}")
        for i, c in enumerate(chats)
    ]
    return requests, backend.complete(requests)


@pytest.mark.parametrize("shared", [True, False])
def test_a_greedy_reply_from_a_draft_is_the_reply_decoded_without_one(shared):
    """Base plays four greedy episodes; then base again (its drafts whole), an
    adapter (its own choices), and base against a draft altered at its fourth
    token (kept up to there, then decoded on), each with a sampled next turn that
    reads the episode's cache. Every token, logprob and cached prefix equals the
    same requests played with no drafts at all."""
    from peft import LoraConfig, get_peft_model

    from trace_gym.llm import GenerationRequest
    from trace_gym.llm.local import LocalHF

    model, tokenizer = tiny_model("llama")
    torch.manual_seed(1)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(model, lora, adapter_name="x")
    model.eval()
    chats = chats_of(["Hi.", "Where is order 7?", "Cancel #W1 now.", "Refund it."])
    runs, stats, decode_rows = {}, {}, {}
    for drafts in (True, False):
        backend = LocalHF.from_model(model, tokenizer, shared_prefix_attention=shared, greedy_drafts=drafts)
        backend.stop_ids = set()  # every reply its whole budget
        forward, decode_rows[drafts] = backend._forward, []

        def spy(adapters, forward=forward, seen=decode_rows[drafts], **inputs):
            if inputs["input_ids"].shape[1] == 1:
                seen.append(inputs["input_ids"].shape[0])
            return forward(adapters, **inputs)

        backend._forward = spy
        _, played = greedy_episodes(backend, chats, tag="a")
        assert not drafts or backend.last_stats["draft_tokens"] == 0  # nothing recorded yet
        decode_rows[drafts].clear()
        _, replayed = greedy_episodes(backend, chats, tag="b")
        if drafts:
            assert backend.last_stats["draft_accepted"] == 4 * 8 and decode_rows[drafts] == []  # no decode step
        tampered = list(played[2].tokens.completion_ids)
        tampered[3] = (tampered[3] + 1) % len(tokenizer)
        if drafts:  # and a shorter draft beside the others: rows keep different numbers of logits
            backend.drafts.record(played[2].tokens.prompt_ids, tampered)
            backend.drafts.record(played[3].tokens.prompt_ids, played[3].tokens.completion_ids[:5])
        mixed_requests = [
            GenerationRequest(c, max_new_tokens=8, temperature=0.0, adapter=a, session=f"c{i}")
            for i, (c, a) in enumerate(zip(chats, ["x", "x", None, None]))
        ]
        decode_rows[drafts].clear()
        mixed = backend.complete(mixed_requests)
        if drafts:  # the altered draft kept to its 4th token, the short one whole, the adapter's as it chose
            assert backend.last_stats["draft_accepted"] >= 3 + 5 and decode_rows[drafts]
        turn2 = backend.complete(next_turns(backend, mixed_requests, mixed, max_new_tokens=4, seed=5))
        stats[drafts] = backend.last_stats["cached_tokens"]
        runs[drafts] = [(c.tokens.completion_ids, c.tokens.logprobs) for c in [*played, *replayed, *mixed, *turn2]]
    assert [ids for ids, _ in runs[True]] == [ids for ids, _ in runs[False]]
    for (_, got), (_, plain) in zip(runs[True], runs[False]):
        assert max(abs(a - b) for a, b in zip(got, plain)) < 1e-4
    assert stats[True] == stats[False]  # each next turn started from its episode's cache in both


def test_a_draft_is_kept_up_to_the_rows_first_own_choice_and_sampled_rows_take_none():
    from trace_gym.llm import GenerationRequest, LLMError
    from trace_gym.llm.local import LocalHF
    from trace_gym.llm.local.drafts import DraftBook, verify

    logits = torch.full((4, 10), -5.0)
    for position, token in enumerate([3, 1, 7, 2]):
        logits[position, token] = 5.0
    assert verify(torch, logits, [3, 1, 7, 2], "m")[0] == [3, 1, 7, 2]
    kept, logprobs = verify(torch, logits, [3, 1, 4, 2], "m")
    assert kept == [3, 1, 7] and len(logprobs) == 3 and all(-0.01 < lp < 0 for lp in logprobs)
    assert verify(torch, logits, [9, 1], "m")[0] == [3]
    logits[2, 4] = float("nan")  # a draft's later position gone bad is refused, as a sampled step is
    with pytest.raises(LLMError, match="non-finite logits"):
        verify(torch, logits, [3, 1, 7, 2], "m")

    book = DraftBook(max_entries=2)
    book.record([1, 2], [5])  # one token: nothing to verify
    assert book.draft([1, 2], 8) == []
    book.record([1, 2], [5, 6, 7])
    assert book.draft([1, 2], 2) == [5, 6] and book.draft([1, 2], 1) == [] and book.draft([1, 3], 8) == []
    book.record([2], [8, 9])
    assert book.draft([1, 2], 8) == [5, 6, 7]  # now [2] is the least recently used
    book.record([3], [8, 9])
    assert book.draft([2], 8) == [] and book.draft([1, 2], 8) == [5, 6, 7]

    model, tokenizer = tiny_model("llama")
    backend = LocalHF.from_model(model, tokenizer)
    chats = chats_of(["Hi.", "Bye."])
    greedy_episodes(backend, chats, tag="g")
    backend.complete([GenerationRequest(c, max_new_tokens=8, temperature=1.0, seed=0) for c in chats])
    assert backend.last_stats["draft_tokens"] == 0
    greedy_episodes(backend, chats, tag="h")
    assert backend.last_stats["draft_tokens"] > 0
    twice = [GenerationRequest(chats[0], max_new_tokens=8, temperature=0.0)] * 2  # one prefill, drafted
    backend.complete(twice)
    stats = backend.last_stats
    assert stats["draft_tokens"] == stats["draft_accepted"] == 2 * 8
    ids, prefix = backend.encode_conversation(chats[0], None)
    assert stats["prefill_tokens"] == len(ids) - prefix  # the prompt's own tokens once: a draft's counted apart
    assert stats["cached_tokens"] == len(ids) + prefix


def test_non_finite_logits_are_an_error_not_a_sample():
    """A model whose logits overflow (here: a NaN in its output head) cannot be
    sampled from; the backend says so instead of recording a NaN logprob."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trace_gym.llm import GenerationRequest, LLMError
    from trace_gym.llm.embedded import ensure_embedded_model
    from trace_gym.llm.local import LocalHF

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    backend = LocalHF.from_model(model, tokenizer)
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi."}]
    assert backend.complete([GenerationRequest(chat, max_new_tokens=2, temperature=1.0, seed=0)])[
        0
    ].tokens.completion_ids
    with torch.no_grad():
        model.lm_head.weight[7, 0] = float("nan")
    for temperature in (1.0, 0.0):  # sampled or greedy
        with pytest.raises(LLMError, match="non-finite logits"):
            backend.complete([GenerationRequest(chat, max_new_tokens=2, temperature=temperature, seed=0)])


def test_transformers_own_adapters_run_the_active_one_and_refuse_others():
    """A model given adapters by transformers' own peft integration (not a
    PeftModel) ignores per-row adapter names: the active adapter runs, and a
    request for the base model is a clear error instead of the adapter's output."""
    from peft import LoraConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trace_gym.llm import GenerationRequest, LLMError
    from trace_gym.llm.embedded import ensure_embedded_model
    from trace_gym.llm.local import LocalHF

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.add_adapter(LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False), adapter_name="a")
    backend = LocalHF.from_model(model, tokenizer)
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi."}]
    assert backend.complete([GenerationRequest(chat, max_new_tokens=2, adapter="a")])[0].tokens.completion_ids
    with pytest.raises(LLMError, match="transformers' own peft integration"):
        backend.complete([GenerationRequest(chat, max_new_tokens=2)])
