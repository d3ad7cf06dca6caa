"""GRPO training: the settings, the dataset plan, TRL's batch layout, the log on
resume, the env pool's failure handling and the CLI's one-line errors.
The runs themselves (model updates, kill -9 and --resume) are in test_training_run.py."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURE_ENVS, run_cli


@pytest.fixture(autouse=True, scope="module")
def fixture_registry():
    """The fixture envs (tests/fixtures/envs) are registered for this module only: set at import
    time, the variable leaked into every test of the session (pytest imports all modules).
    Module scope, so that the module's shared training runs see it too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACE_GYM_REGISTRY_PATH", str(FIXTURE_ENVS))
        yield


pytest.importorskip("trl")

from trace_gym.training import GRPOTrainingConfig, TrainingError  # noqa: E402
from trace_gym.training.log import TrainLog, plot_reward_curve  # noqa: E402
from trace_gym.training.rollouts import EnvRolloutFunc, IterationRecord, episode_key, groups_of, plan_groups  # noqa: E402

TWO_REPLIES = "trace/test-two-replies-v0"


def test_defaults_are_the_papers():
    config = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x")
    assert (config.lora_rank, config.groups, config.rollouts_per_group, config.learning_rate, config.iterations) == (
        32,
        4,
        4,
        1e-5,
        40,
    )
    assert config.clip_epsilon == 0.2 and config.kl_beta > 0
    assert 0.25 <= config.hint_share <= 0.5 and config.hinted_per_group == 1
    args = config.to_grpo_args()
    # one generation of G x K rollouts and one optimizer step per iteration
    assert args.num_generations == 4
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 16
    assert args.steps_per_generation == args.gradient_accumulation_steps
    assert args.max_steps == 40 and args.learning_rate == 1e-5 and args.beta == config.kl_beta and args.epsilon == 0.2
    assert args.use_cpu and not args.bf16 and args.optim == "adamw_torch"


def test_checkpointing_is_asked_for_by_the_installed_transformers_names():
    """transformers 5.x renamed ``gradient_checkpointing*`` to ``activation_checkpointing*``
    and warns at every run for the old names; older ones know only those."""
    import dataclasses
    import warnings

    from trace_gym.training.config import checkpointing

    @dataclasses.dataclass
    class OlderConfig:
        gradient_checkpointing: bool = True
        gradient_checkpointing_kwargs: dict | None = None

    assert checkpointing(OlderConfig, True) == {
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpointing.*deprecated")
        args = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x", gradient_checkpointing=True).to_grpo_args()
    assert args.gradient_checkpointing and args.gradient_checkpointing_kwargs == {"use_reentrant": False}


def test_training_hides_trls_own_deprecation_and_no_other_warning():
    """TRL reads ``is_gradient_checkpointing`` (deprecated by transformers 5.x) at every
    run; the user cannot act on it, so training does not show it, and shows the rest."""
    import warnings

    from trace_gym.llm.local.lora import without_checkpointing_deprecations

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with without_checkpointing_deprecations():
            warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
            warnings.warn("`gradient_checkpointing_enable` is deprecated and will be removed in v6.", FutureWarning)
            warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning)  # an argument of ours: shown
            warnings.warn("`something_else` is deprecated", FutureWarning)
            warnings.warn("`is_gradient_checkpointing` is deprecated", UserWarning)
    assert [(w.category, str(w.message)) for w in caught] == [
        (FutureWarning, "`gradient_checkpointing` is deprecated"),
        (FutureWarning, "`something_else` is deprecated"),
        (UserWarning, "`is_gradient_checkpointing` is deprecated"),
    ]


X86_CPUINFO = """processor	: 0
vendor_id	: AuthenticAMD
flags		: fpu sse2 avx2 avx512f avx512bw {extra}
"""
ARM_CPUINFO = """processor	: 0
Features	: fp asimd sve {extra}
CPU implementer	: 0x41
"""


