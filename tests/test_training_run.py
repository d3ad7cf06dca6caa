"""GRPO training runs on CPU with the embedded model (the bf16 test: a tiny random
model), kept tiny (G=2 or 1, K=2, a few tokens per turn): the LoRA changes and
reloads, the training batch gives no loss weight to hint or environment tokens,
kill -9 then --resume, and the env pool's replace-and-retry around dead sandbox
workers."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURE_ENVS


@pytest.fixture(autouse=True, scope="module")
def fixture_registry():
    """The fixture envs (tests/fixtures/envs) are registered for this module only: set at import
    time, the variable leaked into every test of the session (pytest imports all modules).
    Module scope, so that the module's shared training runs see it too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACE_GYM_REGISTRY_PATH", str(FIXTURE_ENVS))
        yield


pytest.importorskip("trl")

TWO_REPLIES = "trace/test-two-replies-v0"
HINT = "EXPERT GUIDANCE"  # what the fixture env adds to its system prompt with hint=True
pytestmark = pytest.mark.slow


def tiny_config(out: Path, **change):
    from trace_gym.training import GRPOTrainingConfig

    # lr well above the paper's 1e-5 so that two steps visibly move the model
    settings = dict(
        env_ids=[TWO_REPLIES],
        out=str(out),
        groups=2,
        rollouts_per_group=2,
        iterations=2,
        hint_share=0.5,
        max_new_tokens=12,
        learning_rate=1e-3,
        torch_threads=1,
        dtype="float32",
        calibrate=False,
        train_anyway=True,
        max_draws=1,
    )  # (calibration and redraws: test_calibration.py)
    settings["train_unvalidated"] = list(change.get("env_ids", settings["env_ids"]))  # fixtures: no validation report
    return GRPOTrainingConfig(**{**settings, **change})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two iterations on the two-replies env, with TRL's scored batches captured."""
    from trace_gym.training import build_trainer, run_trainer, shared_update

    config = tiny_config(tmp_path_factory.mktemp("grpo") / "run")
    trainer, parts = build_trainer(config, progress=False)
    captured = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        captured.append((out, list(parts["rollout"].last_outcomes), parts["rollout"].last_batch))
        return out

    trainer._generate_and_score_completions = spy
    prepare, scored, regroup = trainer._prepare_inputs, trainer._scored, shared_update.group_rows
    micro_batches, trainer.scored_seen, trainer.shuffled = [], [], []

    def prompts_of(inputs):
        return {tuple(ids[mask.bool()].tolist()) for ids, mask in zip(inputs["prompt_ids"], inputs["prompt_mask"])}

    def prepare_spy(batch):
        inputs = prepare(batch)
        micro_batches.append(prompts_of(inputs))
        return inputs

    def regroup_spy(batches):  # what TRL's shuffle left: did it mix groups?
        trainer.shuffled.append([len(prompts_of(b)) for b in batches])
        return regroup(batches)

    def scored_spy(ids, mask, keep):
        out = scored(ids, mask, keep)
        trainer.scored_seen.append(out is not None and int(out.sum()) < int(mask[:, -keep:].sum()))
        return out

    import torch
    from trl.trainer import grpo_trainer

    shuffle = grpo_trainer.shuffle_sequence_dict

    def splitting_shuffle(rows):  # TRL's shuffle, with a permutation that parts every group (K = 2, rows come by group)
        interleave = lambda n: torch.tensor(sorted(range(n), key=lambda i: (i % 2, i)))  # noqa: E731
        original, torch.randperm = torch.randperm, interleave
        try:
            return shuffle(rows)
        finally:
            torch.randperm = original

    compute_loss, trainer.reference_errors = trainer._compute_loss, []

    def loss_spy(model, batch):  # a micro-batch scored without TRL's reference pass: its reference against the true one
        skipped = "ref_per_token_logps" not in batch
        loss = compute_loss(model, batch)
        if skipped:
            error = batch["ref_per_token_logps"] - trainer.reference_logps(batch)
            trainer.reference_errors.append(float(error.abs().max()))
        return loss

    trainer._compute_loss = loss_spy
    trainer._prepare_inputs, trainer._scored, shared_update.group_rows = prepare_spy, scored_spy, regroup_spy
    grpo_trainer.shuffle_sequence_dict = splitting_shuffle
    try:
        result = run_trainer(config, trainer, parts)
    finally:
        shared_update.group_rows, grpo_trainer.shuffle_sequence_dict = regroup, shuffle
    trainer.micro_batches = micro_batches
    return config, result, captured, trainer.processing_class, trainer.shared_prefix_chunks, trainer


