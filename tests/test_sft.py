"""The SFT warm start: demonstrations become the token episodes a rollout would
record, the loss falls on the agent's tokens and nowhere else, a held-out task
never enters the data, and a tiny run through the CLI gives a policy that loads
everywhere a model does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

pytest.importorskip("trl")

from trace_gym.training import TrainingError  # noqa: E402
from trace_gym.training.sft import (  # noqa: E402
    PrefixStore,
    SFTTrainingConfig,
    SharedPromptSampler,
    _Collator,
    agent_token_logps,
    demonstration_episode,
    demonstration_rows,
    detached_context_logps,
    env_tools,
    load_demonstrations,
    prompt_prefix_lengths,
    scored_runs,
)

RETAIL = "trace/tau2-retail-v0"


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> Path:
    """The oracle on three train-split tasks of τ²-retail: real demonstrations."""
    return roll_train(tmp_path_factory.mktemp("demos") / "oracle.jsonl", 3, "--agent", "oracle")


def roll_train(out: Path, tasks: int, *agent: str) -> Path:
    """``agent`` on the first ``tasks`` tasks of τ²-retail's train split, into ``out``."""
    result = run_cli(
        "rollout",
        "--env",
        RETAIL,
        *agent,
        "--split",
        "train",
        "--tasks",
        str(tasks),
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def backend():
    from trace_gym.llm import make_backend

    return make_backend("smollm2-135m-instruct")


def test_the_loss_mask_covers_exactly_the_agents_tokens(demos, backend):
    [trajectory, *_] = load_demonstrations([str(demos)], 1.0)[0]
    [row] = demonstration_rows(backend, [trajectory], 100_000)
    ids = [*row["prompt_ids"], *row["completion_ids"]]
    mask = [0] * len(row["prompt_ids"]) + row["completion_mask"]
    spans = _scored_spans(row)
    agent_turns = [m for m in trajectory.messages if m.role == "assistant" and m.raw is not None]
    assert len(spans) == len(agent_turns)  # one masked span per agent turn, nothing else
    close = backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for span, message in zip(spans, agent_turns):
        text = backend.tokenizer.decode(span)
        assert span[-1] == close  # the end-of-turn token the model stops on is learnt
        for call in message.tool_calls or []:
            assert f'"name": "{call.name}"' in text
        if not message.tool_calls:
            assert text == message.content + "<|im_end|>"
    scored = backend.tokenizer.decode([t for t, w in zip(ids, mask) if w])
    tool_results = [m.content for m in trajectory.messages if m.role == "tool" and len(m.content or "") > 40]
    assert tool_results and not any(result[-40:] in scored for result in tool_results)  # tool results carry no loss
    users = [m.content for m in trajectory.messages if m.role == "user" and m.content]
    assert not any(text[:30] in scored for text in users) and "<|im_start|>user" not in scored
    assert trajectory.messages[1].role == "assistant" and trajectory.messages[1].raw is None  # τ²'s greeting: the env's


def test_a_demonstration_is_the_token_episode_a_rollout_would_record(demos, backend):
    """Each turn's prompt extends the previous prompt + completion token for token, and the
    first prompt is what the agent itself encodes at its first turn."""
    from trace_gym.env import agent_conversation

    [trajectory, *_] = load_demonstrations([str(demos)], 1.0)[0]
    tools = env_tools(RETAIL)
    episode = demonstration_episode(backend, trajectory, tools)
    episode.check()
    first_agent = next(i for i, m in enumerate(trajectory.messages) if m.raw is not None)
    prompt, _ = backend.encode_conversation(agent_conversation(trajectory.messages[:first_agent]), tools)
    assert episode.turns[0].prompt_ids == prompt
    assert len(episode.turns) == sum(m.raw is not None for m in trajectory.messages)


def test_every_forward_pass_reads_rows_of_one_prompt():
    """A mixture of a long-prompt target's demonstrations and another env's is read in
    micro-batches of one prompt each (a mixed pass shares nothing and holds every row
    whole): every row at least once an epoch, a group's short tail filled from that
    group, the order fixed by seed and epoch and new each epoch."""
    groups = ["tau2"] * 7 + ["env"] * 4 + ["other"]
    sampler = SharedPromptSampler(groups, micro_batch=2, seed=0)
    order = list(sampler)
    assert len(order) == len(sampler) == 8 + 4 + 2
    batches = [order[i : i + 2] for i in range(0, len(order), 2)]
    assert all(len({groups[i] for i in b}) == 1 for b in batches)
    assert set(order) == set(range(len(groups)))
    assert order == list(SharedPromptSampler(groups, micro_batch=2, seed=0))
    sampler.set_epoch(1)
    assert list(sampler) != order
    mixed = [order[i : i + 4] for i in range(0, len(order), 4)]  # read 4 at a time, the same order mixes
    assert any(len({groups[i] for i in b}) > 1 for b in mixed)


def test_a_held_out_task_is_refused_in_one_line(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    from trace_gym.registry import make

    env = make(RETAIL, split="test")
    held_out = env.unwrapped.task_ids[0]
    env.close()
    result = run_cli(
        "rollout", "--env", RETAIL, "--agent", "oracle", "--task-ids", held_out, "--out", str(mixed), "--no-progress"
    )
    assert result.returncode == 0, result.stderr
    with pytest.raises(TrainingError, match="held-out 'test' split"):
        load_demonstrations([str(mixed)], 1.0)
    result = run_cli("sft", "--trajectories", str(mixed), "--out", str(tmp_path / "sft"))
    assert result.returncode == 2 and "held-out" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "sft").exists()


def test_nothing_to_learn_from_is_one_line(tmp_path):
    result = run_cli("sft", "--trajectories", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "no trajectory file" in result.stderr
    for bad, message in (
        (["--batch-size", "3", "--micro-batch", "2"], "must divide"),
        (["--epochs", "0"], "at least 1"),
    ):
        with pytest.raises(TrainingError, match=message):
            SFTTrainingConfig(
                trajectories=["x"],
                out="o",
                **{k.lstrip("-").replace("-", "_"): int(v) for k, v in zip(bad[::2], bad[1::2])},
            ).check()
    for bad, message in (({"dtype": "float16"}, "dtype must be one of"), ({"device": "tpu"}, "device must be")):
        with pytest.raises(TrainingError, match=message):
            SFTTrainingConfig(trajectories=["x"], out="o", **bad).check()
    assert SFTTrainingConfig(trajectories=["x"], out="o", device="cuda").resolved_dtype() == "bfloat16"


def test_agent_token_logps_equal_the_whole_forward(demos, backend):
    """The shared-prompt pass scores the agent's tokens as the model run whole does, with or
    without gradients through the shared prompt (the forward is the same). Real demonstration
    rows of the embedded model's tokens; a small random model of its architecture (the pass is
    arithmetic, not knowledge, and three 5.7k-token passes of the 135M model cost 80 s)."""
    import torch
    from families import tiny_model

    trajectories = load_demonstrations([str(demos)], 1.0)[0][:2]
    rows = demonstration_rows(backend, trajectories, 5700)
    batch = _Collator(backend.tokenizer.pad_token_id)(rows)
    # two layers, larger weights: an output that depends on where each token sits and on the cache
    model = tiny_model(backend.tokenizer, arch=backend.model.config.model_type, layers=2, init=0.2).eval()
    with torch.no_grad():
        shared, mask = agent_token_logps(model, batch)
        detached, _ = agent_token_logps(model, batch, prefix_gradient=False)
        keep = mask.shape[1]
        logits = (
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            .logits[:, -keep - 1 : -1]
            .float()
        )
        whole = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, -keep:, None]).squeeze(-1)
        ids = batch["input_ids"]
        moved = torch.arange(ids.shape[1])[None].repeat(ids.shape[0], 1)
        moved[:, -keep:] += 1  # the agent's tokens one position off their prompt: what a wrong cache offset does
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"], position_ids=moved).logits
        misplaced = torch.log_softmax(logits[:, -keep - 1 : -1].float(), -1).gather(-1, ids[:, -keep:, None])
    assert mask.sum() > 20
    assert not torch.allclose(misplaced.squeeze(-1)[mask], whole[mask], atol=1e-4)
    assert torch.allclose(shared[mask], whole[mask], atol=1e-4)
    off = mask[:, 1:]  # scored one token off: what the check tells apart
    assert not torch.allclose(shared[:, 1:][off], whole[:, :-1][off], atol=1e-4)
    assert torch.equal(shared, detached) and not shared[~mask].any()


