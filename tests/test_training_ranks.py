"""`trace-gym train` under a launcher: a real 2-process torchrun on CPU (gloo).

The ranks share an iteration's G groups (G in total, fresh seeds, none played
twice), their gradients are averaged (both end with the same LoRA), and rank 0
alone writes one log line per iteration and the adapter. What cannot run under a
launcher is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURE_ENVS, run_cli

pytest.importorskip("trl")

ENV = "trace/test-two-replies-v0"


@pytest.mark.slow
def test_two_ranks_play_g_groups_per_iteration_and_write_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_GYM_REGISTRY_PATH", str(FIXTURE_ENVS))
    out = tmp_path / "run"
    script = Path(__file__).parent / "fixtures" / "train_ranks.py"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run([*launch, str(script), str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    said = sorted(line.split() for line in done.stdout.splitlines() if line.startswith("rank "))
    assert [words[1] for words in said] == ["0", "1"], done.stdout
    assert said[0][3] == said[1][3], f"the ranks' LoRA weights differ: gradients were not averaged ({said})"
    assert all(int(words[5]) > 0 for words in said), "the shared-prefix update was not used on every rank"

    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2], "one line per iteration, from rank 0 only"
    assert [len(row["played"]) for row in rows] == [2, 2], "G groups per iteration in all, not G per rank"
    assert [row["episodes_played"] for row in rows] == [4, 8]
    groups = [key for row in rows for key in row["played"]]
    assert len(set(groups)) == 4, f"a seed was played twice: {groups}"
    assert all(len(row["first_draw_groups"]) == 2 for row in rows)
    assert (out / "adapter" / "adapter_config.json").exists()
    assert json.loads((out / "run.json").read_text())["groups"] == 2


@pytest.mark.parametrize(
    "env, args, says",
    [
        ({"WORLD_SIZE": "2"}, ["--groups", "3"], "2 ranks cannot share G = 3 groups evenly"),
        ({"WORLD_SIZE": "2"}, ["--groups", "2", "--micro-batch", "4", "--rollouts-per-group", "2"], "does not divide"),
        ({"ACCELERATE_USE_FSDP": "true"}, [], "does not run under FSDP"),
        ({"ACCELERATE_USE_DEEPSPEED": "1"}, [], "does not run under DeepSpeed"),
    ],
)
def test_what_cannot_train_under_a_launcher_is_refused_in_one_line(tmp_path, env, args, says):
    done = run_cli(
        "train",
        "--env",
        ENV,
        "--out",
        str(tmp_path / "run"),
        "--no-calibrate",
        "--train-anyway",
        "--train-unvalidated",
        ENV,
        *args,
        env={"TRACE_GYM_REGISTRY_PATH": str(FIXTURE_ENVS), "RANK": "0", **env},
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr


def test_the_pipeline_refuses_to_run_under_a_launcher(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[run]\ntarget = "trace/tau2-retail-v0"\ndir = "%s"\n' % (tmp_path / "out"))
    done = run_cli("run", str(config), env={"WORLD_SIZE": "2", "RANK": "0"})
    assert done.returncode == 2, done.stderr
    assert "under a launcher (2 ranks)" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "state.json").exists()
