"""The paper's families play token in/token out: Llama 3.1's, Qwen2.5's and Qwen3's
stock templates (TRL's copies) over tiny random models. The loop appends each
turn's ids to those it holds, so a template must render earlier turns the same
whatever follows: Qwen3's stock one does not (it drops earlier reasoning), and is
swapped for TRL's training template; Llama's gets its tools in the system turn and
a turn with two tool calls; a template that still cannot play ends that episode,
with the reason, never the run."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from families import FAMILIES, backend_for, family_tokenizer  # noqa: E402  (after the importorskips)

STOCK = [f for f in FAMILIES if f != "embedded"]


def call(name: str, i: int, **arguments) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


TOOLS = [
    {"type": "function", "function": {"name": n, "description": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("find_user_id_by_email", "get_order_details", "cancel_pending_order")
]
EPISODE = [  # a τ²-retail episode as the loop sees it: calls, results, messages, a user reply
    {"role": "system", "content": "You are a retail agent. Authenticate the user first."},
    {"role": "user", "content": "Cancel order #W1, I am mia@example.com."},
    {"role": "assistant", "content": "", "tool_calls": [call("find_user_id_by_email", 1, email="mia@example.com")]},
    {"role": "tool", "tool_call_id": "c1", "name": "find_user_id_by_email", "content": "mia_1"},
    {"role": "assistant", "content": "", "tool_calls": [call("get_order_details", 2, order_id="#W1")]},
    {"role": "tool", "tool_call_id": "c2", "name": "get_order_details", "content": '{"status": "pending"}'},
    {"role": "assistant", "content": "Shall I cancel #W1 (ordered by mistake)?"},
    {"role": "user", "content": "Yes."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("cancel_pending_order", 3, order_id="#W1", reason="ordered by mistake")],
    },
    {"role": "tool", "tool_call_id": "c3", "name": "cancel_pending_order", "content": '{"status": "cancelled"}'},
]


def played_ids(backend, messages: list[dict]) -> list[int]:
    """The ids the loop holds after the last message: the first prompt, then each
    assistant turn as the model samples it and the messages after it appended."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    ids, _ = backend.encode_conversation(messages[: turns[0]], TOOLS)
    for k, i in enumerate(turns):
        sampled = backend.encode_reply(messages[i])
        following = messages[i + 1 : turns[k + 1] if k + 1 < len(turns) else len(messages)]
        ids = [*ids, *sampled, *backend.encode_continuation(messages[i], following, sampled)]
    return ids


def test_auto_keeps_a_template_that_appends_and_takes_trls_training_one_for_qwen3():
    notes = {family: backend_for(family).template_note for family in STOCK}
    assert notes["llama3_1"].startswith("the tokenizer's own") and notes["qwen2_5"].startswith("the tokenizer's own")
    assert notes["qwen3"].startswith("TRL's training template")
    assert "re-renders earlier turns" in backend_for("qwen3", template="stock").template_note


@pytest.mark.parametrize("family", STOCK)
def test_an_episode_appended_turn_by_turn_reads_as_the_whole_conversation_rendered(family):
    backend = backend_for(family)
    ids = played_ids(backend, EPISODE)
    whole = backend._render(EPISODE, TOOLS, True)
    assert backend.tokenizer.decode(ids) == whole
    if family == "llama3_1":  # the tool schemas sit in the system turn, the prefix episodes share
        _, prefix = backend.encode_conversation(EPISODE[:2], TOOLS)
        assert prefix > 0 and "find_user_id_by_email" in backend.tokenizer.decode(
            backend.encode_conversation(EPISODE[:2], TOOLS)[0][:prefix]
        )


def test_qwen3s_stock_template_cannot_append_and_says_so():
    backend = backend_for("qwen3", template="stock")
    with pytest.raises(Exception, match="re-renders earlier turns"):
        played_ids(backend, EPISODE)


def test_a_template_named_that_cannot_append_is_refused_in_one_line():
    from trace_gym.llm.base import LLMError

    tokenizer = family_tokenizer("qwen3")
    with pytest.raises(LLMError, match="chat template 'qwen3' re-renders earlier turns"):
        from trace_gym.llm.templates import choose

        choose(tokenizer, "qwen3")
    with pytest.raises(LLMError, match="chat template 'qwen9': neither a file, one of ours .* nor one of TRL's"):
        choose(tokenizer, "qwen9")
    assert choose(tokenizer, "qwen3_training")[1] == "'qwen3_training'"