@pytest.mark.slow
def test_a_tiny_warm_start_gives_a_policy_usable_as_a_model(tmp_path, demos, backend):
    """A small random model of the embedded one's architecture, as a user's hf: folder holds it
    (the embedded model itself runs in the shipped warm-start and resume tests)."""
    from families import tiny_model
    from safetensors.torch import load_file

    folder = tmp_path / "tiny"
    tiny_model(backend.tokenizer, arch=backend.model.config.model_type).save_pretrained(folder)
    backend.tokenizer.save_pretrained(folder)
    out = tmp_path / "sft"
    result = run_cli(
        "sft",
        "--trajectories",
        str(demos),
        "--model",
        f"hf:{folder}",
        "--out",
        str(out),
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--micro-batch",
        "2",
        "--max-tokens",
        "5700",
        "--lr",
        "1e-3",
        "--threads",
        "1",
        "--dtype",
        "float32",
    )
    assert result.returncode == 0, result.stderr
    assert f"policy: hf:{out / 'model'}" in result.stdout
    log = [json.loads(line) for line in (out / "sft_log.jsonl").read_text().splitlines()]
    assert log and all(row["loss"] > 0 and row["agent_tokens"] > 0 for row in log)
    run = json.loads((out / "run.json").read_text())
    assert run["data"]["episodes"] == 3 and run["data"]["tasks"] and 0 < run["data"]["agent_token_share"] < 0.2
    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in weights.items())
    from trace_gym.llm import make_backend

    policy = make_backend(f"hf:{out / 'model'}")
    assert "<tool_call>" in (policy.tokenizer.chat_template or "")  # the template it was trained under travels with it
    result = run_cli("sft", "--trajectories", str(demos), "--out", str(out))
    assert result.returncode == 2 and "already holds" in result.stderr


