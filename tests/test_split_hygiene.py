"""No stage but evaluation plays a held-out task (issues 28 and 30), down to a whole run.

Every τ² episode started in this process is recorded (task id and split) by a
thin wrapper around the real ``Tau2Env._start``; each stage below then runs for
real, and the test fails if any of its tasks is in the test split evaluation
scores. Found this way: the synthesis prompt's live tool results came from the
target's default split, which for τ² is ``test``.
"""

from __future__ import annotations

import pytest

from trace_gym.registry import get_entry, make

RETAIL = "trace/tau2-retail-v0"


@pytest.fixture
def started(monkeypatch):
    from trace_gym.targets.tau2 import Tau2Env

    seen: list[tuple[str, str]] = []
    real = Tau2Env._start

    def recording(self, seed, options):
        start = real(self, seed, options)
        seen.append((self.split, self._task.id))
        return start

    monkeypatch.setattr(Tau2Env, "_start", recording)
    return seen


def held_out() -> set[str]:
    env = make(RETAIL, split="test")
    try:
        return set(env.unwrapped.task_ids)
    finally:
        env.close()


def test_the_synthesis_prompt_shows_train_tasks_only(started):
    from trace_gym.synthesis.prompt import target_context

    context = target_context(get_entry(RETAIL))
    assert context.tool_results and started
    assert {split for split, _ in started} == {"train"}
    assert not {task for _, task in started} & held_out()


def test_training_on_the_target_plays_train_tasks_only(started):
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.trainer import _env_plan

    tasks, kwargs, _ = _env_plan(GRPOTrainingConfig(env_ids=[RETAIL], out="x"))
    assert kwargs[RETAIL]["split"] == "train" and not set(tasks[RETAIL]) & held_out()
    env = make(RETAIL, **kwargs[RETAIL])
    try:
        env.reset(options={"task_id": tasks[RETAIL][0]})
    finally:
        env.close()
    assert started and {split for split, _ in started} == {"train"}


def test_training_logs_the_tasks_and_seeds_it_played(monkeypatch):
    """Each iteration's log row names every group it played (draws included), so a
    run's output says which tasks and seeds it trained on."""
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.rollouts import EnvRolloutFunc, episode_key

    def rows_of(reward):
        def play(self, env_id, keys, group_ids, backend, rows, record):
            for g in group_ids:
                for s in range(self.config.rollouts_per_group):
                    rows[g * self.config.rollouts_per_group + s] = {
                        "prompt_ids": [1],
                        "completion_ids": [2],
                        "logprobs": [0.0],
                        "env_mask": [1],
                        "env_reward": reward if s else 0.0,
                        "hinted": False,
                    }

        return play

    monkeypatch.setattr(EnvRolloutFunc, "_play_env", rows_of(1.0))
    rollout = EnvRolloutFunc(GRPOTrainingConfig(env_ids=[RETAIL], out="x", spot_check=False), pool=None, tokenizer=None)
    rollout.play([episode_key(RETAIL, task="12"), episode_key("trace/x-v0", seed=77)], backend=None)
    summary = rollout.records[-1].summary()
    assert summary["played"] == [f"{RETAIL}|task 12", "trace/x-v0|seed 77"]