@pytest.mark.parametrize(
    "cpuinfo, extra, native",
    [
        (X86_CPUINFO, "avx512_bf16", True),
        (X86_CPUINFO, "amx_bf16 amx_tile", True),
        (X86_CPUINFO, "", False),
        (ARM_CPUINFO, "bf16 i8mm", True),
        (ARM_CPUINFO, "", False),
        ("", "", False),
    ],
)
def test_auto_dtype_is_bf16_on_cuda_and_on_cpus_with_bf16_instructions(cpuinfo, extra, native):
    from trace_gym.llm.precision import cpu_flags, native_bf16

    flags = cpu_flags(cpuinfo.format(extra=extra))
    assert native_bf16(flags) is native
    config = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x")
    assert config.resolved_dtype(flags) == ("bfloat16" if native else "float32")
    assert GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x", device="cuda").resolved_dtype(flags) == "bfloat16"
    for fixed in ("float32", "bfloat16"):
        assert GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x", dtype=fixed).resolved_dtype(flags) == fixed
    # TRL's bf16 (autocast mixed precision) stays off on CPU whatever the weights are: their dtype is the precision
    assert not GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x", dtype="bfloat16").to_grpo_args().bf16


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rollouts_per_group": 1}, "at least 2"),
        ({"hint_share": 1.0}, "hint-free"),
        ({"hint_share": 0.9, "rollouts_per_group": 2}, "hints all"),
        ({"groups": 0}, "groups"),
        ({"device": "tpu"}, "device"),
        ({"loss_type": "gpro"}, "loss_type must be one of grpo"),
        ({"micro_batch": 3}, "micro_batch"),
        ({"dtype": "float16"}, "dtype must be one of auto, float32, bfloat16"),
        ({"env_ids": []}, "--env"),
    ],
)
def test_bad_settings_are_refused(change, message):
    with pytest.raises(TrainingError, match=message):
        GRPOTrainingConfig(**{"env_ids": [TWO_REPLIES], "out": "x", **change}).check()


def test_plan_mixes_envs_group_by_group_and_cycles_target_tasks():
    config = GRPOTrainingConfig(env_ids=["a/x-v0", "b/y-v0", "t/z-v0"], out="x", iterations=3, groups=4)
    keys = [json.loads(k) for k in plan_groups(config, {"a/x-v0": None, "b/y-v0": None, "t/z-v0": ["t1", "t2"]})]
    assert len(keys) == 12 and len(set(map(json.dumps, keys))) == 10  # a target's 2 tasks repeat, seeds never do
    assert [k["env"] for k in keys[:4]] == ["a/x-v0", "b/y-v0", "t/z-v0", "a/x-v0"]
    assert {k["task"] for k in keys if k["env"] == "t/z-v0"} == {"t1", "t2"}
    assert plan_groups(config, {"a/x-v0": None, "b/y-v0": None, "t/z-v0": ["t1", "t2"]}) == [
        json.dumps(k, sort_keys=True) for k in keys
    ]
    with pytest.raises(TrainingError, match="no tasks"):
        plan_groups(config, {"a/x-v0": None, "b/y-v0": None, "t/z-v0": []})


def test_groups_follow_trls_repeat_layout():
    a, b = episode_key("e", seed=1), episode_key("e", seed=2)
    assert groups_of([a, a, b, b], 2) == [a, b]
    with pytest.raises(TrainingError, match="in a row"):
        groups_of([a, b, a, b], 2)
    with pytest.raises(TrainingError, match="multiple"):
        groups_of([a, a, b], 2)


def test_trl_hands_rollout_func_each_prompt_k_times_in_a_row():
    """Empirical, on TRL's own sampler as GRPOTrainer configures it."""
    from trl.trainer.utils import RepeatSampler

    config = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x", iterations=3, groups=4)
    args = config.to_grpo_args()
    prompts = [f"p{i}" for i in range(config.iterations * config.groups)]
    sampler = RepeatSampler(
        prompts,
        mini_repeat_count=args.num_generations,
        batch_size=args.per_device_train_batch_size * args.steps_per_generation // args.num_generations,
        repeat_count=args.num_iterations * args.steps_per_generation,
        seed=0,
    )
    order = [prompts[i] for i in sampler]
    generation = order[: config.rollouts_per_iteration]  # the first generation batch: one iteration
    assert len(groups_of(generation, config.rollouts_per_group)) == config.groups