def _tiny(backend):
    from families import tiny_model

    # two layers, larger weights: an output that depends on where each token sits and on the cache
    return tiny_model(backend.tokenizer, arch=backend.model.config.model_type, layers=2, init=0.2)


def _gradients(model) -> dict:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


def test_the_detached_context_pass_scores_as_the_whole_forward(demos, backend):
    """Turn by turn, the context without gradients and each shared prompt from the step's
    store: the same log-probabilities of the agent's tokens as the model run whole, on real
    multi-turn τ² demonstration rows; the store runs the shared prompt once a step."""
    import torch

    trajectories = load_demonstrations([str(demos)], 1.0)[0][:2]
    rows = demonstration_rows(backend, trajectories, 5700)
    prompt_prefix_lengths(rows)
    assert rows[0]["prefix_len"] == rows[1]["prefix_len"] > 1000  # the system prompt and tool schemas they share
    assert all(r["prefix_len"] < len(r["prompt_ids"]) for r in rows)
    batch = _Collator(backend.tokenizer.pad_token_id)(rows)
    model = _tiny(backend).eval()
    store = PrefixStore()
    with torch.no_grad():
        detached, mask = detached_context_logps(model, batch, store, step=3)
        whole, _ = agent_token_logps(model, batch)
        assert store.passes == 1  # two rows, one shared prompt, one pass
        detached_context_logps(model, batch, store, step=3)
        assert store.passes == 1  # the same step: the weights have not changed
        detached_context_logps(model, batch, store, step=4)
        assert store.passes == 2  # a new step: computed again
    assert (
        mask.sum() > 20 and len(scored_runs([*mask[0].tolist()], 0)) >= 3
    )  # two agent turns and a tool result between
    assert torch.allclose(detached[mask], whole[mask], atol=1e-4) and not detached[~mask].any()
    off = mask[:, 1:]  # one token off: what the comparison tells apart
    assert not torch.allclose(detached[:, 1:][off], whole[:, :-1][off], atol=1e-4)


