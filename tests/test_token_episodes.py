"""Token in, token out: local-model episodes at the token level, prefix KV
caching, per-episode settings in a batch, and label scoring."""

import math

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401
from openai_double import OpenAIDouble
from trace_gym.agents import LLMAgent
from trace_gym.llm import GenerationRequest, LLMError, TokenEpisode, TokenTurn, make_backend
from trace_gym.rollout import Episode, play_batched, play_episodes, run_episode

SYNTH_ENV = "trace/structured-data-v0"  # a synthesized env: it runs in the sandbox


@pytest.fixture(scope="module")
def smol():
    return make_backend("smollm2-135m-instruct")


def assert_token_faithful(tokens: TokenEpisode, tokenizer, transcript) -> None:
    """Each prompt extends the previous prompt + completion; the mask is 1 exactly on sampled ids."""
    assert tokens.turns
    for before, after in zip(tokens.turns, tokens.turns[1:]):
        assert after.prompt_ids[: len(before.prompt_ids) + len(before.completion_ids)] == [
            *before.prompt_ids,
            *before.completion_ids,
        ]
        assert len(after.prompt_ids) > len(before.prompt_ids) + len(before.completion_ids)  # the env said something
    ids, mask = tokens.ids, tokens.mask
    assert len(ids) == len(mask) == len(tokens.logprobs)
    sampled = [i for i, m in enumerate(mask) if m]
    expected = [len(t.prompt_ids) + j for t in tokens.turns for j in range(len(t.completion_ids))]
    assert sampled == expected
    assert [ids[i] for i in sampled] == [tok for t in tokens.turns for tok in t.completion_ids]
    assert all(lp <= 0.0 for t in tokens.turns for lp in t.logprobs)
    # What the env heard is the sampled text, and what the model saw next holds the env's answer.
    said = [m.raw for m in transcript if m.role == "assistant" and m.raw is not None]
    for turn, text in zip(tokens.turns, said):
        assert tokenizer.decode(turn.completion_ids, skip_special_tokens=True).strip() == text
    for k, turn in enumerate(tokens.turns[1:]):
        gap = tokenizer.decode(turn.prompt_ids[len(tokens.turns[k].prompt_ids) + len(tokens.turns[k].completion_ids) :])
        assert gap.rstrip().endswith("<|im_start|>assistant")
    grpo = tokens.for_grpo()
    assert grpo["prompt_ids"] == tokens.turns[0].prompt_ids
    assert len(grpo["completion_ids"]) == len(grpo["env_mask"]) == len(grpo["logprobs"])
    assert sum(grpo["env_mask"]) == sum(len(t.completion_ids) for t in tokens.turns)


def test_token_episode_type_checks_and_masks():
    episode = TokenEpisode([TokenTurn([1, 2], [3, 4], [-0.1, -0.2]), TokenTurn([1, 2, 3, 4, 9], [5], [-0.3])])
    episode.check()
    assert episode.ids == [1, 2, 3, 4, 9, 5] and episode.mask == [0, 0, 1, 1, 0, 1]
    assert episode.logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.3]
    assert episode.for_grpo() == {
        "prompt_ids": [1, 2],
        "completion_ids": [3, 4, 9, 5],
        "logprobs": [-0.1, -0.2, 0.0, -0.3],
        "env_mask": [1, 1, 0, 1],
    }
    with pytest.raises(LLMError, match="does not extend"):
        TokenEpisode([TokenTurn([1, 2], [3], [-0.1]), TokenTurn([1, 2, 7, 9], [5], [-0.3])]).check()


@pytest.mark.slow
def test_a_sandboxed_registry_env_episode_is_token_faithful(smol):
    played = play_episodes(
        smol, SYNTH_ENV, [1, 1, 2, 2], batch=4, temperature=1.0, max_new_tokens=12, env_kwargs={"max_steps": 3}
    )
    assert [(p.episode.env_seed, p.episode.sample) for p in played] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for p in played:
        assert len(p.tokens.turns) == p.trajectory.steps
        assert_token_faithful(p.tokens, smol.tokenizer, p.trajectory.messages)
    # (this env ends an episode at the first answer with a digit in it; most last longer)
    assert sum(len(p.tokens.turns) >= 2 for p in played) >= 2
    # Two samples of one seed are two draws, not one draw twice.
    assert played[0].tokens.turns[0].completion_ids != played[1].tokens.turns[0].completion_ids