def test_log_keeps_each_iteration_once_up_to_the_checkpoint(tmp_path):
    log = TrainLog(tmp_path / "train_log.jsonl")
    for i in (1, 2, 3):
        log.append({"iteration": i, "mean_reward": 0.1 * i, "rollouts": 16 * i})
    with log.path.open("a") as f:
        f.write('{"iteration": 4, "mean_rew')  # a line cut short by kill -9
    assert [r["iteration"] for r in log.truncate_to(2)] == [1, 2]
    assert [r["iteration"] for r in log.read()] == [1, 2]
    assert plot_reward_curve(log.read(), tmp_path / "curve.png").stat().st_size > 1000
    assert plot_reward_curve([{"iteration": 1, "mean_reward": None, "rollouts": 4}], tmp_path / "none.png") is None


def test_constant_reward_groups_and_void_rows_are_counted():
    record = IterationRecord(
        rewards=[0.5, 0.5, 0.2, None], groups=[[0.5, 0.5], [0.2, None]], first_rewards=[0.5, 0.5, 0.2, None]
    )
    summary = record.summary()
    assert summary["mean_reward"] == pytest.approx(0.4)
    assert summary["constant_reward_groups"] == 1.0  # a group with one scored rollout cannot be compared either


def test_a_void_row_carries_no_loss_weight():
    class Tok:
        eos_token_id = 2

    rollout = EnvRolloutFunc(GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x"), pool=None, tokenizer=Tok())
    record = IterationRecord()
    row = rollout._void_row([5, 6], "step: SandboxCrashed: gone", record)
    assert row["env_mask"] == [0] and row["env_reward"] is None and record.failed == ["step: SandboxCrashed: gone"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "trace/nope-v0"], "unknown env id"),
        (["--env", TWO_REPLIES, "--rollouts-per-group", "1"], "at least 2"),
        (["--env", TWO_REPLIES, "--use-vllm"], "vllm is not installed"),
        (["--env", TWO_REPLIES, "--device", "cuda"], "no CUDA device"),
        (["--env", TWO_REPLIES, "--model", "openai:gpt-4o"], "cannot train"),
        (["--env", TWO_REPLIES, "--model", "hf:/no/such/folder"], "no local model folder"),
        (["--env", TWO_REPLIES, "--dtype", "half"], "invalid choice: 'half'"),
        (["--env", TWO_REPLIES, "--no-trust"], "has no passing, current validation report (unvalidated)"),
    ],
)
def test_cli_mistakes_are_one_line(tmp_path, args, message):
    if "--use-vllm" in args:
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:
            pytest.skip("vllm is installed here: --use-vllm is passed through")
    if "cuda" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is available here")
    # the fixture envs carry no validation report: named, except where that refusal is the case
    args = args[:-1] if args[-1] == "--no-trust" else [*args, "--train-unvalidated", TWO_REPLIES]
    result = run_cli("train", "--out", str(tmp_path / "run"), *args, env={"TRACE_GYM_REGISTRY_PATH": str(FIXTURE_ENVS)})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_refuses_to_overwrite_a_run_and_to_resume_nothing(tmp_path):
    env = {"TRACE_GYM_REGISTRY_PATH": str(FIXTURE_ENVS)}
    result = run_cli("train", "--env", TWO_REPLIES, "--out", str(tmp_path / "empty"), "--resume", env=env)
    assert result.returncode == 2 and "nothing to resume" in result.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "train_log.jsonl").write_text('{"iteration": 1}\n')
    result = run_cli(
        "train", "--env", TWO_REPLIES, "--out", str(tmp_path / "used"), "--train-unvalidated", TWO_REPLIES, env=env
    )
    assert result.returncode == 2 and "already holds a training run" in result.stderr
    assert (tmp_path / "used" / "train_log.jsonl").read_text() == '{"iteration": 1}\n'  # never lost