def test_the_compact_template_says_the_same_in_fewer_tokens():
    """``chatml_compact_tools``: every tool, argument and description of τ²-retail's schemas
    as signatures, JSON results without the spaces after separators (an order's JSON parses
    back the same), an error as sent; it appends turn for turn and saves 1k+ tokens of the 8,192.
    An array without items still renders (a user's tool may declare one so)."""
    from trace_gym.llm.embedded import COMPACT_TOOL_CHAT_TEMPLATE
    from trace_gym.llm.templates import choose
    from trace_gym.training.sft import env_tools

    compact = backend_for("embedded", template="chatml_compact_tools")
    assert compact.tokenizer.chat_template == COMPACT_TOOL_CHAT_TEMPLATE
    assert choose(compact.tokenizer, "chatml_compact_tools")[1] == "'chatml_compact_tools'"
    assert compact.tokenizer.decode(played_ids(compact, EPISODE)) == compact._render(EPISODE, TOOLS, True)
    tools = env_tools("trace/tau2-retail-v0")
    order = {"order_id": "#W1", "items": [{"item_id": "1", "options": {"color": "blue, dark"}}, {"item_id": "2"}]}
    episode = [
        EPISODE[0],
        EPISODE[1],
        EPISODE[4],
        {**EPISODE[5], "content": json.dumps(order)},
        EPISODE[8],
        {**EPISODE[9], "content": "Error: Non-delivered order cannot be returned"},
    ]
    text = compact._render(episode, tools, False)
    for tool in tools:
        f = tool["function"]
        properties = f["parameters"]["properties"]
        assert f"{f['name']}(" in text and f["description"].strip() in text
        for name, spec in properties.items():
            assert f"{name}: " in text and spec.get("description", "").strip() in text
    assert "item_ids: array[string]" in text and '"name": "get_order_details"' in text  # calls as the model writes them
    sent = text.split("<tool_response>\n")[1].split("\n</tool_response>")[0]
    assert json.loads(sent) == order and ", " not in sent.replace("blue, dark", "") and ": " not in sent
    assert "<tool_response>\nError: Non-delivered order cannot be returned\n</tool_response>" in text
    loose = [
        {"type": "function", "function": {"name": "tag", "parameters": {"properties": {"ids": {"type": "array"}}}}}
    ]
    assert "tag(ids?: array): \n" in compact._render(EPISODE[:2], loose, False)
    full = backend_for("embedded")
    saved = len(full.encode_conversation(episode[:2], tools)[0]) - len(
        compact.encode_conversation(episode[:2], tools)[0]
    )
    assert saved > 1000


def test_a_warm_start_plays_under_the_template_it_ships(tmp_path, monkeypatch):
    from trace_gym.llm import embedded

    [name] = embedded.WARM_STARTS
    assert embedded.chat_template_of(name) == embedded.TOOL_CHAT_TEMPLATE  # the shipped one ships none today
    assert embedded.chat_template_of(embedded.EMBEDDED_NAME) == embedded.TOOL_CHAT_TEMPLATE
    (tmp_path / name).mkdir()
    (tmp_path / name / "chat_template.jinja").write_text(embedded.COMPACT_TOOL_CHAT_TEMPLATE)
    monkeypatch.setattr(embedded, "WARM_STARTS_DIR", tmp_path)
    assert embedded.chat_template_of(name) == embedded.COMPACT_TOOL_CHAT_TEMPLATE
    assert embedded.chat_template_of("hf:/elsewhere") == embedded.TOOL_CHAT_TEMPLATE


def test_a_tokenizer_without_a_pad_token_plays_a_padded_batch():
    """Llama's and Mistral's tokenizers have no pad token: every way in gives them one."""
    from families import tiny_model

    from trace_gym.llm.local import LocalHF

    tokenizer = family_tokenizer("llama3_1")
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    backend = LocalHF.from_model(tiny_model(tokenizer), tokenizer)
    assert backend.tokenizer.pad_token_id == tokenizer.eos_token_id
    short, long = [{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Where is my order #W1? " * 4}]
    assert len(backend.generate([short, long], max_new_tokens=2)) == 2  # rows of two lengths, padded


def test_llamas_one_call_per_turn_template_still_appends_after_a_turn_with_two_calls():
    backend = backend_for("llama3_1")
    two = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("get_order_details", 1, order_id="#W1"), call("get_order_details", 2, order_id="#W2")],
    }
    with pytest.raises(Exception, match="only supports single tool-calls"):
        backend._render([*EPISODE[:2], two], TOOLS, False)  # the whole conversation cannot be rendered
    results = [
        {"role": "tool", "tool_call_id": f"c{i}", "name": "get_order_details", "content": f"order {i}"} for i in (1, 2)
    ]
    text = backend.tokenizer.decode(backend.encode_continuation(two, results, []))
    assert (
        "order 1" in text and "order 2" in text and text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    )


@pytest.mark.slow
@pytest.mark.parametrize("family", STOCK)
def test_tau2_episodes_play_under_each_family_and_a_template_error_ends_only_its_episode(family):
    from trace_gym.rollout import Episode, play_episodes

    for template in ("auto", "stock") if family == "qwen3" else ("auto",):
        backend = backend_for(family, template=template)
        played = play_episodes(
            backend,
            "trace/tau2-retail-v0",
            [Episode("0", 0, 1), Episode("1", 0, 2)],
            batch=2,
            temperature=1.0,
            max_new_tokens=8,
            env_kwargs={"max_steps": 8, "split": "train"},
        )
        assert len(played) == 2
        for p in played:
            if (
                template == "stock"
            ):  # Qwen3's own: the second turn cannot be appended; the episode ends, the run goes on
                assert p.trajectory.error and "re-renders earlier turns" in p.trajectory.error
                assert len(p.tokens.turns) == 1
            else:
                assert len(p.tokens.turns) >= 2, p.trajectory.error
                p.tokens.check()  # each turn's prompt extends the last turn's prompt and completion


