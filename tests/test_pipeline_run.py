"""`trace-gym run`: the loop through training, killed mid-training and resumed from there."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, run_cli

CONFIG = """
[run]
target = "trace/tau2-retail-v0"
dir = "{run}"
stages = ["rollout", "identify", "synthesize", "train"]

[policy]
model = "hf:{model}"  # a tiny random model: what is tested is where the run resumes, not what it learns

[rollout]
trajectories = "{trajectories}"

[identify.selection]
runs = 4
min_runs = 3

[synthesize]
only = ["precise_arguments"]

[train]
grpo_target = false
merged = false

[train.grpo]
iterations = 4       # a tiny model's iteration takes about a second: room to kill the run in the middle
groups = 2
rollouts_per_group = 2
max_new_tokens = 24
max_steps = 4
calibrate = false     # the base model scores 0 on every env: calibration would refuse it (test_calibration.py)
train_anyway = true
max_draws = 1
"""


@pytest.mark.slow
def test_a_run_killed_in_training_resumes_there_and_keeps_unchanged_stages(tmp_path):
    from families import tiny_model_folder

    from trace_gym.training.trainer import last_checkpoint

    trajectories = tmp_path / "planted.jsonl"
    made = run_cli(
        "rollout",
        "--env",
        "trace/tau2-retail-v0",
        "--agent",
        "planted",
        "--split",
        "train",
        "--tasks",
        "40",
        "--deficits",
        "corrupt_ids=0.5",
        "--out",
        str(trajectories),
        "--no-progress",
    )
    assert made.returncode == 0, made.stderr
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    text = CONFIG.format(run=run_dir, trajectories=trajectories, model=tiny_model_folder(tmp_path / "tiny"))
    config.write_text(text)
    adapter = run_dir / "adapters" / "precise_arguments"
    log = adapter / "train_log.jsonl"

    exe = str(Path(PYTHON).parent / "trace-gym")
    first = subprocess.Popen(
        [exe, "run", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 900
    try:
        while last_checkpoint(adapter / "checkpoints") is None:  # what a resume starts from, written whole
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline, "iteration 1 did not finish in 15 minutes"
            time.sleep(0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # kill -9, mid-run: a checkpoint written, the next under way
        first.wait()
    state = json.loads((run_dir / "state.json").read_text())
    assert set(state["stages"]) == {"rollout", "identify", "synthesize"}  # train never finished
    finished = {k: v["finished_at"] for k, v in state["stages"].items()}
    before = [json.loads(line) for line in log.read_text().splitlines()]
    assert 1 <= len(before) < 4, before

    again = run_cli("run", str(config), "--resume", timeout=900)
    assert again.returncode == 0, again.stderr
    for stage in ("rollout", "identify", "synthesize"):
        assert f"[{stage}] unchanged since" in again.stderr, again.stderr
    assert "precise_arguments on trace/tool-precision-v0" in again.stderr and "(resuming)" in again.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert rows[0] == before[0]  # iteration 1 was not played again
    state = json.loads((run_dir / "state.json").read_text())
    assert {k: state["stages"][k]["finished_at"] for k in finished} == finished
    assert (adapter / "adapter" / "adapter_config.json").exists()
    report = (run_dir / "report.md").read_text()
    assert "| precise_arguments |" in report and "## 4. Training" in report
    assert "given (not rolled out)" in report

    # Nothing changed: nothing is redone. A changed stage setting redoes that stage and what follows.
    third = run_cli("run", str(config), "--resume", timeout=600)
    assert third.returncode == 0 and "[train] unchanged since" in third.stderr, third.stderr
    config.write_text(text.replace("runs = 4", "runs = 5"))
    fourth = run_cli("run", str(config), "--resume", timeout=600)
    assert fourth.returncode == 0, fourth.stderr
    assert "[rollout] unchanged since" in fourth.stderr and "[identify] running" in fourth.stderr
    assert "already trained (4 iterations); kept" in fourth.stderr  # same capabilities, same adapter


def test_an_existing_run_without_resume_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "state.json").write_text('{"stages": {}}')
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\ntarget = "trace/tau2-retail-v0"\ndir = "{run_dir}"\n')
    result = run_cli("run", str(config))
    assert result.returncode == 2 and "already holds a run; pass --resume" in result.stderr
    result = run_cli("run", str(config), "--from", "deploy")
    assert result.returncode == 2 and "--from deploy: not one of this run's stages" in result.stderr


CEILING = """
[run]
target = "trace/tau2-retail-v0"
dir = "{run}"
stages = ["rollout"]

