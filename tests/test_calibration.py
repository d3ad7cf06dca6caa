"""Calibration of an env to the policy before training, dynamic sampling of
constant groups during it, and ``train``'s refusals. The fixture env
``trace/test-levels-v0`` pays a reward fixed by its level, the seed and the hint
(never by the agent), so what calibration and redraws must do is known; the
episodes are real (the embedded model plays them in the sandbox)."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURE_ENVS, run_cli


@pytest.fixture(autouse=True, scope="module")
def fixture_registry():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACE_GYM_REGISTRY_PATH", str(FIXTURE_ENVS))
        yield


pytest.importorskip("trl")

from trace_gym.training import GRPOTrainingConfig, TrainingError  # noqa: E402
from trace_gym.training.calibration import (  # noqa: E402
    Calibration,
    LevelFigures,
    calibrate_env,
    check_trainable,
    load_calibrations,
    save_calibrations,
)
from trace_gym.training.rollouts import IterationRecord, informative, parse_key, redraw_key  # noqa: E402

LEVELS = "trace/test-levels-v0"
ENV = {"TRACE_GYM_REGISTRY_PATH": str(FIXTURE_ENVS)}
UNVALIDATED = ("--train-unvalidated", LEVELS)  # the fixture has no validation report


def config(**change):
    settings = dict(
        env_ids=[LEVELS],
        out="x",
        groups=4,
        rollouts_per_group=2,
        hint_share=0.5,
        max_new_tokens=4,
        dtype="float32",
        torch_threads=1,
        train_unvalidated=[LEVELS],
    )  # a fixture: no validation report
    return GRPOTrainingConfig(**{**settings, **change})


def level_one(seed: int, hinted: bool) -> float:  # the fixture's reward at level 1
    return 0.5 if seed % 3 == 0 else (0.75 if hinted else 0.25)


def fixture_play(cfg):
    """What the fixture env pays, group by group (the agent does not matter): the calibration logic's input."""

    def play(level, keys):
        groups = []
        for key in keys:
            seed = parse_key(key)["seed"]
            groups.append(
                [
                    {0: 1.0, 2: 0.0}.get(level, level_one(seed, s < cfg.hinted_per_group))
                    for s in range(cfg.rollouts_per_group)
                ]
            )
        return groups

    return play


def test_calibration_moves_the_level_towards_the_band_and_records_every_level():
    cfg = config(level=0)
    calibration = calibrate_env(cfg, LEVELS, None, 3, fixture_play(cfg), say=lambda m: None)
    assert [f.level for f in calibration.levels] == [0, 1]  # 1.0 is above the band: one level harder
    assert calibration.level == 1 and calibration.chosen.mean_reward == pytest.approx(
        sum(map(sum, calibration.chosen.groups)) / 8
    )
    assert calibration.episodes == 16 and calibration.levels[0].all_success_share == 1.0
    cfg = config(level=2)
    calibration = calibrate_env(cfg, LEVELS, None, 3, fixture_play(cfg), say=lambda m: None)
    assert [f.level for f in calibration.levels][:2] == [2, 1] and calibration.levels[0].all_zero_share == 1.0


def test_levels_that_tie_choose_the_one_towards_the_band():
    from trace_gym.training.calibration import LevelFigures, decide

    zero = [[0.0] * 4, [0.0] * 4]
    level, trainable, _ = decide([LevelFigures(1, zero, 8), LevelFigures(0, zero, 8)], [0.2, 0.6], 0.5)
    assert level == 0 and not trainable  # nothing informative below the band: the easier level
    full = [[1.0] * 4, [1.0] * 4]
    level, _, _ = decide([LevelFigures(1, full, 8), LevelFigures(2, full, 8)], [0.2, 0.6], 0.5)
    assert level == 2  # all solved above the band: the harder one


def test_an_env_no_level_makes_informative_is_untrainable_and_refused():
    cfg = config(hint_share=0.0)  # without hints every group of the fixture is constant
    calibration = calibrate_env(cfg, LEVELS, None, 3, fixture_play(cfg), say=lambda m: None)
    assert not calibration.trainable and "informative" in calibration.reason
    with pytest.raises(TrainingError, match="untrainable"):
        check_trainable(calibration, cfg)
    check_trainable(calibration, config(hint_share=0.0, train_anyway=True))  # told to go on
    other = config(model="hf:/some/other")
    with pytest.raises(TrainingError, match="made with"):
        check_trainable(Calibration(**{**calibration.__dict__, "trainable": True}), other)


def test_calibration_file_round_trips_and_a_bad_one_is_one_line(tmp_path):
    figures = LevelFigures(level=1, groups=[[0.25, 0.75], [0.5, 0.5]], episodes=4)
    calibration = Calibration(
        env_id=LEVELS,
        model="m",
        levels=[figures],
        level=1,
        trainable=True,
        reason="r",
        reward_band=[0.2, 0.6],
        min_informative=0.5,
    )
    path = save_calibrations(tmp_path / "calibration.json", [calibration])
    loaded = load_calibrations(path)[LEVELS]
    assert loaded.levels[0].informative_share == 0.5 and loaded.level == 1
    assert json.loads(path.read_text())["calibrations"][0]["figures"][0]["informative_groups"] == 0.5
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TrainingError, match="not a calibration file"):
        load_calibrations(tmp_path / "bad.json")


