"""The update's shared-prefix forward (training/shared_update.py) against the rows
run whole, as TRL runs them: the same completion log-probabilities and the same
LoRA gradients, on tiny random models with left-padded prompts of two groups."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from trace_gym.training.shared_update import shared_prefix_len, shared_prefix_logps

TEMPERATURE = 0.7


def tiny_lora_model(family: str):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = {"logits_scaling": 4.0} if family == "granite" else {}  # (granite divides its logits by this)
    config = AutoConfig.for_model(
        family,
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **extra,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    model = get_peft_model(
        model,
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    return model


def batch(pad: int = 0):
    """Two groups of two rows: a shared 24-token system prompt, a per-group task,
    completions of different lengths; prompts left-padded, completions right-padded
    (TRL's layout)."""
    g = torch.Generator().manual_seed(1)
    system = torch.randint(3, 97, (24,), generator=g).tolist()
    tasks = [torch.randint(3, 97, (n,), generator=g).tolist() for n in (5, 9)]
    prompts, completions = [], []
    for task in tasks:
        for n in (7, 4):
            prompts.append(system + task)
            completions.append(torch.randint(3, 97, (n,), generator=g).tolist())
    width_p = max(map(len, prompts))
    width_c = max(map(len, completions))
    ids, mask = [], []
    for p, c in zip(prompts, completions):
        ids.append([pad] * (width_p - len(p)) + p + c + [pad] * (width_c - len(c)))
        mask.append([0] * (width_p - len(p)) + [1] * (len(p) + len(c)) + [0] * (width_c - len(c)))
    return torch.tensor(ids), torch.tensor(mask), width_c


def whole_rows_logps(model, ids, mask, keep, entropy=False):
    """What TRL computes: each row run whole under its padding mask."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -keep - 1 : -1].float() / TEMPERATURE
    log_probs = torch.log_softmax(logits, -1)
    if entropy:
        return -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, ids[:, -keep:, None]).squeeze(-1)


def lora_grads(model, logps, weights):
    model.zero_grad()
    (logps * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_shared_prefix_ends_where_the_rows_differ_and_before_every_completion():
    ids, mask, keep = batch()
    length, first = shared_prefix_len(ids, mask, keep)
    assert length == 24 and first.tolist() == [4, 4, 0, 0]
    assert shared_prefix_len(ids[:2], mask[:2], keep)[0] == 24 + 5 - 1  # one group: its whole prompt but the last token


@pytest.mark.parametrize("family", ["llama", "qwen2", "granite"])  # granite scales its logits: the model's own head
def test_shared_prefix_logps_and_gradients_equal_the_rows_run_whole(family):
    model = tiny_lora_model(family)
    ids, mask, keep = batch()
    weights = torch.randn(ids.shape[0], keep, generator=torch.Generator().manual_seed(2)) * mask[:, -keep:]

    reference = whole_rows_logps(model, ids, mask, keep)
    ref_grads = lora_grads(model, reference, weights)
    shared, entropy = shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE, compute_entropy=True)
    grads = lora_grads(model, shared, weights)

    real = mask[:, -keep:].bool()
    assert (shared - reference)[real].abs().max() < 1e-5
    assert not shared[~real].any() and not entropy[~real].any()  # padded completion slots are 0, as in TRL's pass
    assert entropy.shape == shared.shape and bool((entropy[real] > 0).all())
    assert ref_grads.keys() == grads.keys() and ref_grads
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name
    # the comparison can fail: a wrong temperature changes both
    wrong, _ = shared_prefix_logps(model, ids, mask, keep, temperature=1.0)
    assert (wrong - reference)[real].abs().max() > 1e-3


def test_only_the_scored_positions_reach_the_output_layer_and_keep_their_values_and_gradients():
    """``scored`` (the sampled tokens): their log-probabilities and gradients are
    those of the rows run whole; every other position is 0 and is never put
    through the vocabulary-wide output layer."""
    model = tiny_lora_model("llama")
    ids, mask, keep = batch()
    real = mask[:, -keep:].bool()
    scored = real.clone()
    scored[:, 1::3] = False  # as if every third completion token were a tool result
    weights = torch.randn(ids.shape[0], keep, generator=torch.Generator().manual_seed(2)) * scored
    reference = whole_rows_logps(model, ids, mask, keep)
    ref_grads = lora_grads(model, reference, weights)

    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    try:
        logps, entropy = shared_prefix_logps(
            model, ids, mask, keep, temperature=TEMPERATURE, compute_entropy=True, scored=scored
        )
    finally:
        hook.remove()
    grads = lora_grads(model, logps, weights)
    assert seen == [int(scored.sum())] and int(scored.sum()) < int(real.sum())
    assert (logps - reference)[scored].abs().max() < 1e-5
    assert not logps[~scored].any() and not entropy[~scored].any() and bool((entropy[scored] > 0).all())
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("family", ["llama", "granite"])
def test_interleaved_groups_a_lone_row_and_a_row_with_nothing_scored_equal_the_rows_run_whole(family):
    """Rows of three prompts interleaved (as TRL's shuffle leaves them): a group of
    two, a group of two in which one row scores nothing (it is left out of its
    group's pass), a row alone; every group cut at its own last scored token."""
    model = tiny_lora_model(family)
    ids, mask, keep = batch()
    ids, mask = torch.cat([ids, ids[:1]]), torch.cat([mask, mask[:1]])
    ids[4, 4 + 24] = (ids[4, 4 + 24] + 1) % 97  # row 4: the first group's system prompt, a task of its own
    order = torch.tensor([0, 2, 4, 1, 3])
    ids, mask = ids[order], mask[order]
    scored = mask[:, -keep:].bool().clone()
    scored[1] = False  # a row of the second group: nothing sampled
    scored[0, 4:] = False
    scored[2, 2:] = False
    weights = torch.randn(ids.shape[0], keep, generator=torch.Generator().manual_seed(2)) * scored
    reference = whole_rows_logps(model, ids, mask, keep)
    ref_grads = lora_grads(model, reference, weights)
    logps, _ = shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE, scored=scored)
    grads = lora_grads(model, logps, weights)
    assert (logps - reference)[scored].abs().max() < 1e-5 and not logps[~scored].any()
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name


def test_a_row_without_a_prompt_is_left_to_trl():
    model = tiny_lora_model("llama")
    ids, mask, keep = batch()
    mask[0, :-keep] = 0  # (not TRL's layout: nothing predicts its first completion token)
    assert shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE) is None


def test_group_rows_puts_each_prompts_rows_in_one_micro_batch_and_moves_every_field_with_its_row():
    from trace_gym.training.shared_update import group_rows

    prompts = torch.tensor(
        [[0, 5, 6], [7, 8, 9], [0, 5, 6], [7, 8, 9]]
    )  # two groups, interleaved as after TRL's shuffle
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    rows = {
        "prompt_ids": prompts,
        "prompt_mask": mask,
        "advantages": torch.tensor([1.0, 2.0, 3.0, 4.0]),
        "labels": ["a", "b", "c", "d"],
        "num_items_in_batch": torch.tensor(9),
        "old_per_token_logps": None,
    }
    batches = [
        {k: (v[at : at + 2] if k not in ("num_items_in_batch", "old_per_token_logps") else v) for k, v in rows.items()}
        for at in (0, 2)
    ]
    grouped = group_rows(batches)
    assert [b["labels"] for b in grouped] == [["a", "c"], ["b", "d"]]
    assert [b["advantages"].tolist() for b in grouped] == [[1.0, 3.0], [2.0, 4.0]]
    assert [b["prompt_ids"].tolist() for b in grouped] == [[[0, 5, 6]] * 2, [[7, 8, 9]] * 2]
    assert all(int(b["num_items_in_batch"]) == 9 and b["old_per_token_logps"] is None for b in grouped)


def test_a_wrapped_model_runs_through_its_wrapper():
    """Under a wrapper that holds the model as ``.module`` (DDP, whose forward
    prepares the gradient all-reduce), every forward goes through the wrapper, not
    around it to the decoder; the values are the same."""
    model = tiny_lora_model("llama")
    ids, mask, keep = batch()

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module, self.calls = module, 0

        def forward(self, **inputs):
            self.calls += 1
            return self.module(**inputs)

    wrapped = Wrapper(model)
    with torch.no_grad():
        logps, _ = shared_prefix_logps(wrapped, ids, mask, keep, temperature=TEMPERATURE)
        reference = whole_rows_logps(model, ids, mask, keep)
    assert wrapped.calls == 5  # the shared prefix, then per group: the rest of its prompt, its rows
    assert (logps - reference)[mask[:, -keep:].bool()].abs().max() < 1e-5


def test_rows_sharing_too_little_are_left_to_trl():
    model = tiny_lora_model("llama")
    ids, mask, keep = batch()
    ids[1, 4] = (ids[0, 4] + 1) % 97  # the second row differs from its first real token on
    assert shared_prefix_len(ids, mask, keep)[0] == 0
    assert shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE) is not None  # rows 2, 3: one prompt
    ids[3, 0] = (ids[2, 0] + 1) % 97  # now no two rows share a prompt, nor do all rows share a prefix
    assert shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE) is None
    scored = torch.zeros(ids.shape[0], keep, dtype=torch.bool)  # nothing to score: TRL's pass keeps the loss attached
    assert shared_prefix_logps(model, *batch()[:2], keep, temperature=TEMPERATURE, scored=scored) is None


