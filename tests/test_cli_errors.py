"""Every ``trace-gym`` subcommand, given bad input, says so in one line on stderr and exits 2.

The cases run in-process through ``cli.main`` (the command's own entry point) so the
table stays cheap; an exception escaping ``main`` fails the test as a traceback would.
Progress lines (indented, as the commands print them before the work) are allowed before
the error line. A subcommand added without a bad-input case here fails the coverage test.
"""

import argparse
import json

import pytest

from conftest import run_cli
from trace_gym import cli
from trace_gym.store import TrajectoryStore
from trace_gym.trajectory import Message, Trajectory, episode_id


def subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out.add(prefix + (name,))
                out |= subcommands(child, prefix + (name,))
    return out


def leaf_commands() -> set[tuple[str, ...]]:
    every = subcommands(cli.build_parser())
    return {c for c in every if not any(other[: len(c)] == c and other != c for other in every)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    malformed = root / "malformed.jsonl"
    malformed.write_text('{"episode_id": "a"}\nnot json at all\n{"x": 1}\n')
    synthesized = root / "synthesized.jsonl"
    with TrajectoryStore(synthesized) as store:
        for i, reward in enumerate((1.0, 0.0, 1.0, 0.0)):
            store.append(
                Trajectory(
                    episode_id=episode_id("trace/structured-data-v0", None, 0, i),
                    env_id="trace/structured-data-v0",
                    task_id=f"seed-{i}",
                    seed=i,
                    agent="oracle",
                    messages=[Message(role="user", content="hi")],
                    reward=reward,
                    terminated=True,
                    truncated=False,
                    steps=1,
                    started_at="2026-01-01T00:00:00+00:00",
                    wall_s=0.0,
                )
            )
    bad_json = root / "capabilities.json"
    bad_json.write_text("{not json")
    bad_toml = root / "run.toml"
    bad_toml.write_text("[run\ntarget = ")
    return {
        "root": root,
        "malformed": str(malformed),
        "synthesized": str(synthesized),
        "missing": str(root / "missing.jsonl"),
        "bad_json": str(bad_json),
        "bad_toml": str(bad_toml),
        "dir": str(root),
    }


CASES = [
    # (command, arguments after it, a fragment of the one error line)
    (("envs", "list"), ["--colour"], "unrecognized arguments: --colour"),
    (("envs", "new"), ["Bad Name!", "--target", "trace/tau2-retail-v0", "--dir", "{root}"], "name"),
    (("envs", "new"), ["fine-name", "--target", "trace/nope-v0", "--dir", "{root}"], "unknown env id 'trace/nope-v0'"),
    (
        ("envs", "new"),
        ["fine-name", "--target", "trace/structured-data-v0", "--dir", "{root}"],
        "trace/structured-data-v0",
    ),
    (("envs", "freeze-tools"), ["trace/nope-v0"], "unknown env id 'trace/nope-v0'"),
    (("envs", "freeze-tools"), ["trace/structured-data-v0"], "trace/structured-data-v0"),
    (("envs", "catalog"), ["--registry", "{missing}"], "missing.jsonl"),
    (("envs", "serve"), ["trace/nope-v0", "--port", "0"], "unknown env id 'trace/nope-v0'"),
    (("envs", "serve"), ["trace/structured-data-v0", "--max-sessions", "0"], "max_sessions must be at least 1"),
    (("envs", "serve"), ["trace/structured-data-v0", "--port", "70000"], "--port must be in 0..65535"),
    (("rollout",), ["--env", "trace/nope-v0", "--agent", "oracle", "--out", "{root}/r.jsonl"], "unknown env id"),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--task-ids", " , ", "--out", "{root}/r.jsonl"],
        "--task-ids: names nothing",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--tasks", "many", "--out", "{root}/r.jsonl"],
        "argument --tasks: invalid",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--samples", "0", "--out", "{root}/r.jsonl"],
        "--samples",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--workers", "0", "--out", "{root}/r.jsonl"],
        "--workers",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--tasks", "-1", "--out", "{root}/r.jsonl"],
        "--tasks",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--temperature", "hot", "--out", "{root}/r.jsonl"],
        "argument --temperature: invalid",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "planted", "--deficits", "typo=0.3", "--out", "{root}/r.jsonl"],
        "unknown deficits ['typo']",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--seeds", "3", "--out", "{root}/r.jsonl"],
        "not --seeds",
    ),
    (
        ("rollout",),
        ["--env", "trace/structured-data-v0", "--agent", "oracle", "--task-ids", "1", "--out", "{root}/r.jsonl"],
        "played by seed",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--resume", "--out", "{malformed}"],
        "is not a trajectory record",
    ),
    (
        ("rollout",),
        [
            "--env",
            "trace/tau2-retail-v0",
            "--agent",
            "oracle",
            "--batch",
            "4",
            "--tasks",
            "1",
            "--out",
            "{root}/b.jsonl",
        ],
        "--batch",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--chat-template", "stock", "--out", "{root}/r.jsonl"],
        "--chat-template only apply to --agent llm",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "oracle", "--max-new-tokens", "8", "--out", "{root}/r.jsonl"],
        "--max-new-tokens only apply to --agent llm",
    ),
    (
        ("rollout",),
        ["--env", "trace/tau2-retail-v0", "--agent", "llm", "--max-new-tokens", "0", "--out", "{root}/r.jsonl"],
        "argument --max-new-tokens: must be at least 1",
    ),
    (
        ("rollout",),
        [
            "--env",
            "trace/tau2-retail-v0",
            "--agent",
            "llm",
            "--model",
            "openai:m",
            "--chat-template",
            "stock",
            "--out",
            "{root}/r.jsonl",
        ],
        "renders conversations with its own chat template",
    ),
    (("validate",), ["{missing}"], "missing.jsonl"),
    (("validate",), ["trace/nope-v0"], "trace/nope-v0"),
    (("validate",), ["trace/tau2-retail-v0"], "trace/tau2-retail-v0"),
    (("validate",), ["trace/structured-data-v0", "--seeds", "0", "--no-write"], "--seeds"),
    (("identify",), ["--trajectories", "{missing}", "--out", "{root}/i"], "no trajectory file"),
    (("identify",), ["--trajectories", "{malformed}", "--out", "{root}/i"], "is not a trajectory record"),
    (("identify",), ["--trajectories", "{dir}", "--out", "{root}/i"], "is a directory"),
    (("identify",), ["--trajectories", "{synthesized}", "--out", "{root}/i"], "gold actions"),
    (("identify",), ["--trajectories", "{synthesized}", "--runs", "0", "--out", "{root}/i"], "--runs"),
    (
        ("identify",),
        ["--trajectories", "{synthesized}", "--runs", "4", "--k", "5", "--out", "{root}/i"],
        "K (min_runs) = 5",
    ),
    (
        ("identify",),
        ["--trajectories", "{synthesized}", "--delta", "big", "--out", "{root}/i"],
        "argument --delta: invalid",
    ),
    (
        ("identify",),
        ["--trajectories", "{synthesized}", "--analyst", "magic", "--out", "{root}/i"],
        "unknown analyst 'magic'",
    ),
    (("synthesize",), ["--capabilities", "{missing}", "--target", "trace/tau2-retail-v0"], "missing.jsonl"),
    (("synthesize",), ["--capabilities", "{bad_json}", "--target", "trace/tau2-retail-v0"], "capabilities.json"),
    (("synthesize",), ["--capabilities", "{bad_json}", "--target", "trace/nope-v0"], "trace/nope-v0"),
    (("run",), ["{missing}"], "missing.jsonl"),
    (("run",), ["{bad_toml}"], "run.toml"),
    (("train",), ["--env", "trace/nope-v0", "--out", "{root}/t"], "trace/nope-v0"),
    (
        ("train",),
        ["--env", "trace/tau2-retail-v0", "--iterations", "many", "--out", "{root}/t"],
        "argument --iterations: invalid",
    ),
    (("train",), ["--env", "trace/tau2-retail-v0", "--lr", "fast", "--out", "{root}/t"], "argument --lr: invalid"),
    (
        ("train",),
        ["--env", "trace/tau2-retail-v0", "--micro-batch", "3", "--out", "{root}/t"],
        "micro_batch must divide G x K = 16",
    ),
    (("train",), ["--env", "trace/tau2-retail-v0", "--no-calibrate", "--out", "{root}/t"], "calibration is off"),
    (
        ("train",),
        ["--env", "trace/tau2-retail-v0", "--max-draws", "0", "--out", "{root}/t"],
        "max_draws must be at least 1",
    ),
    (
        ("train",),
        ["--env", "trace/tau2-retail-v0", "--level", "1", "--out", "{root}/t"],
        "declares no difficulty levels",
    ),
    (
        ("train",),
        ["--env", "trace/tau2-retail-v0", "--chat-template", "nosuch", "--out", "{root}/t"],
        "chat template 'nosuch': neither a file, one of ours (chatml_tools, chatml_compact_tools) nor one of TRL's",
    ),
    (
        ("train",),
        ["--env", "trace/tau2-retail-v0", "--chat-template", "{missing}.jinja", "--out", "{root}/t"],
        "no such file",
    ),
    (("sft",), ["--trajectories", "{missing}", "--out", "{root}/s"], "no trajectory file"),
    (("sft",), ["--trajectories", "{malformed}", "--out", "{root}/s"], "is not a trajectory record"),
    (("sft",), ["--trajectories", "{synthesized}", "--batch-size", "3", "--out", "{root}/s"], "must divide batch_size"),
    (
        ("sft",),
        ["--trajectories", "{synthesized}", "--min-reward", "2", "--out", "{root}/s"],
        "no demonstration to learn from",
    ),
    (("baseline", "gepa"), ["--env", "trace/nope-v0", "--budget", "20", "--out", "{root}/g"], "trace/nope-v0"),
    (
        ("baseline", "gepa"),
        ["--env", "trace/tool-precision-v0", "--budget", "20", "--out", "{root}/g"],
        "is a training env",
    ),
    (("baseline", "gepa"), ["--env", "trace/tau2-retail-v0", "--budget", "5", "--out", "{root}/g"], "cannot pay for"),
    (
        ("baseline", "gepa"),
        ["--env", "trace/tau2-retail-v0", "--budget", "0", "--out", "{root}/g"],
        "argument --budget: must be at least 1",
    ),
    (
        ("baseline", "gepa"),
        ["--env", "trace/tau2-retail-v0", "--budget", "20", "--seed-prompt", "@{missing}", "--out", "{root}/g"],
        "missing.jsonl",
    ),
    (
        ("baseline", "gepa"),
        ["--env", "trace/tau2-retail-v0", "--budget", "20", "--model", "gpt", "--out", "{root}/g"],
        "unknown model 'gpt'",
    ),
    (("evaluate",), ["{dir}"], "holds no run of trace-gym run"),
    (("evaluate",), ["{dir}", "--tasks", "0"], "argument --tasks: must be at least 1"),
    (("evaluate",), ["{dir}", "--samples", "-1"], "argument --samples: must be at least 1"),
    (("evaluate",), ["{dir}", "--methods", ","], "--methods: names nothing"),
    (("route",), ["{dir}", "--message", "hi", "--tasks", "2"], "not both"),
    (("route",), ["{missing}"], "holds no run of trace-gym run"),
    (("route",), ["{dir}", "--tasks", "0"], "argument --tasks: must be at least 1"),
    (("serve",), ["{missing}"], "holds no run of trace-gym run"),
    (("serve",), ["--adapter", "oops"], "expected NAME=PATH"),
    (("serve",), ["--port", "many"], "invalid int value"),
    (("serve",), ["{missing}", "--chat-template", "stock"], "or --model, not both"),
    (("targets", "new"), ["Bad Name!", "--dir", "{root}"], "lowercase"),
    (("targets", "new"), ["tau2-retail", "--dir", "{root}"], "already registered"),
    (("targets", "new"), ["my-desk-v0", "--dir", "{root}"], "leave out the version; its id is trace/my-desk-v0"),
    (("targets", "new"), ["my-desk", "--dir", "{bad_json}"], "not a folder"),
    (("targets", "freeze"), ["trace/nope-v0"], "unknown env id 'trace/nope-v0'"),
    (("report",), ["{missing}"], "no trajectory file"),
    (("report",), ["{malformed}"], "is not a trajectory record"),
]


def test_every_subcommand_has_bad_input_cases():
    covered = {command for command, _, _ in CASES}
    assert leaf_commands() - covered == set(), "add a bad-input case for each new subcommand"


@pytest.mark.parametrize("command, arguments, fragment", CASES, ids=[" ".join(c + tuple(a))[:70] for c, a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2(files, capsys, command, arguments, fragment):
    argv = list(command) + [a.format(**files) for a in arguments]
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # argparse's own exit
        status = exc.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("  ")]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("trace-gym: error:"), err
    assert fragment in lines[0], err
    assert "Traceback" not in err


def test_a_real_process_prints_one_line_for_a_parse_error_and_a_bad_file(files):
    for args, fragment in (
        (["identify", "--trajectories", files["malformed"], "--runs", "x", "--out", "o"], "--runs"),
        (["report", files["malformed"]], "is not a trajectory record"),
    ):
        result = run_cli(*args)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
        assert "Traceback" not in result.stderr
    assert json.loads(run_cli("envs", "list", "--json").stdout)  # and a good call still works