def test_the_detached_context_gradient_is_a_stop_gradient_on_the_contexts_keys_and_values(demos, backend):
    """The documented gradient, computed another way: the model run whole, with every layer's
    key and value projections detached at the positions that predict no agent token (the
    system prompt, tool results, user turns, each turn's end-of-turn token). Equal on a real
    multi-turn row, so a later turn's loss reaches the agent's earlier turns; the whole pass
    without the stop-gradient differs, and every layer gets a gradient."""
    import torch

    [trajectory] = load_demonstrations([str(demos)], 1.0)[0][:1]
    [row] = demonstration_rows(backend, [trajectory], 5700)
    prompt_prefix_lengths([row])
    batch = _Collator(backend.tokenizer.pad_token_id)([row])
    model = _tiny(backend).train()

    def backward(logps_and_mask):
        logps, mask = logps_and_mask
        (-(logps * mask).sum() / mask.sum()).backward()

    backward(detached_context_logps(model, batch))
    detached = _gradients(model)
    tokens = torch.tensor([*row["prompt_ids"], *row["completion_ids"]])
    agent = torch.tensor([0] * len(row["prompt_ids"]) + row["completion_mask"], dtype=torch.bool)
    scored = torch.cat([agent[1:], torch.tensor([False])])  # position p predicts token p + 1
    assert len(scored_runs(scored.tolist(), 0)) >= 3  # two agent turns with a tool result between

    def whole(stop_gradient: bool) -> dict:
        hooks = []
        if stop_gradient:
            for name, module in model.named_modules():
                if name.endswith(("k_proj", "v_proj")):
                    hooks.append(
                        module.register_forward_hook(
                            lambda _m, _i, out: torch.where(scored[None, :, None], out, out.detach())
                        )
                    )
        logits = model(input_ids=tokens[None]).logits[0].float()
        for hook in hooks:
            hook.remove()
        logps = torch.log_softmax(logits[scored], -1).gather(-1, tokens[1:][scored[:-1]][:, None]).squeeze(-1)
        (-logps.mean()).backward()
        return _gradients(model)

    reference, full = whole(True), whole(False)
    assert set(detached) == set(reference) == set(full)
    assert all(torch.allclose(detached[n], reference[n], atol=1e-6, rtol=1e-3) for n in reference)
    assert not all(torch.allclose(detached[n], full[n], atol=1e-6, rtol=1e-3) for n in full)
    assert all(detached[n].abs().sum() > 0 for n in detached if ".layers.0." in n or ".layers.1." in n)


def test_one_turn_gets_the_shared_prompt_passs_gradient(demos, backend):
    """A row of one agent turn right after its prompt has no context but the prompt, which
    both passes stop: the same gradient as ``agent_token_logps`` without ``prefix_gradient``."""
    import torch

    [trajectory] = load_demonstrations([str(demos)], 1.0)[0][:1]
    [row] = demonstration_rows(backend, [trajectory], 5700)
    prompt_prefix_lengths([row])
    turn = row["completion_mask"].index(0)  # the first agent turn ends where the first tool result starts
    one = {**row, "completion_ids": row["completion_ids"][:turn], "completion_mask": row["completion_mask"][:turn]}
    batch = _Collator(backend.tokenizer.pad_token_id)([one])
    model = _tiny(backend).train()
    grads = []
    for score in (detached_context_logps, lambda m, b: agent_token_logps(m, b, prefix_gradient=False)):
        logps, mask = score(model, batch)
        (-(logps * mask).sum() / mask.sum()).backward()
        grads.append(_gradients(model))
    detached, shared = grads
    assert set(detached) == set(shared) and all(
        torch.allclose(detached[n], shared[n], atol=1e-6, rtol=1e-4) for n in shared
    )