def test_groups_of_different_system_prompts_share_their_own_prompts_and_equal_the_rows_run_whole():
    """A mixture of envs: the groups' prompts share no prefix worth a pass (a
    different system prompt each), each group's prompt still runs once."""
    model = tiny_lora_model("llama")
    ids, mask, keep = batch()
    ids[2:, 0:] = torch.where(mask[2:].bool(), (ids[2:] + 1) % 97, ids[2:])  # the second group: another prompt entirely
    ids[2:, -keep:] = batch()[0][2:, -keep:]  # (its completions as before)
    assert shared_prefix_len(ids, mask, keep)[0] == 0
    weights = torch.randn(ids.shape[0], keep, generator=torch.Generator().manual_seed(2)) * mask[:, -keep:]
    reference = whole_rows_logps(model, ids, mask, keep)
    ref_grads = lora_grads(model, reference, weights)
    shared, _ = shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE)
    grads = lora_grads(model, shared, weights)
    assert (shared - reference)[mask[:, -keep:].bool()].abs().max() < 1e-5
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name


def test_each_prompt_runs_once_and_each_group_only_up_to_its_last_scored_token():
    """The tokens through the model: the batch's shared prefix once, the rest of
    each group's prompt once, then the group's rows that score anything, from
    their last prompt token up to their last scored one (a trailing tool result
    is never run); the values are those of the rows run whole."""
    model = tiny_lora_model("llama")
    ids, mask, keep = batch()  # prompts 24 + 5 and 24 + 9 tokens, completions 7 and 4 (padded to 7)
    scored = mask[:, -keep:].bool().clone()
    scored[:2, 5:] = False  # the first group's last two tokens are a tool result
    scored[3] = False  # the second group's second row sampled nothing: its group runs one row
    fed = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: fed.append(tuple(args[0].shape))
    )
    try:
        with torch.no_grad():
            logps, _ = shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE, scored=scored)
    finally:
        hook.remove()
    # 24 shared; group 1: 4 more prompt tokens, then its last prompt token + completion tokens 1..4 (5 is scored last)
    assert fed == [(1, 24), (1, 4), (2, 1 + 4), (1, 8), (1, 1 + 6)]
    reference = whole_rows_logps(model, ids, mask, keep)
    assert (logps - reference)[scored].abs().max() < 1e-5 and not logps[~scored].any()