@pytest.mark.parametrize(
    "saved, asked, continues_in",
    [
        ({"dtype": "float32"}, "auto", "float32"),  # started in float32 here or elsewhere: auto does not switch it
        ({"dtype": "bfloat16"}, "auto", "bfloat16"),
        ({}, "auto", "float32"),  # a run.json from before the dtype setting: CPU runs were float32
        ({"device": "cuda"}, "auto", "bfloat16"),
        ({"dtype": "float32"}, "float32", "float32"),
        ({"dtype": "float32"}, "bfloat16", None),  # refused
    ],
)
def test_resume_continues_in_the_dtype_the_run_started_in(tmp_path, saved, asked, continues_in):
    from trace_gym.training.trainer import _check_run_folder

    device = saved.get("device", "cpu")
    first = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out=str(tmp_path), device=device)
    (tmp_path / "run.json").write_text(json.dumps({**first.as_dict(), "dtype": None, **saved}))
    config = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out=str(tmp_path), device=device, dtype=asked)
    if continues_in is None:
        with pytest.raises(TrainingError, match="dtype differs"):
            _check_run_folder(config, resume=True)
    else:
        assert _check_run_folder(config, resume=True) == continues_in


@pytest.mark.parametrize(
    "saved, now, said, value",
    [(True, "0", "strict tool calls", "1"), (None, "1", "strict tool calls", "0"), ("ids", "1", "grounded ids", "ids")],
)
def test_resume_refuses_to_mix_strict_and_free_tool_call_decoding(tmp_path, monkeypatch, saved, now, said, value):
    from trace_gym.training.trainer import _check_run_folder

    config = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out=str(tmp_path))
    (tmp_path / "run.json").write_text(json.dumps({**config.as_dict(), "dtype": "float32", "strict_tools": saved}))
    monkeypatch.setenv("TRACE_GYM_STRICT_TOOLS", now)
    with pytest.raises(TrainingError, match=f"{said}; set TRACE_GYM_STRICT_TOOLS={value} to continue"):
        _check_run_folder(config, resume=True)
    monkeypatch.setenv("TRACE_GYM_STRICT_TOOLS", value)
    assert _check_run_folder(config, resume=True) == "float32"


def test_bf16_asked_on_a_cpu_without_bf16_instructions_is_warned_of(monkeypatch, capsys):
    from trace_gym.training import trainer

    monkeypatch.setattr(trainer, "native_bf16", lambda: False)
    for dtype, warned in (("bfloat16", True), ("float32", False), ("auto", False)):
        trainer._check_machine(GRPOTrainingConfig(env_ids=[TWO_REPLIES], out="x", dtype=dtype))
        assert ("emulated, slower than float32" in capsys.readouterr().err) is warned


def test_a_resumed_run_counts_its_episodes_on_from_the_last_total(tmp_path):
    """Each log line's episodes_played is a running total: a resumed run goes on from the last
    one (summing them counted the early iterations again at every resume)."""
    from types import SimpleNamespace

    from trace_gym.training.trainer import _IterationLog

    previous = [
        {"iteration": 1, "episodes_played": 20, "elapsed_s": 10.0},
        {"iteration": 2, "episodes_played": 36, "elapsed_s": 20.0},
        {"iteration": 3, "episodes_played": 64, "elapsed_s": 30.0},
    ]
    record = SimpleNamespace(summary=lambda: {"episodes_played": 16, "mean_reward": 0.1})
    rollout = SimpleNamespace(records=[record], pool=SimpleNamespace(stats=SimpleNamespace()))
    log = TrainLog(tmp_path / "train_log.jsonl")
    config = GRPOTrainingConfig(env_ids=[TWO_REPLIES], out=str(tmp_path), iterations=5)
    resumed = _IterationLog(config, rollout, log, 3, previous, progress=False)
    resumed.write(4, {"loss": 0.0})
    assert log.read()[-1]["episodes_played"] == 64 + 16