def test_the_detached_context_pass_stands_aside_where_its_cache_would_be_wrong(tmp_path, demos, backend):
    """A sliding-window model (its cache keeps only the window) and a model under gradient
    checkpointing (its layers drop the cache) are not scored turn by turn; ``sft`` refuses
    --no-context-gradient for the first in one line."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trace_gym.training.sft import sft

    rows = demonstration_rows(backend, load_demonstrations([str(demos)], 1.0)[0][:1], 5700)
    prompt_prefix_lengths(rows)
    batch = _Collator(backend.tokenizer.pad_token_id)(rows)
    config = AutoConfig.for_model(
        "mistral", vocab_size=len(backend.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=64,
    )  # fmt: skip
    windowed = AutoModelForCausalLM.from_config(config)
    assert detached_context_logps(windowed, batch) is None
    checkpointed = _tiny(backend)
    checkpointed.gradient_checkpointing_enable({"use_reentrant": False})
    assert detached_context_logps(checkpointed.train(), batch) is None
    with torch.no_grad():
        assert detached_context_logps(_tiny(backend).eval(), batch) is not None
    folder = tmp_path / "windowed"
    windowed.save_pretrained(folder)
    backend.tokenizer.save_pretrained(folder)
    config = SFTTrainingConfig(
        trajectories=[str(demos)], out=str(tmp_path / "out"), model=f"hf:{folder}", context_gradient=False
    )
    with pytest.raises(TrainingError, match="sliding window"):
        sft(config)


def test_whole_only_leaves_out_what_would_be_cut(demos, backend):
    """A demonstration longer than max_tokens is cut after its last agent turn that fits (its
    reads kept, the writes they lead to lost); with whole_only it is left out, and the ones
    that fit are the same rows either way."""
    trajectories = load_demonstrations([str(demos)], 1.0)[0]
    tools = env_tools(RETAIL)
    lengths = [len(demonstration_episode(backend, t, tools).ids) for t in trajectories]
    limit = min(lengths)  # the shortest fits whole, the others do not
    assert sum(n <= limit for n in lengths) < len(lengths)
    cut = demonstration_rows(backend, trajectories, limit)
    whole = demonstration_rows(backend, trajectories, limit, whole_only=True)
    assert len(cut) == len(trajectories)
    assert [r["episode_id"] for r in whole] == [t.episode_id for t, n in zip(trajectories, lengths) if n <= limit]
    assert all(r in cut for r in whole)
    assert all(len(r["prompt_ids"]) + len(r["completion_ids"]) <= limit for r in cut)
    result = run_cli("sft", "--trajectories", str(demos), "--out", str(demos.parent / "none"), "--whole-only",
                     "--max-tokens", str(limit - 1))  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr  # (after the weights' loading bar)
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("trace-gym: error: no demonstration fits in 8192 tokens, whole")
    )


def test_the_detached_context_needs_no_prefix_gradient():
    with pytest.raises(TrainingError, match="prefix_gradient needs context_gradient"):
        SFTTrainingConfig(trajectories=["x"], out="o", prefix_gradient=True, context_gradient=False).check()
    assert scored_runs([False, True, True, False, False, True, False], 1) == [(1, 3, True), (3, 5, False), (5, 6, True)]
    assert scored_runs([False, False], 0) == []


@pytest.mark.slow
def test_the_shipped_warm_start_is_what_the_command_makes_and_loads(tmp_path, demos):
    """`make warm-start`'s sft command (its defaults, a tiny budget) makes an adapter of the shipped
    one's shape, exported the same way; the shipped one merges into a policy that plays."""
    from safetensors.torch import load_file

    from trace_gym.llm import make_backend
    from trace_gym.llm.embedded import WARM_STARTS, WARM_STARTS_DIR
    from trace_gym.training.sft import export_adapter

    [name] = WARM_STARTS
    out = tmp_path / "sft"
    result = run_cli(
        "sft",
        "--trajectories",
        str(demos),
        "--out",
        str(out),
        "--epochs",
        "1",
        "--max-tokens",
        "5600",
        "--threads",
        "1",
    )
    assert result.returncode == 0, result.stderr
    exported = export_adapter(out / "adapter", tmp_path / "export")
    made = json.loads((exported / "adapter_config.json").read_text())
    stages = sorted(p for p in (WARM_STARTS_DIR / name).iterdir() if p.is_dir())
    assert [p.name for p in stages] == ["1-oracle-demonstrations"]
    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    assert "sft --trajectories $$(ls runs/warm-start/*.jsonl | paste -sd,) --out runs/warm-start/sft\n" in makefile
    shipped = json.loads((stages[0] / "adapter_config.json").read_text())
    for key in ("peft_type", "r", "lora_alpha", "task_type", "lora_dropout"):
        assert made[key] == shipped[key], key  # sft's defaults, as the Makefile's command uses them
    assert sorted(made["target_modules"]) == sorted(shipped["target_modules"])
    assert set(load_file(str(exported / "adapter_model.safetensors"))) == set(
        load_file(str(stages[0] / "adapter_model.safetensors"))
    )
    policy = make_backend(name)
    [completion] = policy.generate([[{"role": "user", "content": "Where is my order #W0000001?"}]], max_new_tokens=8)
    assert completion.text is not None