def test_sliding_window_models_are_left_to_trl():
    """A sliding-window cache keeps only the window of the prefix: no shared path."""
    model = tiny_lora_model("qwen2")
    ids, mask, keep = batch()
    model.config.use_sliding_window, model.config.sliding_window = True, 8
    assert shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE) is None
    model.config.use_sliding_window = False
    assert shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE) is not None


def test_an_entropy_bonus_gets_the_entropy_gradient_of_the_rows_run_whole():
    model = tiny_lora_model("llama")
    ids, mask, keep = batch()
    real = mask[:, -keep:].float()
    ref_grads = lora_grads(model, whole_rows_logps(model, ids, mask, keep, entropy=True), real)
    _, entropy = shared_prefix_logps(
        model, ids, mask, keep, temperature=TEMPERATURE, compute_entropy=True, entropy_grad=True
    )
    grads = lora_grads(model, entropy, real)
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name
    _, detached = shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE, compute_entropy=True)
    assert not detached.requires_grad  # only for the log and TRL's entropy mask unless a bonus asks


def test_a_checkpointed_model_keeps_the_shared_pass_and_recomputes_its_layers():
    """Gradient checkpointing (non-reentrant, as the trainer sets it) in training
    mode: the shared pass still runs, with the log-probabilities and LoRA gradients
    of the rows run whole, and its layers are recomputed in the backward pass (the
    memory checkpointing saves)."""
    model = tiny_lora_model("llama")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids, mask, keep = batch()
    weights = torch.randn(ids.shape[0], keep, generator=torch.Generator().manual_seed(2)) * mask[:, -keep:]
    reference = whole_rows_logps(model, ids, mask, keep)
    ref_grads = lora_grads(model, reference, weights)

    calls = []
    mlp = model.base_model.model.model.layers[0].mlp
    mlp.register_forward_pre_hook(lambda *_: calls.append(1))  # (inside the checkpointed layer: again on a recompute)
    shared, _ = shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE)
    forward = len(calls)
    grads = lora_grads(model, shared, weights)
    assert forward == 5  # the system prompt, each group's task, each group's rows
    assert len(calls) == 2 * forward  # every pass recomputed in the backward
    real = mask[:, -keep:].bool()
    assert (shared - reference)[real].abs().max() < 1e-5
    for name in ref_grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4), name
    layer = model.base_model.model.model.layers[0]
    assert layer._can_checkpoint_with_cache is False  # transformers' own setting is back after the pass

    model.gradient_checkpointing_disable()
    calls.clear()
    lora_grads(model, shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE)[0], weights)
    assert len(calls) == forward  # (the count can fail: without checkpointing nothing is recomputed)