def test_redraws_are_fresh_deterministic_and_stay_in_the_training_tasks():
    key = parse_key('{"env": "e", "seed": 7}')
    again = [redraw_key(key, draw, 0, None) for draw in (2, 3)]
    assert len(set(again)) == 2 and again == [redraw_key(key, draw, 0, None) for draw in (2, 3)]
    tasks = ["1", "2", "3"]
    for draw in range(2, 12):
        assert parse_key(redraw_key(parse_key('{"env": "t", "task": "1"}'), draw, 0, tasks))["task"] in tasks
    assert informative([0.1, 0.2]) and not informative([0.5, 0.5]) and not informative([0.3, None])


def test_mean_reward_is_the_first_draw_and_redraws_are_counted():
    record = IterationRecord(
        rewards=[0.25, 0.75],
        groups=[[0.25, 0.75]],
        first_rewards=[0.5, 0.5],
        draws=2,
        redrawn_groups=1,
        episodes_played=4,
    )
    summary = record.summary()
    assert summary["mean_reward"] == 0.5 and summary["mean_reward_trained"] == 0.5
    assert summary["informative_groups"] == 1 and summary["draws"] == 2 and summary["redrawn_groups"] == 1


@pytest.mark.slow
def test_dynamic_sampling_redraws_constant_groups_in_real_episodes():
    from trace_gym.llm import make_backend
    from trace_gym.registry import make
    from trace_gym.training.pool import EnvPool
    from trace_gym.training.rollouts import EnvRolloutFunc, episode_key

    backend = make_backend("smollm2-135m-instruct", max_batch=16)
    keys = [episode_key(LEVELS, seed=s) for s in (3, 4, 6, 7)]  # 3 and 6: constant groups at level 1
    for draws in (1, 3):
        cfg = config(max_draws=draws)
        pool = EnvPool(lambda env_id: make(env_id, backend="auto"))
        try:
            func = EnvRolloutFunc(cfg, pool, backend.tokenizer, {LEVELS: None}, adapter=None)
            batch = func.play(keys, backend)
        finally:
            pool.close()
        record = func.records[-1]
        assert record.first_rewards == [level_one(s, i == 0) for s in (3, 4, 6, 7) for i in range(2)]
        assert len(batch["env_reward"]) == 8 and record.episodes_played == 2 * record.draws
        if draws == 1:
            assert record.draws == 4 and record.redrawn_groups == 0 and record.summary()["informative_groups"] == 2
        else:
            assert record.redrawn_groups >= 2 and record.draws > 4  # both constant groups were played again
            still = [g for g in record.groups if not informative(g)]
            assert record.draws == 4 + record.redrawn_groups and len(still) <= 2
            assert record.summary()["informative_groups"] >= 2


@pytest.mark.slow
def test_train_refuses_an_untrainable_or_uncalibrated_env_in_one_line(tmp_path):
    result = run_cli(
        "train",
        "--env",
        LEVELS,
        "--out",
        str(tmp_path / "a"),
        "--hint-share",
        "0",
        "--groups",
        "2",
        "--rollouts-per-group",
        "2",
        "--max-new-tokens",
        "4",
        "--iterations",
        "1",
        *UNVALIDATED,
        env=ENV,
    )
    assert result.returncode == 2 and "untrainable" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("trace-gym: error:")
    saved = json.loads((tmp_path / "a" / "calibration.json").read_text())["calibrations"][0]
    assert not saved["trainable"] and {f["level"] for f in saved["figures"]} >= {1}
    result = run_cli("train", "--env", LEVELS, "--out", str(tmp_path / "b"), "--no-calibrate", *UNVALIDATED, env=ENV)
    assert result.returncode == 2 and "calibration is off" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_cli("train", "--env", LEVELS, "--out", str(tmp_path / "c"), "--level", "5", *UNVALIDATED, env=ENV)
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_a_level_reaches_the_env_and_a_bad_level_is_refused():
    from trace_gym.errors import EnvContractError
    from trace_gym.registry import make

    for level, reward in ((0, 1.0), (2, 0.0)):
        env = make(LEVELS, level=level)
        try:
            _, info = env.reset(seed=4)
            assert info["level"] == level and env.unwrapped.levels == 3
            _, r, terminated, _, _ = env.step("Your order is on its way.")
            assert terminated and r == reward
            env.reset(seed=4, options={"level": 0})  # per episode, as calibration plays it
            assert env.step("ok")[1] == 1.0
        finally:
            env.close()
    with pytest.raises(EnvContractError, match="level must be an integer in 0..2"):
        make(LEVELS, level=3)
    with pytest.raises(EnvContractError, match="no difficulty levels"):
        make("trace/test-two-replies-v0", level=1)


def test_training_on_a_target_plays_only_its_train_split():
    """GRPO on the target, its calibration and its redraws draw from these tasks: never a held-out one."""
    from trace_gym.registry import make
    from trace_gym.training.trainer import _env_plan

    tasks, kwargs, _ = _env_plan(GRPOTrainingConfig(env_ids=["trace/tau2-retail-v0"], out="x"))
    held_out = set(make("trace/tau2-retail-v0", split="test").unwrapped.task_ids)
    train = set(make("trace/tau2-retail-v0", split="train").unwrapped.task_ids)
    assert set(tasks["trace/tau2-retail-v0"]) == train and not train & held_out
    assert kwargs["trace/tau2-retail-v0"]["split"] == "train"