def test_two_iterations_log_rewards_and_change_the_lora(trained):
    from safetensors.torch import load_file

    config, result, _, _, (shared, whole), _ = trained
    assert shared > 0 and whole == 0  # the update scored the rows' shared system prompt once per micro-batch
    rows = [json.loads(line) for line in result.log.read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert [r["rollouts"] for r in rows] == [4, 8]
    for r in rows:
        assert 0.0 <= r["mean_reward"] <= 1.0 and r["kl"] is not None and r["loss"] is not None
        assert set(r["reward_components"]) == {"length", "mentions_order"} and r["hinted"] == 2
    assert result.reward_curve is not None and result.reward_curve.exists()
    weights = load_file(str(result.adapter / "adapter_model.safetensors"))
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and any(float(v.abs().max()) > 0 for v in lora_b)  # peft starts every lora_B at zero
    assert weights[next(k for k in weights if "lora_A" in k)].shape[0] == config.lora_rank


def test_a_fresh_adapter_is_its_own_kl_reference_until_its_first_step(trained):
    """Iteration 1 (every lora_B still zero) runs no reference pass: each micro-batch's
    reference is the policy's own log-probabilities, equal to the base model's, and
    the KL logged is 0. Iteration 2, after a step, takes TRL's reference pass."""
    config, result, captured, _, _, trainer = trained
    first, second = captured[0][0], captured[1][0]
    assert "ref_per_token_logps" not in first and "ref_per_token_logps" in second
    assert trainer.reference_passes_skipped == 1
    assert len(trainer.reference_errors) == trainer.args.steps_per_generation  # iteration 1's micro-batches, no more
    assert max(trainer.reference_errors) < 1e-5
    rows = [json.loads(line) for line in result.log.read_text().splitlines()]
    assert rows[0]["kl"] == 0.0 and rows[1]["kl"] > 0.0
    # a batch without its reference whose loss comes after a step: the reference is computed then, and it is
    # TRL's own (iteration 2's, from TRL's pass; the base model has not changed since, only the LoRA)
    import torch

    batch = {key: value for key, value in second.items() if key != "ref_per_token_logps"}  # (its tokens' table is kept)
    type(trainer)._compute_loss(trainer, trainer.model, batch)
    assert float((batch["ref_per_token_logps"] - second["ref_per_token_logps"]).abs().max()) < 1e-4  # (float rounding)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        policy = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, batch["completion_ids"].size(1))[
            0
        ]
    assert float((policy - batch["ref_per_token_logps"]).abs().max()) > 1e-3  # the trained policy is not its reference


def test_each_micro_batch_is_one_group_and_only_sampled_tokens_are_scored(trained):
    """The update's micro-batches (K rows each) hold one group's prompt after TRL's
    shuffle (here one that parts every group), and every pass scores the sampled tokens only (fewer than the
    completion's real tokens: the user's turn between replies is left out)."""
    *_, trainer = trained
    assert len(trainer.micro_batches) == 4  # 2 iterations x (G x K / micro-batch = 2)
    assert all(len(prompts) == 1 for prompts in trainer.micro_batches)
    assert trainer.shuffled == [[2, 2], [2, 2]]  # (as TRL's shuffle left them: two groups in every micro-batch)
    assert trainer.scored_seen and all(trainer.scored_seen)