def test_a_model_whose_layers_drop_the_cache_takes_trls_pass(monkeypatch):
    """Where a checkpointed layer drops the cache anyway (a model transformers does not
    let read it), the shared pass notices and leaves the model to TRL, never a crash."""
    import contextlib

    from trace_gym.training import shared_update

    model = tiny_lora_model("llama")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids, mask, keep = batch()
    monkeypatch.setattr(shared_update, "reading_cache_under_checkpointing", lambda layers: contextlib.nullcontext())
    assert shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE) is None


def test_reentrant_checkpointing_takes_trls_pass():
    """Reentrant checkpointing gives gradients only to a layer's outputs, not to the
    prefix keys a later pass reads: that model is left to TRL."""
    model = tiny_lora_model("llama")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    ids, mask, keep = batch()
    model.train()
    assert shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE) is None
    model.eval()  # checkpointing is a training-mode affair
    with torch.no_grad():
        logps, _ = shared_prefix_logps(model, ids, mask, keep, temperature=TEMPERATURE)
        reference = whole_rows_logps(model, ids, mask, keep)
    assert (logps - reference)[mask[:, -keep:].bool()].abs().max() < 1e-5


def test_sampled_positions_are_found_by_completion_and_merged_for_equal_completions():
    from trace_gym.training.shared_update import sampled_positions, scored_positions

    # row 0 and row 2 have one completion (e.g. a failed episode's [eos] beside a real one): either's samples count
    table = sampled_positions([[5, 6, 7], [8, 9], [5, 6, 7]], [[1, 0, 0], [0, 1], [0, 0, 1]])
    assert table == {(5, 6, 7): [1, 0, 1], (8, 9): [0, 1]}
    ids = torch.tensor([[1, 2, 5, 6, 7], [0, 3, 8, 9, 0]])  # completions right-padded inside 3 columns
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert scored_positions(table, ids, mask, 3).tolist() == [[True, False, True], [False, True, False]]
    # a completion the generation did not make (e.g. masked as truncated): that row's real positions, the others as before
    ids[1, 3] = 4
    assert scored_positions(table, ids, mask, 3).tolist() == [[True, False, True], [True, True, False]]
    mask[1, 3] = 0
    assert scored_positions(table, ids, mask, 3).tolist() == [[True, False, True], [True, False, False]]
    assert scored_positions(table, ids[:1], mask[:1], 3).tolist() == [[True, False, True]]  # whatever rows are beside
    assert scored_positions({}, ids, mask, 3) is None