@pytest.mark.slow
def test_cached_and_uncached_generation_agree_on_a_multi_turn_tau2_episode():
    """The cache's bookkeeping does not depend on the model's size: a two-layer random model
    (distinct logits, so that float rounding flips no greedy token) over the embedded
    tokenizer. Uncached, the 135M model prefilled τ²'s 4k-token prompt in every turn."""
    from families import backend_for

    tiny = backend_for("embedded", layers=2, init=0.5)
    env = gym.make("trace/tau2-retail-v0", split="test", max_steps=4)  # tau2 counts every message: two turns
    task = env.unwrapped.task_ids[1]
    runs = {}
    for cached in (False, True):
        tiny.kv_cache = cached
        tiny.clear_cache()
        agent = LLMAgent(tiny, max_new_tokens=16)
        trajectory = run_episode(env, agent, "trace/tau2-retail-v0", Episode(task, 0, 0))
        runs[cached] = (agent.tokens, trajectory, tiny.cache_stats())
    (plain, _, _), (cached, cached_traj, stats) = runs[False], runs[True]
    assert len(cached.turns) >= 2, cached_traj.termination_reason
    assert stats["hits"] >= len(cached.turns)  # the cached run did reuse keys and values
    assert [t.completion_ids for t in cached.turns] == [t.completion_ids for t in plain.turns]
    assert [t.prompt_ids for t in cached.turns] == [t.prompt_ids for t in plain.turns]
    assert len(cached.turns[0].prompt_ids) > 4000  # τ²'s real prompt: policy + 15 tool schemas
    assert_token_faithful(cached, tiny.tokenizer, cached_traj.messages)
    env.close()


@pytest.fixture(scope="module")
def smol_with_adapter(tmp_path_factory):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_gym.llm.embedded import ensure_embedded_model

    path = str(ensure_embedded_model())
    torch.manual_seed(0)
    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.mul_(50.0)  # a visibly different policy
    folder = tmp_path_factory.mktemp("adapter")
    lora.save_pretrained(folder)
    return make_backend("hf:" + path, adapters={"skill": str(folder)})


@pytest.mark.slow
def test_a_batch_honours_each_requests_own_seed_temperature_and_adapter(smol_with_adapter):
    backend = smol_with_adapter
    chat = [
        {"role": "system", "content": "You are a retail support agent."},
        {"role": "user", "content": "Name a colour."},
    ]
    requests = [
        GenerationRequest(chat, max_new_tokens=10, adapter="skill"),
        GenerationRequest(chat, max_new_tokens=10),
        GenerationRequest(chat, max_new_tokens=10, temperature=1.0, seed=1),
        GenerationRequest(chat, max_new_tokens=10, temperature=1.0, seed=2),
        GenerationRequest(chat, max_new_tokens=6, temperature=1.0, seed=1),
    ]
    together = [c.tokens.completion_ids for c in backend.complete(requests)]
    alone = [backend.complete([r])[0].tokens.completion_ids for r in requests]
    assert together == alone
    assert together[0] != together[1] and together[2] != together[3]
    assert together[4] == together[2][:6]  # the same seed draws the same tokens, whatever else is in the batch


def test_sampled_tokens_follow_the_distribution_their_logprobs_state(smol):
    """Over many seeds, each first token is drawn as often as exp(its recorded
    logprob) says (the tempered softmax): the sampler neither sharpens nor flattens
    the distribution, and the logprob it records is the one it sampled from."""
    chat = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say any word."}]
    n = 200
    done = smol.complete([GenerationRequest(chat, max_new_tokens=1, temperature=0.7, seed=s) for s in range(n)])
    drawn: dict[int, list[float]] = {}
    for c in done:
        drawn.setdefault(c.tokens.completion_ids[0], []).append(c.tokens.logprobs[0])
    assert len(drawn) > 1  # it samples (greedy would give one token)
    for token, logprobs in drawn.items():
        assert max(logprobs) - min(logprobs) < 1e-5  # one prompt: one probability per token
        p = math.exp(logprobs[0])
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(len(logprobs) - n * p) <= 4 * sigma + 2, (token, len(logprobs), n * p)


@pytest.mark.slow
def test_batched_episodes_keep_their_own_agents_settings(smol_with_adapter):
    backend = smol_with_adapter
    settings = [{"adapter": "skill"}, {}, {"temperature": 1.0, "seed": 4}]
    episodes = [Episode(None, 0, 5), Episode(None, 1, 5), Episode(None, 2, 5)]
    envs = [gym.make(SYNTH_ENV, max_steps=1) for _ in settings]
    agents = [LLMAgent(backend, max_new_tokens=10, **s) for s in settings]
    batched = {p.trajectory.sample: p.trajectory for p in play_batched(envs, agents, SYNTH_ENV, episodes)}
    for ep, s, env in zip(episodes, settings, envs):
        alone = run_episode(env, LLMAgent(backend, max_new_tokens=10, **s), SYNTH_ENV, ep)
        assert batched[ep.sample].messages[-2:] == alone.messages[-2:], s
        assert batched[ep.sample].adapter == s.get("adapter")
    for env in envs:
        env.close()