def test_training_batch_gives_no_loss_weight_to_hint_or_environment_tokens(trained):
    _, _, captured, tokenizer, _, _ = trained
    assert len(captured) == 2
    for out, outcomes, batch in captured:
        weights = out["completion_mask"] * out["tool_mask"]  # TRL's loss mask
        for row, outcome in enumerate(outcomes):
            turns = outcome.played.tokens.turns
            sampled = [t for turn in turns for t in turn.completion_ids]
            completion = out["completion_ids"][row]
            weighted = completion[weights[row].bool()].tolist()
            assert weighted == sampled  # exactly the tokens the model sampled, in order
            unweighted = tokenizer.decode(completion[(1 - weights[row]).bool() & out["completion_mask"][row].bool()])
            if len(turns) > 1:  # the user's answer sits between the turns, without weight
                assert "Can you tell me more?" in unweighted
                assert "Can you tell me more?" not in tokenizer.decode(weighted)
            prompt = tokenizer.decode(out["prompt_ids"][row][out["prompt_mask"][row].bool()])
            assert HINT not in prompt and HINT not in tokenizer.decode(weighted)
            own_prompt = tokenizer.decode(turns[0].prompt_ids)
            if batch["hinted"][row]:
                assert HINT in own_prompt  # played with the hint, updated without it
                mate = next(r for r in range(len(outcomes)) if r // 2 == row // 2 and not batch["hinted"][r])
                assert batch["prompt_ids"][row] == batch["prompt_ids"][mate]
            else:
                assert HINT not in own_prompt


def test_saved_adapter_reloads_through_local_hf_and_changes_generations(trained):
    from trace_gym.llm import GenerationRequest, make_backend

    _, result, _, _, _, _ = trained
    backend = make_backend("smollm2-135m-instruct", adapters={"trained": str(result.adapter)})
    prompts = [
        [
            {"role": "system", "content": "You are a retail support agent."},
            {"role": "user", "content": f"Hi! Where is my order #W{n}?"},
        ]
        for n in (1234567, 7654321)
    ]
    requests = [GenerationRequest(messages=m, max_new_tokens=24, adapter=a) for m in prompts for a in (None, "trained")]
    base_a, tuned_a, base_b, tuned_b = backend.complete(requests)
    assert (
        base_a.tokens.completion_ids != tuned_a.tokens.completion_ids
        or base_b.tokens.completion_ids != tuned_b.tokens.completion_ids
    )


def test_bf16_weights_train_a_float32_lora_that_reloads_and_changes_generations(tmp_path):
    """--dtype bfloat16 on CPU (``auto`` picks it where the CPU has bf16 instructions;
    this test runs it on any CPU): bf16 weights, a float32 LoRA and optimizer, TRL's
    mixed precision off, finite KL and loss, and the adapter moves and reloads. A tiny
    random model with the embedded tokenizer: the dtype's plumbing does not depend on
    the model's size, and a CPU without bf16 instructions runs the 135M model's bf16
    backward: in `make test` it took 260 s on an AVX2-only machine, 19 s on one with bf16."""
    import torch
    from families import tiny_model_folder
    from safetensors.torch import load_file

    from trace_gym.llm import GenerationRequest, make_backend
    from trace_gym.training import build_trainer, run_trainer

    folder = tiny_model_folder(tmp_path / "tiny", layers=2, init=0.5)
    config = tiny_config(tmp_path / "run", model=f"hf:{folder}", dtype="bfloat16")
    trainer, parts = build_trainer(config, progress=False)
    assert not trainer.args.bf16 and trainer.args.use_cpu
    weights = {p.dtype for n, p in trainer.model.named_parameters() if "lora_" not in n}
    lora = {p.dtype for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert weights == {torch.bfloat16} and lora == {torch.float32}
    result = run_trainer(config, trainer, parts)
    rows = [json.loads(line) for line in result.log.read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["dtype"] == "bfloat16" and math.isfinite(r["kl"]) and math.isfinite(r["loss"]) for r in rows)
    saved = load_file(str(result.adapter / "adapter_model.safetensors"))
    assert {v.dtype for v in saved.values()} == {torch.float32}
    assert any(float(v.abs().max()) > 0 for k, v in saved.items() if "lora_B" in k)
    backend = make_backend(f"hf:{folder}", adapters={"trained": str(result.adapter)})
    prompt = [
        {"role": "system", "content": "You are a retail support agent."},
        {"role": "user", "content": "Hi! Where is my order #W1234567?"},
    ]
    base, tuned = backend.complete(
        [GenerationRequest(messages=prompt, max_new_tokens=24, adapter=a, temperature=0.0) for a in (None, "trained")]
    )
    assert base.tokens.completion_ids != tuned.tokens.completion_ids


def test_gradient_checkpointing_keeps_the_shared_prefix_update(tmp_path):
    """``gradient_checkpointing`` (the GPU example's setting): the layers are
    checkpointed the non-reentrant way and every pass of the update still scores
    the rows' shared prompt once (tests/test_shared_update.py holds its values and
    gradients to the rows run whole)."""
    from trace_gym.training import build_trainer, run_trainer

    config = tiny_config(tmp_path / "run", gradient_checkpointing=True, iterations=1)
    trainer, parts = build_trainer(config, progress=False)
    assert trainer.args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    result = run_trainer(config, trainer, parts)
    assert trainer.model.base_model.model.model.layers[0].gradient_checkpointing
    shared, whole = trainer.shared_prefix_chunks
    assert shared > 0 and whole == 0
    (row,) = [json.loads(line) for line in result.log.read_text().splitlines()]
    assert math.isfinite(row["loss"]) and math.isfinite(row["kl"])


def test_a_resume_over_changed_env_code_says_so_and_records_from_which_iteration(tmp_path, monkeypatch, capsys):
    """A resumed run checks its settings; the env's code it cannot hold still, so
    run.json records the code's hashes from each iteration they changed at, and
    the resume says so in one line (the learning curve once went on over a new env)."""
    import shutil

    from trace_gym.training import trainer

    registry = tmp_path / "registry"
    shutil.copytree(FIXTURE_ENVS / "two-replies", registry / "two-replies")
    monkeypatch.setenv("TRACE_GYM_REGISTRY_PATH", str(registry))
    config, out = tiny_config(tmp_path / "run"), tmp_path / "run"
    out.mkdir()
    first = trainer._env_code_history(config, out, 0, resume=False)
    assert [h["from_iteration"] for h in first] == [1] and set(first[0]["hashes"]) == {TWO_REPLIES}
    (out / "run.json").write_text(json.dumps({"env_code": first}))
    assert trainer._env_code_history(config, out, 3, resume=True) == first  # unchanged: nothing said
    assert capsys.readouterr().err == ""
    code = registry / "two-replies" / "env.py"
    code.write_text(code.read_text() + "\n# a fix\n")
    history = trainer._env_code_history(config, out, 3, resume=True)
    assert [h["from_iteration"] for h in history] == [1, 4] and history[1]["hashes"] != first[0]["hashes"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the code of {TWO_REPLIES} changed since iteration 1" in err


def test_kill_9_during_iteration_2_then_resume(tmp_path):
    from trace_gym.training.trainer import last_checkpoint

    out = tmp_path / "run"
    exe = str(Path(sys.executable).parent / "trace-gym")
    args = [
        exe,
        "train",
        "--env",
        TWO_REPLIES,
        "--out",
        str(out),
        "--iterations",
        "2",
        "--groups",
        "1",
        "--rollouts-per-group",
        "2",
        "--max-new-tokens",
        "8",
        "--lr",
        "1e-3",
        "--threads",
        "1",
        "--hint-share",
        "0",
        "--train-unvalidated",
        TWO_REPLIES,
        "--train-anyway",  # what is tested is the resume: 8-token replies may tie, and calibration would refuse
    ]
    env = {**os.environ, "TRACE_GYM_REGISTRY_PATH": str(FIXTURE_ENVS)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 900
    try:
        while last_checkpoint(out / "checkpoints") is None:  # what a resume starts from, written whole
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "iteration 1 did not finish in 15 minutes"
            time.sleep(0.1)
        # iteration 2 is under way: killed at once (an iteration can take under two seconds on an idle machine)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "checkpoints" / "checkpoint-2").exists() and not (out / "adapter").exists()
    assert [json.loads(line)["iteration"] for line in (out / "train_log.jsonl").read_text().splitlines()] == [1]
    resumed = subprocess.run([*args, "--resume", "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["resumed_from"] == 1 and result["iterations"] == 2 and result["rollouts"] == 4
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert rows[1]["elapsed_s"] >= rows[0]["elapsed_s"]
    assert (out / "adapter" / "adapter_model.safetensors").exists()


def test_pool_replaces_a_dead_worker_retries_once_then_counts_the_episode_failed():
    from trace_gym.agents import make_agent
    from trace_gym.llm import make_backend
    from trace_gym.registry import make
    from trace_gym.rollout import Episode
    from trace_gym.training.pool import EnvPool

    backend = make_backend("smollm2-135m-instruct")
    pool = EnvPool(lambda env_id: make(env_id), recycle_after=2)
    episodes = [Episode(None, 0, 11, env_seed=5), Episode(None, 1, 12, env_seed=5), Episode(None, 2, 13, env_seed=5)]
    agents = [make_agent("llm", model=backend, temperature=1.0, max_new_tokens=6) for _ in episodes]
    attempts = {0: 0, 1: 0}

    def configure(env, i):
        core = env.unwrapped
        if i == 0:  # dies mid-episode on the first attempt only
            attempts[0] += 1
            if attempts[0] == 1:
                step = core._step

                def dying_step(action):
                    core.worker._channel.kill()
                    return step(action)

                core._step = dying_step
        elif i == 1:  # dead before every reset
            attempts[1] += 1
            core.worker._channel.kill()

    try:
        outcomes = pool.play(TWO_REPLIES, episodes, agents, configure)
        assert [o.attempts for o in outcomes] == [2, 2, 1]
        assert not outcomes[0].failed and outcomes[0].played.trajectory.reward_info
        assert outcomes[1].failed and "reset" in outcomes[1].failure and "Sandbox" in outcomes[1].failure
        assert not outcomes[2].failed
        assert pool.stats.retried == 2 and pool.stats.failed == 1 and pool.stats.replaced >= 3
        kept = pool.envs[TWO_REPLIES][0]  # the fresh instance that replayed episode 0: one episode so far
        outcomes = pool.play(TWO_REPLIES, episodes[2:], agents[2:])  # the next iteration reuses the pool
        assert not outcomes[0].failed and pool.envs[TWO_REPLIES][0] is kept and pool.stats.recycled == 0
        pool.play(TWO_REPLIES, episodes[2:], agents[2:])  # two episodes played: recycled first
        assert pool.envs[TWO_REPLIES][0] is not kept and pool.stats.recycled == 1
    finally:
        pool.close()


def test_grpo_on_the_target_baseline_runs_one_iteration(tmp_path):
    """The GRPO-on-target baseline: the same trainer on a τ² target's tasks (in-process,
    scripted user); targets take no hint, so every rollout is hint-free. Here with
    TRL's own update passes (shared_prefix_update off), which the switch must give."""
    pytest.importorskip("tau2")
    from trace_gym.training import train

    config = tiny_config(
        tmp_path / "run",
        env_ids=["trace/tau2-mock-v0"],
        groups=1,
        iterations=1,
        max_new_tokens=8,
        max_steps=2,
        hint_share=0.5,
        shared_prefix_update=False,
    )
    trainers = []
    result = train(config, progress=False, on_trainer=trainers.append)
    assert trainers[0].shared_prefix_chunks == (0, 0)  # never entered the shared path
    [row] = [json.loads(line) for line in result.log.read_text().splitlines()]
    assert row["rollouts"] == 2 and row["hinted"] == 0 and row["failed_episodes"] == 0
    assert row["mean_reward"] is not None and (result.adapter / "adapter_model.safetensors").exists()


def test_a_finished_run_gives_its_policy_back(tmp_path):
    """The pipeline's train stage runs its jobs one after another in one process: each
    must leave the device as it found it, without waiting for a collection."""
    import weakref

    from trace_gym.training import train

    model = []
    train(
        tiny_config(tmp_path / "run", iterations=1),
        progress=False,
        on_trainer=lambda t: model.append(weakref.ref(t.model)),
    )
    assert model[0]() is None


def test_independent_jobs_train_one_process_per_device_at_once(tmp_path):
    """The train stage's jobs spread over the visible GPUs: here two stand-in devices on
    the CPU, each a process that sees only its own name in CUDA_VISIBLE_DEVICES and trains
    its jobs in turn; a job that fails stops the stage in one line once all have stopped.
    What is checked is where the jobs run, not what they learn: a tiny random model
    (each of the five jobs loaded the 135M model before, 90 s of an AVX2 CPU's suite)."""
    from families import tiny_model_folder

    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.config import TrainingError
    from trace_gym.training.jobs import Job, train_jobs

    model = f"hf:{tiny_model_folder(tmp_path / 'tiny')}"

    def tiny_job(name: str) -> Job:
        return Job(name, tiny_config(tmp_path / name, iterations=1, model=model), False)

    jobs = [tiny_job(name) for name in ("a", "b", "c")]
    said: list[str] = []
    outcomes = train_jobs(jobs, ["3", "5"], said.append, registry=[str(FIXTURE_ENVS)])
    assert {name: o.device for name, o in outcomes.items()} == {"a": "3", "b": "5", "c": "3"}  # job i on device i mod 2
    assert all(o.not_trained is None and o.failed is None for o in outcomes.values())
    for name in "abc":
        assert (tmp_path / name / "adapter" / "adapter_config.json").exists()
        assert len((tmp_path / name / "train_log.jsonl").read_text().splitlines()) == 1
    assert said[0] == "training on GPU 3: a, c; GPU 5: b"

    broken = GRPOTrainingConfig(
        **{**tiny_config(tmp_path / "d", model=model).as_dict(), "env_ids": ["trace/no-such-env-v0"]}
    )
    later = [tiny_job(name) for name in ("e", "f")]
    with pytest.raises(TrainingError, match=r"^d \(GPU 3\): .*no-such-env"):  # once GPU 5 has trained e
        train_jobs([Job("d", broken, False), *later], ["3", "5"], said.append)
    assert (tmp_path / "e" / "adapter").exists() and not (tmp_path / "f").exists()  # GPU 3 stopped at d
