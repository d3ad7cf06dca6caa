"""A target of the user's own: a plain gymnasium.Env (examples/bank-support, no trace-gym
base class), registered by a folder on TRACE_GYM_REGISTRY_PATH, played and trained."""

import json
import os
import shutil

import pytest

from conftest import REPO, run_cli
from trace_gym.env import opening_messages, turn_messages
from trace_gym.store import read_trajectories
from trace_gym.trajectory import Message

ENV_ID = "trace/bank-support-v0"
ON_PATH = {**os.environ, "TRACE_GYM_REGISTRY_PATH": str(REPO / "examples" / "bank-support")}


def test_an_env_without_messages_is_read_plainly_and_one_with_them_as_given():
    info = {"system_prompt": "Be brief.", "tools": []}
    assert opening_messages("hello", info) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    assert opening_messages("hello", {}) == [{"role": "user", "content": "hello"}]
    assert turn_messages("Done, goodbye.", "Thanks.", {}) == [
        {"role": "assistant", "content": "Done, goodbye."},
        {"role": "user", "content": "Thanks."},
    ]
    call, result = turn_messages('{"name": "f", "arguments": {"x": 1}}', "ok", {})
    assert call["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert result == {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "ok"}
    given = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    assert turn_messages("ignored", "ok", {"messages": given}) == given
    call, result = (Message.from_openai(m) for m in given)
    assert call.tool_calls[0].name == "f" and call.tool_calls[0].arguments == {"x": 1} and result.tool_call_id == "c1"
    with pytest.raises(ValueError, match="role 'robot'"):
        Message.from_openai({"role": "robot", "content": "x"})


def test_the_example_target_is_found_on_the_registry_path_and_its_oracle_solves_it(tmp_path):
    out = tmp_path / "oracle.jsonl"
    result = run_cli(
        "rollout",
        "--env",
        ENV_ID,
        "--agent",
        "oracle",
        "--split",
        "train",
        "--out",
        str(out),
        "--no-progress",
        env=ON_PATH,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    episodes = read_trajectories(out)
    assert len(episodes) == 14 and all(t.success for t in episodes)
    assert {t.task_id for t in episodes} == {str(i) for i in range(14)}  # the train split only
    first = episodes[0]
    assert [m.role for m in first.messages[:3]] == [
        "system",
        "user",
        "assistant",
    ] and first.termination_reason == "done"
    assert first.steps == len(first.messages[2:]) // 2
    without = run_cli("rollout", "--env", ENV_ID, "--agent", "oracle", "--out", str(tmp_path / "x.jsonl"), cwd=tmp_path)
    assert without.returncode == 2 and "unknown env id 'trace/bank-support-v0'" in without.stderr


@pytest.mark.slow
def test_a_plain_gymnasium_env_is_played_by_a_model_and_trained_by_grpo(tmp_path):
    out = tmp_path / "base.jsonl"
    result = run_cli(
        "rollout",
        "--env",
        ENV_ID,
        "--agent",
        "llm",
        "--split",
        "test",
        "--tasks",
        "2",
        "--out",
        str(out),
        "--no-progress",
        env=ON_PATH,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    episodes = read_trajectories(out)
    assert len(episodes) == 2 and {t.task_id for t in episodes} <= {str(i) for i in range(14, 20)}
    assert all(t.messages[0].role == "system" and t.messages[2].role == "assistant" for t in episodes)
    trained = run_cli(
        "train",
        "--env",
        ENV_ID,
        "--out",
        str(tmp_path / "grpo"),
        "--iterations",
        "1",
        "--groups",
        "2",
        "--rollouts-per-group",
        "2",
        "--max-new-tokens",
        "24",
        "--no-calibrate",
        "--train-anyway",
        "--max-draws",
        "1",
        env=ON_PATH,
        cwd=tmp_path,
        timeout=900,
    )
    assert trained.returncode == 0, trained.stderr
    [row] = [json.loads(line) for line in (tmp_path / "grpo" / "train_log.jsonl").read_text().splitlines()]
    assert row["rollouts"] == 4 and row["failed_episodes"] == 0
    assert (tmp_path / "grpo" / "adapter" / "adapter_config.json").exists()


def _rollout(tmp_path, agent, tasks, out, *extra):
    result = run_cli(
        "rollout",
        "--env",
        ENV_ID,
        "--agent",
        agent,
        "--task-ids",
        ",".join(map(str, tasks)),
        "--out",
        str(out),
        "--no-progress",
        *extra,
        env=ON_PATH,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return out


def test_the_reference_analyst_identifies_what_an_agent_lacks_on_a_users_target_offline(tmp_path):
    solved = _rollout(tmp_path, "oracle", range(7), tmp_path / "oracle.jsonl")
    failed = _rollout(tmp_path, "random", range(7, 14), tmp_path / "random.jsonl", "--samples", "2")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(solved.read_text() + "".join(failed.read_text().splitlines(keepends=True)[1:]))
    call = read_trajectories(solved)[0].messages[2]
    assert (
        call.role == "assistant" and call.tool_calls and call.tool_calls[0].name == "get_account"
    )  # parsed, not raw text
    result = run_cli(
        "identify",
        "--trajectories",
        str(mixed),
        "--analyst",
        "reference",
        "--out",
        str(tmp_path / "id"),
        env=ON_PATH,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    from trace_gym.artifacts import Identification

    identified = Identification.load(tmp_path / "id")
    selected = {c.name for c in identified.selected}
    # The random agent's failures also write before they read: read_before_write may pass K of N too
    # (it does with the episodes read in id order), and nothing else may.
    assert (
        {"precise_arguments", "complete_actions"}
        <= selected
        <= {
            "precise_arguments",
            "complete_actions",
            "read_before_write",
        }
    )
    evidence = [x.evidence for x in identified.lacking()["complete_actions"]]
    assert evidence and all("freeze_card" in e for e in evidence)  # the solution's write, never made
    unknown = run_cli(
        "rollout",
        "--env",
        ENV_ID,
        "--agent",
        "oracle",
        "--task-ids",
        "15",
        "--out",
        str(tmp_path / "u.jsonl"),
        env=ON_PATH,
        cwd=tmp_path,
    )
    assert unknown.returncode == 2 and "no task '15' in this split" in unknown.stderr


@pytest.mark.parametrize(
    "analyst, refusal",
    [
        ("gold", "gold reads τ²-bench's gold actions"),
        ("milestone", "milestone reads ToolSandbox's milestones"),
        ("reference", None),
    ],
)
def test_run_check_refuses_an_offline_analyst_that_cannot_label_the_target(tmp_path, analyst, refusal):
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\ntarget = "{ENV_ID}"\ndir = "{tmp_path / "run"}"\n\n[identify]\nanalyst = "{analyst}"\n')
    result = run_cli("run", str(config), "--check", env=ON_PATH, cwd=tmp_path)
    if refusal is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 2 and refusal in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_users_target_freezes_whole_and_an_env_scaffolded_for_it_validates(tmp_path):
    import shutil

    registry = tmp_path / "registry"
    shutil.copytree(REPO / "examples" / "bank-support" / "bank-support", registry / "bank-support")
    here = {**os.environ, "TRACE_GYM_REGISTRY_PATH": str(registry)}
    frozen = run_cli("envs", "freeze-tools", ENV_ID, env=here, cwd=tmp_path)
    assert frozen.returncode == 0, frozen.stderr
    shapes = json.loads((registry / "bank-support" / "results.json").read_text())
    assert shapes["error_prefix"] == "Error: " and shapes["observed"] is True
    assert set(shapes["tools"]) == {"get_account", "get_card", "freeze_card"}
    assert shapes["tools"]["get_card"]["schema"]["required"] == ["card_id", "frozen", "last_four"]
    assert not list((registry / "bank-support").glob(".freeze*"))
    made = run_cli("envs", "new", "card-lookup", "--target", ENV_ID, "--dir", str(registry), env=here, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    validated = run_cli(
        "validate", str(registry / "card-lookup"), "--seeds", "20", "--seed", "0", "--no-write", env=here, cwd=tmp_path
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr

    # A target with no result_shapes() and no oracle_actions(): refused in one line, nothing half written.
    source = (registry / "bank-support" / "bank_support.py").read_text()
    (registry / "bank-support" / "bank_support.py").write_text(
        source.replace("def oracle_actions(self):", "def _hidden(self):")
    )
    for name in ("tools.json", "results.json"):
        (registry / "bank-support" / name).unlink()
    refused = run_cli("envs", "freeze-tools", ENV_ID, env=here, cwd=tmp_path)
    assert refused.returncode == 2 and "cannot describe what its tools return" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert (
        not (registry / "bank-support" / "tools.json").exists()
        and not (registry / "bank-support" / "results.json").exists()
    )


def test_a_freeze_that_cannot_write_both_files_leaves_the_target_as_it_was(tmp_path, monkeypatch):
    import trace_gym.freeze as freeze
    from trace_gym.errors import TraceGymError
    from trace_gym.registry import add_registry_dir

    folder = tmp_path / "mine" / "desk"
    shutil.copytree(REPO / "examples" / "bank-support" / "bank-support", folder)
    manifest = folder / "manifest.toml"
    manifest.write_text(manifest.read_text().replace(ENV_ID, "trace/half-frozen-desk-v0"))
    add_registry_dir(folder.parent)
    before = {name: (folder / name).read_bytes() for name in ("tools.json", "results.json")}
    (folder / "tools.json").write_text("[]\n")  # stale, so that a freeze would change it
    stale = (folder / "tools.json").read_bytes()

    (folder / "results.json").unlink()
    (folder / "results.json").mkdir()  # in the way: refused before anything is replaced
    with pytest.raises(TraceGymError, match="results.json: not a file"):
        freeze.freeze_tools("trace/half-frozen-desk-v0")
    assert (folder / "tools.json").read_bytes() == stale and not list(folder.glob(".freeze*"))
    (folder / "results.json").rmdir()
    (folder / "results.json").write_bytes(before["results.json"])

    replace = os.replace

    def refuse_results(source, destination):  # the disk refuses the second file only
        if str(destination).endswith("results.json"):
            raise PermissionError(13, "Permission denied")
        replace(source, destination)

    monkeypatch.setattr(os, "replace", refuse_results)
    with pytest.raises(TraceGymError, match="cannot be written .Permission denied.; tools.json left as it was"):
        freeze.freeze_tools("trace/half-frozen-desk-v0")
    assert (folder / "tools.json").read_bytes() == stale

    def interrupted(source, destination):  # Ctrl-C between the two
        if str(destination).endswith("results.json"):
            raise KeyboardInterrupt
        replace(source, destination)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        freeze.freeze_tools("trace/half-frozen-desk-v0")
    monkeypatch.setattr(os, "replace", replace)
    assert (folder / "tools.json").read_bytes() == stale and not list(folder.glob(".freeze*"))
    (folder / ".freeze").mkdir()
    (folder / ".freeze" / "notes.txt").write_text("mine")  # a user's folder of that name is not the freeze's
    (folder / ".freeze-killed").mkdir()  # what a freeze killed mid-way left: cleared by the next
    freeze.freeze_tools("trace/half-frozen-desk-v0")
    assert {name: (folder / name).read_bytes() for name in before} == before
    assert (folder / ".freeze" / "notes.txt").read_text() == "mine" and not (folder / ".freeze-killed").exists()


def test_an_observed_shape_requires_only_the_fields_seen_in_every_answer():
    from trace_gym.freeze import _merge, _schema_of
    from trace_gym.result_shapes import result_problems

    schema = _merge(_schema_of({"a": 1}), _schema_of({"a": 2, "b": "x"}))
    shapes = {"error_prefix": "Error: ", "tools": {"t": {"format": "json", "schema": schema}}}
    assert result_problems(shapes, "t", '{"a": 3}') == [] and result_problems(shapes, "t", '{"a": 3, "b": "y"}') == []
    assert result_problems(shapes, "t", '{"b": "y"}') and result_problems(shapes, "t", '{"a": 1, "c": 0}')


def test_several_calls_of_a_plain_env_are_all_recorded():
    action = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": {"x": 1}}</tool_call>'
    call, first, last = turn_messages(action, "both answered", {})
    assert [c["function"]["name"] for c in call["tool_calls"]] == ["f", "g"]
    assert last == {"role": "tool", "tool_call_id": call["tool_calls"][1]["id"], "content": "both answered"}
    assert first["tool_call_id"] == call["tool_calls"][0]["id"]


def test_a_plain_envs_unparsable_turn_is_recorded_as_one():
    from trace_gym.rollout import transcript_messages

    broken = '{"name": "get_account", "arguments": '
    record = transcript_messages(
        [
            {"role": "user", "content": "hi"},
            *turn_messages(broken, "Thanks, bye.", {}),
            *turn_messages("All done.", "ok", {}),
        ]
    )
    assert [m.error for m in record if m.role == "assistant"] == [True, False]


def test_a_program_adds_a_registry_folder_without_editing_the_environment(tmp_path, monkeypatch):
    from trace_gym.registry import add_registry_dir, get_entry, registry_dirs

    monkeypatch.delenv("TRACE_GYM_REGISTRY_PATH", raising=False)
    folder = tmp_path / "mine"
    (folder / "desk").mkdir(parents=True)
    (folder / "desk" / "manifest.toml").write_text(
        (REPO / "examples" / "bank-support" / "bank-support" / "manifest.toml")
        .read_text()
        .replace("trace/bank-support-v0", "trace/added-desk-v0")
    )
    shutil.copy(REPO / "examples" / "bank-support" / "bank-support" / "bank_support.py", folder / "desk")
    assert add_registry_dir(folder) is True and add_registry_dir(folder) is False  # once
    assert get_entry("trace/added-desk-v0").path == (folder / "desk").resolve() and folder.resolve() in registry_dirs()
    assert "TRACE_GYM_REGISTRY_PATH" not in os.environ
    library = [
        p for p in (REPO / "trace_gym").rglob("*.py") if 'os.environ["TRACE_GYM_REGISTRY_PATH"] =' in p.read_text()
    ]
    assert library == []  # no library code edits the user's setting


@pytest.mark.slow
def test_the_example_folder_runs_the_whole_loop_offline_with_the_generic_analyst(tmp_path):
    """examples/bank-support as a user would run it (README there): its target, its two
    validated training envs and run.toml; every stage, the reference analyst and the
    registry's envs, no LLM and no network; only evaluation plays the test split."""
    from trace_gym.artifacts import AdapterSet, EnvSet, Identification
    from trace_gym.evaluation import load_results

    result = run_cli("run", str(REPO / "examples" / "bank-support" / "run.toml"), env=ON_PATH, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    run = tmp_path / "runs" / "bank-support"
    # The 135M model makes no call: its own failures lack complete actions, and precise arguments
    # never apply to them (no write attempted), so the planted successes beside them select one.
    selected = {c.name for c in Identification.load(run / "identify").selected}
    assert selected == {"complete_actions"}
    assert EnvSet.load(run / "envs").trainable() == {"complete_actions": "trace/bank-freeze-all-v0"}
    assert {a.name for a in AdapterSet.load(run / "adapters").of_kind("capability")} == selected
    rows = {r.method: r for r in load_results(run / "eval" / "results.json")}
    assert set(rows) == {"base", "trace"} and all(r.tasks == 6 for r in rows.values())  # bank's 6 test tasks
    played = {t.task_id for t in read_trajectories(run / "eval" / "base.jsonl")}
    assert played == {str(i) for i in range(14, 20)}
    assert (run / "report.md").is_file()