@pytest.mark.slow
def test_shared_prefix_attention_samples_what_full_attention_samples_over_two_turns_and_two_adapters(smol_with_adapter):
    from transformers import AttentionInterface

    from trace_gym.llm.local import shared_prefix

    backend = smol_with_adapter
    system = "You are a retail support agent. " + " ".join(
        f"Rule {i}: check order #{i} before acting." for i in range(40)
    )
    chats = [
        [{"role": "system", "content": system}, {"role": "user", "content": q}]
        for q in ["Cancel my order #W123.", "Where is order 7?", "Change my address to Main Street 4."]
    ]
    adapters = ["skill", None, None]
    groups_seen: list[int] = []

    def counting(module, *args, shared_prefix=None, **kwargs):
        if shared_prefix is not None and module.layer_idx == 0:
            groups_seen.append(len(shared_prefix))
        return shared_prefix_attention(module, *args, shared_prefix=shared_prefix, **kwargs)

    shared_prefix_attention = shared_prefix.shared_prefix_attention
    runs = {}
    try:
        shared_prefix.register()
        AttentionInterface.register(shared_prefix.NAME, counting)
        for on in (False, True):
            backend.shared_prefix = on
            backend.clear_cache()
            first = [
                GenerationRequest(c, max_new_tokens=8, adapter=a, session=f"{on}-{i}")
                for i, (c, a) in enumerate(zip(chats, adapters))
            ]
            turn1 = backend.complete(first)
            second = []
            for r, c in zip(first, turn1):
                more = backend.encode_continuation(
                    {"role": "assistant", "content": c.text},
                    [{"role": "user", "content": "And then?"}],
                    c.tokens.completion_ids,
                )
                second.append(
                    GenerationRequest(
                        r.messages,
                        max_new_tokens=8,
                        adapter=r.adapter,
                        session=r.session,
                        prompt_ids=[*c.tokens.prompt_ids, *c.tokens.completion_ids, *more],
                        prefix_len=r.prefix_len,
                    )
                )
            turn2 = backend.complete(second)
            runs[on] = [(c.tokens.completion_ids, c.tokens.logprobs) for c in [*turn1, *turn2]]
            assert backend.last_stats["prefill_tokens"] < 20 * len(second)  # the second turn extended the sessions
    finally:
        AttentionInterface.register(shared_prefix.NAME, shared_prefix_attention)
        backend.shared_prefix = True
    assert 2 in groups_seen  # one batch, two prefixes (the adapter's and the base model's), attended to in place
    # The test adapter (LoRA B x 50) amplifies float rounding: even its cached and uncached runs through plain
    # attention differ by ~2e-3 in logprob, so its row is compared on the first turn, and more loosely.
    for k, ((ids_on, on), (ids_off, off)) in enumerate(zip(runs[True], runs[False])):
        if k == 3:
            continue
        assert ids_on == ids_off, k
        assert max(abs(a - b) for a, b in zip(on, off)) < (1e-2 if k == 0 else 1e-4), k


@pytest.mark.slow
def test_local_score_ranks_the_label_the_prompt_spells_out(smol):
    labels = ["refund", "exchange", "cancel"]
    for wanted in labels:
        chat = [
            {"role": "system", "content": f"Answer with one word: {', '.join(labels)}."},
            {"role": "user", "content": f"Say the word {wanted}. Just the word {wanted}."},
        ]
        scores = smol.score(chat, labels)
        assert set(scores) == set(labels) and all(v < 0 for v in scores.values())
        assert max(scores, key=scores.get) == wanted, scores
    # A label's whole sequence counts: a longer label is its first token's logprob plus the rest.
    chat = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "Say: precise_arguments"}]
    first_token = smol.tokenizer.decode(smol.tokenizer("precise_arguments", add_special_tokens=False)["input_ids"][:1])
    whole, head = smol.score(chat, ["precise_arguments", first_token]).values()
    assert whole < head


def spelled_out(labels, top_k=5):
    """A server whose model repeats the label the user spelled out: its first token on top."""

    def answer(body):
        said = body["messages"][-1]["content"]
        wanted = next(label for label in labels if label in said)
        if not body.get("logprobs"):
            return {"content": wanted}
        others = [label for label in labels if label != wanted]
        top = [{"token": wanted[:3], "logprob": -0.1}] + [
            {"token": o[:3], "logprob": -3.0 - i} for i, o in enumerate(others)
        ]
        return {"content": wanted[:3], "top_logprobs": top[:top_k]}

    return answer