@pytest.fixture(scope="module")
def oracle_demos(tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("demos") / "oracle.jsonl"
    result = run_cli(
        "rollout",
        "--env",
        "trace/tau2-retail-v0",
        "--agent",
        "oracle",
        "--split",
        "train",
        "--tasks",
        "2",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", STOCK)
def test_one_grpo_iteration_and_an_sft_run_under_each_familys_stock_template(family, tmp_path, oracle_demos):
    """A model folder as a user has it (stock template in its tokenizer): GRPO and SFT both
    play and train under the template the loop chose, and the SFT policy keeps it."""
    from families import tiny_model_folder

    from trace_gym.training import GRPOTrainingConfig, train
    from trace_gym.training.sft import SFTTrainingConfig, sft

    folder = tiny_model_folder(tmp_path / family, family, arch="qwen3" if family == "qwen3" else "llama")

    config = GRPOTrainingConfig(
        env_ids=["trace/tau2-mock-v0"],
        model=f"hf:{folder}",
        out=str(tmp_path / "grpo"),
        groups=1,
        rollouts_per_group=2,
        iterations=1,
        max_new_tokens=8,
        max_steps=4,
        learning_rate=1e-3,
        torch_threads=1,
        dtype="float32",
        calibrate=False,
        train_anyway=True,
        max_draws=1,
        train_unvalidated=["trace/tau2-mock-v0"],
    )
    result = train(config, progress=False)
    [row] = [json.loads(line) for line in result.log.read_text().splitlines()]
    assert (
        row["rollouts"] == 2 and row["failed_episodes"] == 0 and (result.adapter / "adapter_model.safetensors").exists()
    )

    done = sft(
        SFTTrainingConfig(
            trajectories=[str(oracle_demos)],
            model=f"hf:{folder}",
            out=str(tmp_path / "sft"),
            epochs=1,
            batch_size=2,
            micro_batch=2,
            learning_rate=1e-3,
            torch_threads=1,
            dtype="float32",
        ),
        progress=False,
    )
    from trace_gym.llm import make_backend

    policy = make_backend(done.policy)
    assert done.steps >= 1 and done.first_loss > 0
    assert policy.template_note.startswith("the tokenizer's own (it appends")  # the chosen template travels with it


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    """A tiny Qwen3 model folder as a user has it: the stock template, which cannot append."""
    from families import tiny_model_folder

    return tiny_model_folder(tmp_path_factory.mktemp("qwen3") / "model", "qwen3", arch="qwen3")


def test_a_template_named_with_the_model_is_the_one_every_stage_loads(qwen3_folder):
    """`[policy] chat_template` / `--chat-template` ride in the model spec: a backend, the
    trainer's loader and the pipeline's stages all read the same choice from it."""
    from trace_gym.llm import make_backend
    from trace_gym.llm.templates import CANNOT_APPEND, named_template
    from trace_gym.pipeline import PolicySettings
    from trace_gym.training.trainer import load_policy

    spec = PolicySettings(model=f"hf:{qwen3_folder}", chat_template="qwen3_training").spec
    assert spec == f"hf:{qwen3_folder}?template=qwen3_training"
    backend = make_backend(spec)
    assert backend.template_note == "'qwen3_training'" and backend.tokenizer.chat_template == named_template(
        "qwen3_training"
    )
    _, tokenizer, _ = load_policy(spec, "float32")
    assert tokenizer.chat_template == named_template("qwen3_training")

    stock = make_backend(f"hf:{qwen3_folder}?template=stock")  # what the user asked for, with the warning
    assert stock.template_note.endswith(CANNOT_APPEND)


def test_training_refuses_a_template_that_cannot_append(qwen3_folder):
    from trace_gym.training.config import TrainingError
    from trace_gym.training.trainer import load_policy

    with pytest.raises(TrainingError, match="re-renders earlier turns"):
        load_policy(f"hf:{qwen3_folder}?template=stock", "float32")


def test_rollout_plays_under_the_template_its_flag_names(qwen3_folder, tmp_path):
    from conftest import run_cli

    out = tmp_path / "r.jsonl"
    result = run_cli(
        "rollout",
        "--env",
        "trace/tau2-mock-v0",
        "--agent",
        "llm",
        "--model",
        f"hf:{qwen3_folder}",
        "--chat-template",
        "qwen3_training",
        "--tasks",
        "1",
        "--max-steps",
        "2",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    assert "plays under 'qwen3_training'" in result.stderr
    header = json.loads(out.read_text().splitlines()[0])
    assert f"hf:{qwen3_folder}?template=qwen3_training" in json.dumps(header)
