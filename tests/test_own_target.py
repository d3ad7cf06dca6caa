"""A target of the user's own: a plain gymnasium.Env (examples/bank-support, no trace-gym
base class), registered by a folder on TRACE_GYM_REGISTRY_PATH, played and trained."""

import json
import os

import pytest

from conftest import REPO, run_cli
from trace_gym.env import opening_messages, turn_messages
from trace_gym.store import read_trajectories
from trace_gym.trajectory import Message

ENV_ID = "trace/bank-support-v0"
ON_PATH = {**os.environ, "TRACE_GYM_REGISTRY_PATH": str(REPO / "examples")}


def test_an_env_without_messages_is_read_plainly_and_one_with_them_as_given():
    info = {"system_prompt": "Be brief.", "tools": []}
    assert opening_messages("hello", info) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert opening_messages("hello", {}) == [{"role": "user", "content": "hello"}]
    assert turn_messages('{"name": "f", "arguments": {}}', "result", {}) == [
        {"role": "assistant", "content": '{"name": "f", "arguments": {}}'}, {"role": "user", "content": "result"}]
    given = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    assert turn_messages("ignored", "ok", {"messages": given}) == given
    call, result = (Message.from_openai(m) for m in given)
    assert call.tool_calls[0].name == "f" and call.tool_calls[0].arguments == {"x": 1} and result.tool_call_id == "c1"
    with pytest.raises(ValueError, match="role 'robot'"):
        Message.from_openai({"role": "robot", "content": "x"})


def test_the_example_target_is_found_on_the_registry_path_and_its_oracle_solves_it(tmp_path):
    out = tmp_path / "oracle.jsonl"
    result = run_cli("rollout", "--env", ENV_ID, "--agent", "oracle", "--split", "train", "--out", str(out), "--no-progress",
                     env=ON_PATH, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    episodes = read_trajectories(out)
    assert len(episodes) == 14 and all(t.success for t in episodes)
    assert {t.task_id for t in episodes} == {str(i) for i in range(14)}  # the train split only
    first = episodes[0]
    assert [m.role for m in first.messages[:3]] == ["system", "user", "assistant"] and first.termination_reason == "done"
    assert first.steps == len(first.messages[2:]) // 2
    without = run_cli("rollout", "--env", ENV_ID, "--agent", "oracle", "--out", str(tmp_path / "x.jsonl"), cwd=tmp_path)
    assert without.returncode == 2 and "unknown env id 'trace/bank-support-v0'" in without.stderr


@pytest.mark.slow
def test_a_plain_gymnasium_env_is_played_by_a_model_and_trained_by_grpo(tmp_path):
    out = tmp_path / "base.jsonl"
    result = run_cli("rollout", "--env", ENV_ID, "--agent", "llm", "--split", "test", "--tasks", "2", "--out", str(out),
                     "--no-progress", env=ON_PATH, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    episodes = read_trajectories(out)
    assert len(episodes) == 2 and {t.task_id for t in episodes} <= {str(i) for i in range(14, 20)}
    assert all(t.messages[0].role == "system" and t.messages[2].role == "assistant" for t in episodes)
    trained = run_cli("train", "--env", ENV_ID, "--out", str(tmp_path / "grpo"), "--iterations", "1", "--groups", "2",
                      "--rollouts-per-group", "2", "--max-new-tokens", "24", "--no-calibrate", "--train-anyway",
                      "--max-draws", "1", env=ON_PATH, cwd=tmp_path, timeout=900)
    assert trained.returncode == 0, trained.stderr
    [row] = [json.loads(line) for line in (tmp_path / "grpo" / "train_log.jsonl").read_text().splitlines()]
    assert row["rollouts"] == 4 and row["failed_episodes"] == 0
    assert (tmp_path / "grpo" / "adapter" / "adapter_config.json").exists()