def test_the_fallback_pass_is_zero_off_the_scored_positions_as_the_shared_pass_is():
    """A reentrant checkpointed model in training takes TRL's pass (here: the rows run whole);
    its values off the sampled tokens are 0, as the shared path's, so a policy and a
    reference pass that took different paths never pair a 0 with a real value."""
    from trace_gym.training.shared_update import chunk_logps

    model = tiny_lora_model("llama")
    ids, mask, keep = batch()
    scored = mask[:, -keep:].bool().clone()
    scored[:, 1::3] = False
    with torch.no_grad():
        shared, _, used = chunk_logps(model, ids, mask, keep, scored=scored, whole=None, temperature=TEMPERATURE)
    assert used
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    whole = lambda m, i, a, k: (whole_rows_logps(m, i, a, k), whole_rows_logps(m, i, a, k, entropy=True))  # noqa: E731
    logps, entropy, used = chunk_logps(model, ids, mask, keep, scored=scored, whole=whole, temperature=TEMPERATURE)
    assert not used
    assert not logps[~scored].any() and not entropy[~scored].any()
    assert (logps - shared)[scored].abs().max() < 1e-5

    def impossible_tokens(m, i, a, k):  # -inf off the sampled tokens: still 0 there, not NaN
        values = whole_rows_logps(m, i, a, k).detach().clone()
        return values.masked_fill(~scored, float("-inf")), None

    logps, _, _ = chunk_logps(model, ids, mask, keep, scored=scored, whole=impossible_tokens, temperature=TEMPERATURE)
    assert bool(torch.isfinite(logps).all()) and not logps[~scored].any()


def test_only_a_lora_that_adds_nothing_is_its_own_reference():
    """``adapter_is_identity`` (the trainer skips TRL's KL reference pass on it): a
    fresh LoRA, every B zero, gives exactly its base model's logits; one non-zero B,
    DoRA, a ``ref`` adapter or a model without an adapter are refused."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from trace_gym.training.shared_update import adapter_is_identity

    def fresh(**lora):
        config = AutoConfig.for_model(
            "llama", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4
        )
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        return base, get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], **lora))

    ids = torch.arange(1, 13).unsqueeze(0)
    base, model = fresh()
    assert adapter_is_identity(model)
    with torch.no_grad():
        enabled = model(input_ids=ids).logits
        with model.disable_adapter():
            assert torch.equal(enabled, model(input_ids=ids).logits)
        next(p for n, p in model.named_parameters() if "lora_B" in n)[0, 0] = 1e-3
    assert not adapter_is_identity(model)
    assert not adapter_is_identity(tiny_lora_model("llama"))  # B drawn at random (init_lora_weights=False)
    assert not adapter_is_identity(fresh(use_dora=True)[1])
    assert not adapter_is_identity(base) and not adapter_is_identity(torch.nn.Linear(2, 2))
    _, model = fresh()
    model.add_adapter("ref", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert not adapter_is_identity(model)