def test_a_config_whose_stages_would_play_a_held_out_task_is_refused_in_one_line(tmp_path):
    """A rollout or GEPA split that holds a held-out task (the test split, or τ²'s ``base``,
    every task) and given trajectories with one are refused before any work; the train
    split and trajectories of train tasks pass."""
    from conftest import run_cli

    from trace_gym.config import ConfigError
    from trace_gym.errors import TraceGymError
    from trace_gym.pipeline import check_no_held_out_task, config_from_data

    def config(**tables):
        made = config_from_data({"run": {"target": RETAIL, "dir": str(tmp_path / "run")}, **tables})
        check_no_held_out_task(made)  # (what load_config and run_pipeline do before a run)
        return made

    # a finished run's config is read without it: evaluate, route and serve play nothing it guards
    config_from_data({"run": {"target": RETAIL, "dir": str(tmp_path / "old")}, "rollout": {"split": "base"}})

    for split in ("test", "base"):
        with pytest.raises(ConfigError, match=rf"\[rollout\] split: '{split}' holds \d+ of .* held-out 'test' tasks"):
            config(rollout={"split": split})
    with pytest.raises(ConfigError, match=r"\[gepa\] split: 'base' holds 40 of"):
        config(
            run={"target": RETAIL, "dir": str(tmp_path / "run"), "stages": ["rollout", "gepa"]},
            gepa={"split": "base", "budget": 20},
        )
    config(rollout={"split": "train"})
    config(gepa={"split": "base"})  # (no gepa stage in this run: nothing plays that split)

    mixed = tmp_path / "mixed.jsonl"
    task = sorted(held_out())[0]
    made = run_cli("rollout", "--env", RETAIL, "--agent", "oracle", "--task-ids", f"0,{task}", "--out", str(mixed),
                   "--no-progress")  # fmt: skip
    assert made.returncode == 0, made.stderr
    with pytest.raises(ConfigError, match=rf"\[rollout\] trajectories: episode .* plays task {task} of"):
        config(rollout={"trajectories": str(mixed)})
    config(
        rollout={"trajectories": str(mixed)}, run={"target": RETAIL, "dir": str(tmp_path / "r"), "stages": ["identify"]}
    )
    odd = tmp_path / "odd.jsonl"
    odd.write_text("[1, 2]\n" + mixed.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(TraceGymError, match=r"odd.jsonl:1 is not a trajectory record"):  # one line, the store's
        config(rollout={"trajectories": str(odd)})
    toml = tmp_path / "run.toml"
    toml.write_text(f'[run]\ntarget = "{RETAIL}"\ndir = "{tmp_path / "run"}"\n\n[rollout]\nsplit = "base"\n')
    result = run_cli("run", str(toml), "--check")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "only evaluation plays them" in result.stderr


WHOLE_RUN = """
[run]
target = "trace/tau2-retail-v0"
dir = "{run}"
stages = ["rollout", "identify", "synthesize", "train", "gepa", "evaluate"]

[policy]
model = "hf:{model}"
max_new_tokens = 8
batch = 4

[rollout]
tasks = 3
max_steps = 16
fallback = "oracle"

[identify.selection]
runs = 4
min_runs = 3
max_selected = 1

[train]
grpo_target = true

[train.grpo]
iterations = 1
groups = 1
rollouts_per_group = 2
max_new_tokens = 8
max_steps = 2
calibrate = false
train_anyway = true
max_draws = 1

[gepa]
reflection = "hf:{model}"
budget = 6
tasks = 4
val_tasks = 2
minibatch = 1
reflection_max_tokens = 16

[evaluate]
tasks = 2
max_steps = 16
methods = ["base", "trace", "grpo-target", "gepa"]
"""


@pytest.mark.slow
def test_a_whole_run_plays_held_out_tasks_in_evaluation_only(tmp_path, monkeypatch, started):
    """Every stage of `trace-gym run` for real (a tiny random model as the policy, so that each
    stage is fast): each τ² episode any stage starts is recorded with the stage that started
    it, and only evaluation's are of the test split; it plays its tasks."""
    from families import tiny_model
    from transformers import AutoTokenizer

    from trace_gym import pipeline
    from trace_gym.llm.embedded import ensure_embedded_model

    folder = tmp_path / "tiny"
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    stage_of: list[str] = []
    real = pipeline._run_stage

    def recording(config, state, stage, say):
        stage_of.append(stage)
        mark = len(started)
        try:
            real(config, state, stage, say)
        finally:
            started[mark:] = [(stage, *entry) for entry in started[mark:]]

    monkeypatch.setattr(pipeline, "_run_stage", recording)
    toml = tmp_path / "run.toml"
    toml.write_text(WHOLE_RUN.format(run=tmp_path / "run", model=folder))
    config = pipeline.load_config(toml)
    pipeline.run_pipeline(config, say=lambda _: None)
    assert stage_of == ["rollout", "identify", "synthesize", "train", "gepa", "evaluate"]
    by_stage: dict[str, set[tuple[str, str]]] = {}
    for entry in started:
        stage, split, task = entry if len(entry) == 3 else ("(before the stages)", *entry)
        by_stage.setdefault(stage, set()).add((split, task))
    held = held_out()
    # each of them played τ² episodes (training's: GRPO on the target, planned once a capability is selected)
    assert {"rollout", "train", "gepa", "evaluate"} <= set(by_stage), sorted(by_stage)
    for stage, played in by_stage.items():
        if stage == "evaluate":
            assert played and all(split == "test" and task in held for split, task in played)
        else:
            assert all(split == "train" and task not in held for split, task in played), stage


def test_a_target_that_cannot_list_its_splits_is_one_line(tmp_path, monkeypatch):
    from trace_gym.config import ConfigError
    from trace_gym.pipeline import check_no_held_out_task, config_from_data
    from trace_gym.pipeline import config as pipeline_config

    def broken(env_id):
        raise RuntimeError("data folder missing\nsecond line")

    monkeypatch.setattr(pipeline_config, "held_out_tasks", broken)
    made = config_from_data({"run": {"target": RETAIL, "dir": str(tmp_path)}, "rollout": {"split": "base"}})
    with pytest.raises(ConfigError, match=r"^\[run\] target: cannot list .* \(RuntimeError: data folder missing\)$"):
        check_no_held_out_task(made)
    check_no_held_out_task(config_from_data({"run": {"target": RETAIL, "dir": str(tmp_path)}}))  # train: not listed
