"""The trace-gym command as a user runs it: summaries, one-line errors, kill -9 and resume."""

import json
import os
import signal
import subprocess
import time
from collections import Counter

import pytest

from conftest import run_cli
from trace_gym.store import read_trajectories


def assert_one_line_error(result, fragment):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trace-gym: error:"), result.stderr
    assert "Traceback" not in result.stderr and fragment in lines[0]


def test_envs_list_shows_targets():
    result = run_cli("envs", "list", "--json")
    rows = {row["id"]: row for row in json.loads(result.stdout)}
    assert rows["trace/tau2-retail-v0"] == {
        "id": "trace/tau2-retail-v0",
        "kind": "target",
        "target": "tau2-bench:retail",
        "capability": "",
        "status": "trusted",
    }


def test_rollout_prints_a_summary_and_writes_trajectories(tmp_path):
    out = tmp_path / "oracle.jsonl"
    result = run_cli(
        "rollout",
        "--env",
        "trace/tau2-retail-v0",
        "--agent",
        "oracle",
        "--split",
        "test",
        "--tasks",
        "3",
        "--out",
        str(out),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["episodes"] == 3 and summary["successes"] == 3 and summary["mean_reward"] == 1.0
    assert len(read_trajectories(out)) == 3
    report = run_cli("report", str(out))
    assert "oracle  trace/tau2-retail-v0  3         1.000" in report.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--env", "trace/nope-v0", "--agent", "random"], "unknown env id 'trace/nope-v0'"),
        (["--env", "trace/tau2-retail-v0", "--agent", "genius"], "unknown agent 'genius'"),
        (["--env", "trace/tau2-retail-v0", "--agent", "random", "--task-ids", "nope"], "no task 'nope'"),
        (["--env", "trace/tau2-retail-v0", "--agent", "random", "--split", "dev"], "no split 'dev'"),
        (
            [
                "--env",
                "trace/tau2-retail-v0",
                "--agent",
                "random",
                "--tasks",
                "1",
                "--user",
                "llm",
                "--user-model",
                "m",
                "--user-base-url",
                "http://127.0.0.1:9/v1",
            ],
            "did not answer",
        ),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, fragment):
    assert_one_line_error(run_cli("rollout", *args, "--out", str(tmp_path / "t.jsonl")), fragment)


def test_unwritable_output_path_is_one_clear_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("rollout", "--env", "trace/tau2-retail-v0", "--agent", "random", "--out", str(blocker / "t.jsonl"))
    assert_one_line_error(result, "cannot write trajectories")


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_gives_every_episode_exactly_once(tmp_path):
    out = tmp_path / "run.jsonl"
    args = [
        "rollout",
        "--env",
        "trace/tau2-retail-v0",
        "--agent",
        "oracle",
        "--split",
        "test",
        "--tasks",
        "12",
        "--samples",
        "2",
        "--out",
        str(out),
        "--no-progress",
    ]
    exe = run_cli("--help").args[0]
    proc = subprocess.Popen([exe, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= 6:  # the run header + 5 episodes
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished_before = out.read_bytes().count(b"\n") - 1  # less the run header
    assert 5 <= finished_before < 24, "the kill must land half-way"

    result = run_cli(*args, "--resume", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["resumed"] == finished_before and summary["episodes"] == 24
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["record"] for r in records if "record" in r] == ["run"]  # one header: the resumed run is the same run
    ids = [r["episode_id"] for r in records if "episode_id" in r]
    assert len(ids) == 24 and Counter(ids).most_common(1)[0][1] == 1
    assert {t.reward for t in read_trajectories(out)} == {1.0}