def test_openai_score_reads_the_first_tokens_top_logprobs():
    labels = ["refund", "exchange", "cancel"]
    with OpenAIDouble(spelled_out(labels)) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        for wanted in labels:
            scores = backend.score([{"role": "user", "content": f"Say {wanted}"}], labels)
            assert max(scores, key=scores.get) == wanted and scores[wanted] == -0.1
        assert server.requests[-1]["logprobs"] is True and server.requests[-1]["max_tokens"] == 1
    with OpenAIDouble(spelled_out(labels, top_k=2)) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        scores = backend.score([{"role": "user", "content": "Say refund"}], labels)
        assert scores["refund"] == -0.1 and math.isinf(scores["cancel"])  # outside the top 2


def test_openai_score_says_when_the_server_cannot_score():
    with OpenAIDouble(lambda body: {"content": "refund"}) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        with pytest.raises(LLMError, match="offers neither first-token top_logprobs nor per-label logprobs"):
            backend.score([{"role": "user", "content": "Say refund"}], ["refund", "cancel"])
    with OpenAIDouble(spelled_out(["refund", "refill"])) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        with pytest.raises(LLMError, match="share their first token"):
            backend.score([{"role": "user", "content": "Say refund"}], ["refund", "refill"])


def test_openai_batch_keeps_each_requests_settings():
    with OpenAIDouble(lambda body: {"content": "ok"}, models=("double", "skill")) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        chat = [{"role": "user", "content": "hi"}]
        backend.complete(
            [
                GenerationRequest(chat, seed=1, temperature=0.0),
                GenerationRequest(chat, seed=2, temperature=0.9, adapter="skill"),
            ]
        )
    seen = sorted((r["seed"], r["temperature"], r["model"]) for r in server.requests)
    assert seen == [(1, 0.0, "double"), (2, 0.9, "skill")]


def test_the_agent_is_conditioned_on_the_envs_transcript():
    """One conversation: multi-call turns become one tool message per call from the
    env's own record, and the agent's text on a tool-call turn is kept."""
    seen = []

    def answer(body):
        seen.append(body["messages"])
        if sum(1 for m in body["messages"] if m["role"] == "assistant") < 2:  # the greeting, then this turn
            return {
                "content": 'Let me look. <tool_call>{"name": "find_user_id_by_name_zip", "arguments": {"first_name": "A", '
                '"last_name": "B", "zip": "1"}}</tool_call><tool_call>{"name": "list_all_product_types", '
                '"arguments": {}}</tool_call>'
            }
        return {"content": "###STOP###"}

    with OpenAIDouble(answer) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        env = gym.make("trace/tau2-retail-v0", split="base")
        run_episode(env, LLMAgent(backend), "trace/tau2-retail-v0", Episode("0", 0, 0))
        env.close()
    last = seen[-1]
    assert last == env.unwrapped.conversation()[: len(last)]
    turn = next(m for m in last if m.get("tool_calls"))
    assert turn["content"] == "Let me look."
    tools = [m for m in last if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == [c["id"] for c in turn["tool_calls"]]
    assert "<tool_response" not in tools[0]["content"] and "Error" in tools[0]["content"]


def test_play_batched_yields_tokens_only_from_token_level_models():
    with OpenAIDouble(lambda body: {"content": "###STOP###"}) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        env = gym.make("trace/tau2-retail-v0", split="base")
        [played] = list(play_batched([env], [LLMAgent(backend)], "trace/tau2-retail-v0", [Episode("0", 0, 0)]))
        env.close()
    assert played.tokens is None and played.trajectory.termination_reason == "agent_stop"


def test_instructions_follow_the_envs_system_prompt_for_both_kinds_of_backend(smol):
    """A prompt-optimization baseline's instructions (GEPA's candidate) reach the model
    right after the env's system prompt, in text and in tokens; the env's transcript
    is left as the target wrote it."""
    extra = "Always confirm the order id before you act."
    env = gym.make("trace/tau2-retail-v0", split="base")
    obs, info = env.reset(options={"task_id": "0"})
    agent = LLMAgent(smol, instructions=extra)
    agent.reset(obs, info, env)
    request = agent.request()
    assert request.messages[0]["content"] == info["system_prompt"] + "\n\n" + extra
    assert env.unwrapped.messages[0].content == info["system_prompt"]
    text = smol.tokenizer.decode(request.prompt_ids)
    assert text.index(extra) < text.index(obs) and text.count(extra) == 1
    plain = LLMAgent(smol)
    plain.reset(obs, info, env)
    assert extra not in smol.tokenizer.decode(plain.request().prompt_ids)
    env.close()