@pytest.mark.slow
def test_a_stopped_warm_start_resumes_from_its_last_checkpoint(tmp_path):
    """A run killed after its first checkpoint goes on from it with --resume: every step is
    logged once and the policy is made; a resume with other options, or with nothing to
    resume, and a plain rerun over the unfinished folder are each refused in one line.
    Its demonstrations are τ²-mock's (~400 tokens each, not retail's ~5k): resuming is
    the same. It is killed once the first of its four steps is saved, three before the end."""
    import shutil
    import subprocess
    import sys
    import time

    demos = tmp_path / "mock.jsonl"
    rolled = run_cli(
        "rollout", "--env", "trace/tau2-mock-v0", "--agent", "oracle", "--split", "base", "--tasks", "4",
        "--out", str(demos), "--no-progress",
    )  # fmt: skip
    assert rolled.returncode == 0, rolled.stderr
    out = tmp_path / "sft"
    options = [
        "--trajectories",
        str(demos),
        "--out",
        str(out),
        "--epochs",
        "1",
        "--batch-size",
        "1",
        "--micro-batch",
        "1",
        "--threads",
        "1",
        "--dtype",
        "float32",
        "--save-steps",
        "1",
        "--no-context-gradient",  # (the turn-by-turn pass through the trainer: its prompt store, its rows)
    ]
    refused = run_cli("sft", *options, "--resume")
    assert refused.returncode == 2 and "nothing to resume" in refused.stderr and len(refused.stderr.splitlines()) == 1
    exe = shutil.which("trace-gym", path=str(Path(sys.executable).parent)) or "trace-gym"
    process = subprocess.Popen([exe, "sft", *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / "checkpoint-1" / "trainer_state.json").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.2)
    process.kill()
    process.wait()
    assert not (out / "model").exists()
    again = run_cli("sft", *options)
    assert again.returncode == 2 and "--resume" in again.stderr and len(again.stderr.splitlines()) == 1
    other = list(options)
    other[options.index("--epochs") + 1] = "2"
    other = run_cli("sft", *other, "--resume")
    assert other.returncode == 2 and "epochs" in other.stderr and len(other.stderr.splitlines()) == 1
    run = json.loads((out / "run.json").read_text())
    del run["config"]["whole_only"]  # as a run made before the field recorded it: read at its default, as it ran
    (out / "run.json").write_text(json.dumps(run))
    resumed = run_cli("sft", *options, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from checkpoint-" in resumed.stdout and (out / "model").exists()
    steps = [json.loads(line)["iteration"] for line in (out / "sft_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def _scored_spans(row: dict) -> list[list[int]]:
    """The runs of consecutive tokens of a row that carry loss."""
    ids = [*row["prompt_ids"], *row["completion_ids"]]
    mask = [0] * len(row["prompt_ids"]) + row["completion_mask"]
    spans, current = [], []
    for token, weight in zip(ids, mask):
        if weight:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


def test_a_call_the_tool_refused_carries_no_loss(tmp_path, backend):
    """Error-recovery demonstrations (the planted agent's fixes_error): the refused call
    is context, the call that follows it is learnt."""
    from trace_gym.training.sft import refused_turns

    out = roll_train(tmp_path / "fixes.jsonl", 2, "--agent", "planted", "--deficits", "fixes_error=1.0")
    trajectories = load_demonstrations([str(out)], 1.0)[0]
    assert len(trajectories) == 2
    positions = []
    for trajectory in trajectories:
        [row] = demonstration_rows(backend, [trajectory], 100_000)
        agent_turns = [m for m in trajectory.messages if m.role == "assistant" and m.raw is not None]
        refused = refused_turns(trajectory)
        assert sum(refused) == 1 and len(refused) == len(agent_turns)
        learnt = [m for m, r in zip(agent_turns, refused) if not r]
        spans = _scored_spans(row)
        assert len(spans) == len(learnt)  # the refused turn's span is gone, every other one is there
        scripted = trajectory.model_copy(deep=True)  # the refused call made by a script (no raw text): the env's
        [turn for turn in scripted.messages if turn.role == "assistant" and turn.raw is not None][
            refused.index(True)
        ].raw = None
        assert not any(refused_turns(scripted))  # its error is not put on the agent turn before it
        positions.append(refused.index(True))
        wrong = agent_turns[refused.index(True)].tool_calls[0]
        right = agent_turns[refused.index(True) + 1].tool_calls[0]
        assert wrong.name == right.name and wrong.arguments != right.arguments
        for span, message in zip(spans, learnt):
            text = backend.tokenizer.decode(span)
            for call in message.tool_calls or []:
                assert all(f'"{v}"' in text for v in call.arguments.values() if isinstance(v, str))
    assert max(positions) > 0  # a refused call after an agent turn: the scripted case above can tell
