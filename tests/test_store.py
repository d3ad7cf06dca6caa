import json

import pytest

from trace_gym.errors import OtherRunError, TrajectoryStoreError
from trace_gym.store import TrajectoryStore, read_trajectories
from trace_gym.trajectory import Message, ToolCallRecord, Trajectory, episode_id


def make(i: int, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        episode_id=episode_id("trace/x-v0", str(i), 0),
        env_id="trace/x-v0",
        task_id=str(i),
        agent="oracle",
        messages=[Message(role="user", content=f"task {i}")],
        reward=reward,
        terminated=True,
        truncated=False,
        steps=1,
        started_at="2026-01-01T00:00:00+00:00",
        wall_s=0.1,
    )


def test_append_and_read_back(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        for i in range(3):
            store.append(make(i, reward=i / 2))
    got = read_trajectories(path)
    assert [t.task_id for t in got] == ["0", "1", "2"]
    assert [t.success for t in got] == [False, False, True]


def test_existing_file_needs_resume_or_overwrite(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append(make(0))
    with pytest.raises(TrajectoryStoreError, match="--resume"):
        TrajectoryStore(path)
    with TrajectoryStore(path, overwrite=True) as store:
        assert not store.completed


def test_resume_cuts_a_torn_last_line_and_keeps_every_finished_episode(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryStore(path) as store:
        store.append(make(0))
        store.append(make(1))
    whole = path.read_bytes()
    torn = make(2).model_dump_json().encode()[:57]  # a kill -9 in the middle of a write
    path.write_bytes(whole + torn)
    with pytest.warns(UserWarning, match="unfinished last line"):
        store = TrajectoryStore(path, resume=True)
    assert set(store.completed) == {make(0).episode_id, make(1).episode_id}
    store.append(make(2))
    store.close()
    assert [t.task_id for t in read_trajectories(path)] == ["0", "1", "2"]
    assert path.read_bytes().startswith(whole)


def test_duplicate_append_is_refused(tmp_path):
    with TrajectoryStore(tmp_path / "t.jsonl") as store:
        store.append(make(0))
        with pytest.raises(TrajectoryStoreError, match="already stored"):
            store.append(make(0))


def test_a_corrupt_middle_line_is_reported_not_dropped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(make(0).model_dump_json() + "\nnot json\n" + make(1).model_dump_json() + "\n")
    with pytest.raises(TrajectoryStoreError, match=r"t.jsonl:2 is not a trajectory record"):
        TrajectoryStore(path, resume=True)
    assert "not json" in path.read_text()  # nothing was deleted


def test_unwritable_path(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(TrajectoryStoreError, match="cannot write trajectories") as caught:
        TrajectoryStore(blocker / "t.jsonl")
    assert not isinstance(caught.value, OtherRunError)  # not a file to set aside


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(TrajectoryStoreError, match="is a directory") as caught:
        TrajectoryStore(tmp_path)
    assert not isinstance(caught.value, OtherRunError)


def test_run_settings_are_a_header_that_readers_skip(tmp_path):
    from trace_gym.store import read_run_settings

    path = tmp_path / "t.jsonl"
    settings = {"agent": "oracle", "agent_options": {"seed": 1}}
    with TrajectoryStore(path, settings=settings) as store:
        store.append(make(0))
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {"record": "run", "settings": settings}
    assert [t.task_id for t in read_trajectories(path)] == ["0"] and read_run_settings(path) == [settings]
    with TrajectoryStore(path, resume=True, settings=settings) as store:
        store.append(make(1))
    assert read_run_settings(path) == [settings]  # the same run: no second header
    with pytest.raises(OtherRunError, match=r"agent_options.seed 1 in the file, 2 now"):
        TrajectoryStore(path, resume=True, settings={"agent": "oracle", "agent_options": {"seed": 2}})


def test_concatenated_runs_with_different_settings_cannot_be_resumed(tmp_path):
    a, b, both = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "both.jsonl"
    with TrajectoryStore(a, settings={"seed": 1}) as store:
        store.append(make(0))
    with TrajectoryStore(b, settings={"seed": 2}) as store:
        store.append(make(1))
    both.write_bytes(a.read_bytes() + b.read_bytes())
    assert len(read_trajectories(both)) == 2  # still readable
    with pytest.raises(OtherRunError, match="mixes runs made with different settings"):
        TrajectoryStore(both, resume=True, settings={"seed": 1})


def test_a_retried_given_up_episode_supersedes_the_old_record(tmp_path):
    path = tmp_path / "t.jsonl"
    gave_up = make(0, reward=0.0).model_copy(update={"error": "the model never produced an action"})
    with TrajectoryStore(path) as store:
        store.append(gave_up)
        store.append(make(1))
    with TrajectoryStore(path, resume=True) as store:
        assert set(store.completed) == {gave_up.episode_id, make(1).episode_id}  # a plain resume keeps it
    with TrajectoryStore(path, resume=True, retry_given_up=True) as store:
        assert set(store.given_up) == {gave_up.episode_id} and gave_up.episode_id not in store
        store.append(make(0))
    got = {t.episode_id: t for t in read_trajectories(path)}
    assert got[gave_up.episode_id].reward == 1.0 and got[gave_up.episode_id].error is None
    assert path.read_text().count(gave_up.episode_id) == 2  # the old record is kept, never lost


def test_a_run_that_stores_nothing_leaves_nothing_to_resume(tmp_path):
    path = tmp_path / "t.jsonl"
    TrajectoryStore(path, settings={"seed": 1}).close()  # e.g. the env failed to start
    with TrajectoryStore(path, settings={"seed": 2}) as store:  # no --resume needed, no mismatch
        store.append(make(0))
    assert json.loads(path.read_text().splitlines()[0])["settings"] == {"seed": 2}


def test_transcript_numbers_cuts_and_keeps_the_chosen_end():
    t = make(0).model_copy(
        update={
            "messages": [
                Message(role="system", content="policy " * 50),
                Message(role="user", content="cancel order\n#W1"),
                Message(
                    role="assistant",
                    tool_calls=[ToolCallRecord(id="c1", name="cancel_pending_order", arguments={"order_id": "#W1"})],
                ),
                Message(role="tool", name="cancel_pending_order", tool_call_id="c1", content="x" * 900),
                Message(role="assistant", content="Done. Anything else?"),
            ]
        }
    )
    whole = t.transcript(10_000, per_message=100)
    lines = whole.splitlines()
    assert lines[0] == "[1] user: cancel order #W1"  # the system prompt is left out; newlines flattened
    assert lines[1] == '[2] assistant: -> cancel_pending_order({"order_id": "#W1"})'
    assert lines[2] == f"[3] tool cancel_pending_order: {'x' * 100}..."
    assert lines[3] == "[4] assistant: Done. Anything else?"
    start, end = t.transcript(120, per_message=100), t.transcript(120, per_message=100, keep="end")
    assert len(start) <= 120 and start.startswith("[1] user") and start.endswith("[... truncated]")
    assert len(end) <= 120 and end.startswith("[... truncated]") and end.endswith("Anything else?")
    assert t.transcript(10) == "[... trunc" and t.transcript(0) == ""  # a limit below the marker's length holds