[rollout]
agent = "planted"
tasks = 4
max_steps = {steps}
"""


def test_a_step_limit_no_agent_could_pass_within_is_refused_before_any_model_time(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(CEILING.format(run=tmp_path / "short", steps=10))  # τ² counts every message: 10 is too few
    result = run_cli("run", str(config))
    assert result.returncode == 2, result.stderr
    assert (
        "[rollout] max_steps 10: the target's own solutions pass none of the first 4 train tasks within it, "
        "so no agent can; raise it"
    ) in result.stderr
    assert "Traceback" not in result.stderr and not list((tmp_path / "short" / "rollouts").glob("trajectories-*"))

    config.write_text(CEILING.format(run=tmp_path / "long", steps=16))
    result = run_cli("run", str(config))
    assert result.returncode == 0, result.stderr
    ceilings = json.loads((tmp_path / "long" / "state.json").read_text())["stages"]["rollout"]["outputs"]["ceilings"]
    assert ceilings["rollout"]["episodes"] == 4 and 0 < ceilings["rollout"]["successes"] <= 4
    assert (
        "*Ceiling*: the target's own solutions pass within rollout's max_steps 16"
        in (tmp_path / "long" / "report.md").read_text()
    )


def test_evaluations_step_limit_is_checked_on_the_train_split(tmp_path):
    from trace_gym.pipeline import PipelineError, config_from_data
    from trace_gym.pipeline.stages import check_ceilings

    config = config_from_data(
        {
            "run": {"target": "trace/tau2-retail-v0", "dir": str(tmp_path / "run")},
            "rollout": {"tasks": 4, "max_steps": 16},
            "evaluate": {"tasks": 4, "max_steps": 8},
        }
    )
    with pytest.raises(PipelineError, match=r"\[evaluate\] max_steps 8: .* none of the first 4 train tasks"):
        check_ceilings(config, tmp_path, lambda _: None)
    played = {
        json.loads(line).get("task_id") for f in tmp_path.glob("oracle-*.jsonl") for line in f.read_text().splitlines()
    } - {None}
    assert played == {"0", "1", "2", "3"}  # the train split's first tasks; evaluation's held-out ones untouched


STAND_INS = """
[run]
target = "trace/tau2-retail-v0"
dir = "{run}"
stages = ["rollout", "identify"]

[policy]
model = "openai:double"
base_url = "{url}"
api_key_env = "DOUBLE_KEY"

[rollout]
tasks = 3
max_steps = 16
fallback = "oracle"

[identify.selection]
runs = 4
min_runs = 3
"""


def test_a_policy_without_successes_keeps_its_failures_and_the_oracles_stand_in(tmp_path):
    from openai_double import OpenAIDouble

    from trace_gym.store import read_trajectories

    refuse = {"content": "I am sorry, I cannot help with that. Is there anything else I can help you with?"}
    config = tmp_path / "run.toml"
    with OpenAIDouble(lambda body: refuse) as server:
        config.write_text(STAND_INS.format(run=tmp_path / "run", url=server.base_url))
        result = run_cli("run", str(config), env={"DOUBLE_KEY": "test-key"})
        assert result.returncode == 0, result.stderr
        served = len(server.requests)
        again = run_cli("run", str(config), "--resume", env={"DOUBLE_KEY": "test-key"})
        assert again.returncode == 0 and "[rollout] unchanged since" in again.stderr, again.stderr
        assert len(server.requests) == served  # resumed: nothing played again
    assert "the oracle agent's" in result.stderr and "successes stand in for the policy's" in result.stderr
    outputs = json.loads((tmp_path / "run" / "state.json").read_text())["stages"]["rollout"]["outputs"]
    episodes = read_trajectories(outputs["trajectories"])
    own = [t for t in episodes if t.agent == "llm"]
    stand_ins = [t for t in episodes if t.agent != "llm"]
    assert len(own) == 3 and not any(t.success for t in own)  # every episode of the policy's, all failed
    assert stand_ins and all(t.success and t.agent == "oracle" for t in stand_ins)  # the oracle's successes only
    assert all(t.episode_id.endswith("|oracle") for t in stand_ins)  # the same tasks, other ids
    oracle = read_trajectories(outputs["stand_in"]["trajectories"])
    assert len(stand_ins) == sum(t.success for t in oracle) > 0  # every success of the oracle's, no failure
    assert outputs["stand_in"]["added"] == {"successes": len(stand_ins), "failures": 0}
    assert (outputs["episodes"], outputs["successes"]) == (len(episodes), len(stand_ins))
    identified = json.loads((tmp_path / "run" / "state.json").read_text())["stages"]["identify"]["outputs"]
    assert "degenerate" not in identified and identified["selected"]
    labelled = {json.loads(line)["episode_id"] for line in (tmp_path / "run" / "identify" / "labels.jsonl").open()}
    assert {t.episode_id for t in episodes} == labelled  # the policy's own failures among them
    report = (tmp_path / "run" / "report.md").read_text()
    assert "**Too few to contrast**" in report and "every episode of the policy's" in report
    assert "The failures it explains are the policy's own" in report


def test_a_stage_at_a_new_version_is_redone_and_version_one_hashes_as_before(monkeypatch, tmp_path):
    """A resumed run from before a stage's outputs changed meaning (rollout 2: stand-ins join the
    policy's episodes) redoes that stage; a stage never versioned keeps its old hash."""
    import hashlib

    from trace_gym import pipeline
    from trace_gym.config import to_table
    from trace_gym.pipeline.state import STAGE_VERSIONS, hashed_settings

    config = pipeline.config_from_data({"run": {"target": "trace/tau2-retail-v0", "dir": str(tmp_path)}})
    state = pipeline.RunState(tmp_path)
    current = pipeline.stage_inputs_hash(config, "rollout", state)
    monkeypatch.setitem(STAGE_VERSIONS, "rollout", 1)
    before_versions = pipeline.stage_inputs_hash(config, "rollout", state)
    assert current != before_versions  # a run hashed before the version bump does not match: redone
    payload = {
        "target": config.run.target,
        "seed": config.run.seed,
        "policy": hashed_settings("policy", to_table(config.policy)),
        "settings": hashed_settings("rollout", to_table(config.rollout)),
        "upstream": {},
    }
    assert before_versions == hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
