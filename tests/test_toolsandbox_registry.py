"""trace/toolsandbox-v0 in the registry and the milestone analyst; the slow
tests at the end run the CLI end to end on the live package."""

import json
import warnings
from pathlib import Path

import pytest

from conftest import run_cli
from trace_gym.identification import make_analyst
from trace_gym.identification.milestone import MILESTONE_CAPABILITIES, MilestoneAnalyst
from trace_gym.identification.stats import LACKING, NOT_APPLICABLE, PRESENT
from trace_gym.registry import get_entry
from trace_gym.tools import call_error, canonical_tools, load_frozen_tools
from trace_gym.trajectory import Message, ToolCallRecord, Trajectory

ENV_ID = "trace/toolsandbox-v0"


def test_the_target_is_registered_with_frozen_tools():
    entry = get_entry(ENV_ID)
    assert entry.kind == "target" and entry.entry_point == "trace_gym.targets.toolsandbox:ToolSandboxEnv"
    names = [t["function"]["name"] for t in load_frozen_tools(entry.tools_path)]
    assert "set_cellular_service_status" in names and "search_contacts" in names
    assert "end_conversation" not in names  # the user's tool, never the agent's
    assert not {"search_stock", "convert_currency", "search_lat_lon"} & set(names)  # live web: never offered


def test_envs_new_scaffolds_an_env_for_toolsandbox(tmp_path):
    result = run_cli(
        "envs",
        "new",
        "contact-lookup",
        "--target",
        ENV_ID,
        "--dir",
        str(tmp_path),
        "--capability",
        "exact lookups",
        "--description",
        "Use exactly the value the user gives.",
    )
    assert result.returncode == 0, result.stderr
    env_py = (tmp_path / "contact-lookup" / "env.py").read_text()
    tools = {t["function"]["name"] for t in load_frozen_tools(get_entry(ENV_ID).tools_path)}
    scaffolded = env_py.split('TOOLS = ["', 1)[1].split('"', 1)[0]
    assert scaffolded in tools
    assert f'target = "{ENV_ID}"' in (tmp_path / "contact-lookup" / "manifest.toml").read_text()


def test_the_host_words_misnamed_calls_as_toolsandbox_does():
    """What the manifest's [call_errors] makes the host say; the live words are checked in test_toolsandbox.py."""
    entry = get_entry(ENV_ID)
    tools, style = load_frozen_tools(entry.tools_path), entry.call_error_style()
    assert call_error(tools, "no_such_tool", {}, style).startswith(
        "Agent tool call agent_facing_tool_name='no_such_tool' is not a known allowed tool."
    )
    assert (
        call_error(tools, "get_wifi_status", {"zzz": 1}, style) == "TypeError: got an unexpected keyword argument 'zzz'"
    )
    assert call_error(tools, "remove_contact", {}, style) == "TypeError: missing a required argument: 'person_id'"
    # Python's signature binding, as ToolSandbox runs calls: the first missing argument, before any unexpected one.
    assert call_error(tools, "add_contact", {"zzz": 1}, style) == "TypeError: missing a required argument: 'name'"
    assert call_error(tools, "get_wifi_status", {}, style) is None


def episode(milestones, minefields=(), categories=("SINGLE_USER_TURN",), messages=None, eid="e1"):
    reward = (
        0.0
        if any(m["similarity"] > 0 for m in minefields)
        else (sum(m["similarity"] for m in milestones) / len(milestones) if milestones else 1.0)
    )
    return Trajectory(
        episode_id=eid,
        env_id=ENV_ID,
        task_id="t",
        agent="test",
        messages=messages or [Message(role="user", content="hi")],
        reward=reward,
        terminated=True,
        truncated=False,
        steps=1,
        started_at="2026-01-01T00:00:00",
        wall_s=0.1,
        reward_info={
            "reward": reward,
            "details": {"milestones": list(milestones), "minefields": list(minefields), "categories": list(categories)},
        },
    )


def ms(index, similarity, *constrains):
    return {"index": index, "similarity": similarity, "snapshot_index": None, "constrains": list(constrains)}


def labels_of(trajectory):
    return {label.capability: label.label for label in MilestoneAnalyst().label(trajectory)}


def test_milestones_met_and_missed_become_labels():
    got = labels_of(
        episode(
            [ms(0, 1.0, "tool_call:search_contacts"), ms(1, 1.0, "state:contact"), ms(2, 0.4, "message_to_user")],
            categories=["CANONICALIZATION", "SINGLE_USER_TURN"],
        )
    )
    assert set(got) == set(MILESTONE_CAPABILITIES)
    assert got["right_tool_calls"] == PRESENT and got["reaches_required_state"] == PRESENT
    assert got["reports_result_to_user"] == LACKING
    assert got["canonicalizes_arguments"] == LACKING  # its scenario was not solved
    assert got["resolves_state_dependencies"] == NOT_APPLICABLE and got["avoids_unwarranted_actions"] == NOT_APPLICABLE


def test_a_minefield_hit_is_lacking_and_a_miss_present():
    hit = labels_of(
        episode([ms(0, 1.0, "message_to_user")], [ms(0, 1.0, "tool_call:remove_contact")], ["INSUFFICIENT_INFORMATION"])
    )
    assert hit["avoids_unwarranted_actions"] == LACKING
    clean = labels_of(
        episode([ms(0, 1.0, "message_to_user")], [ms(0, 0.0, "tool_call:remove_contact")], ["STATE_DEPENDENCY"])
    )
    assert clean["avoids_unwarranted_actions"] == PRESENT and clean["resolves_state_dependencies"] == PRESENT


def test_failed_and_malformed_calls_come_from_the_transcript():
    messages = [
        Message(role="user", content="Turn off wifi"),
        Message(role="assistant", content="<tool_call>{bad", raw="<tool_call>{bad", error=True),
        Message(role="assistant", tool_calls=[ToolCallRecord(id="c1", name="set_wifi_status", arguments={"on": "no"})]),
        Message(
            role="tool", tool_call_id="c1", name="set_wifi_status", content="TypeError: Parameter 'on' ...", error=True
        ),
    ]
    got = labels_of(episode([ms(0, 0.0, "state:setting")], messages=messages))
    assert got["valid_tool_arguments"] == LACKING and got["well_formed_calls"] == LACKING
    assert labels_of(episode([ms(0, 1.0, "state:setting")]))["valid_tool_arguments"] == NOT_APPLICABLE


def test_the_milestone_analyst_refuses_episodes_without_milestones():
    from trace_gym.errors import TraceGymError

    plain = episode([])
    plain.reward_info = {"reward": 1.0}
    with pytest.raises(TraceGymError, match="milestone analyst needs ToolSandbox"):
        MilestoneAnalyst().label(plain)
    assert isinstance(make_analyst("milestone"), MilestoneAnalyst)


@pytest.mark.slow
def test_frozen_tool_schemas_equal_the_live_package():
    from trace_gym.freeze import live_tools

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        live = live_tools(ENV_ID)
    assert canonical_tools(load_frozen_tools(get_entry(ENV_ID).tools_path)) == canonical_tools(live)


@pytest.mark.slow
def test_frozen_result_shapes_equal_the_live_package():
    from trace_gym.freeze import live_result_shapes
    from trace_gym.result_shapes import load_result_shapes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        live = live_result_shapes(ENV_ID)
    assert load_result_shapes(get_entry(ENV_ID).path) == json.loads(json.dumps(live))
    assert live["tools"]["set_wifi_status"] == {"format": "text", "schema": {"type": "null"}}


@pytest.mark.slow
def test_rollout_random_on_the_default_split_then_identify_with_milestones(tmp_path):
    """The default split offline through the CLI; the milestone analyst on its trajectories
    (with correct episodes beside them, since a random agent solves nothing to contrast with)."""
    import gymnasium as gym

    import trace_gym  # noqa: F401
    from test_toolsandbox import SCRIPTS, _actions
    from trace_gym.rollout import Episode, run_episode
    from trace_gym.store import TrajectoryStore, read_trajectories

    out = tmp_path / "random.jsonl"
    result = run_cli("rollout", "--env", ENV_ID, "--agent", "random", "--out", str(out), "--no-progress", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    random_runs = read_trajectories(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = gym.make(ENV_ID)
    assert summary["episodes"] == len(random_runs) == len(env.unwrapped.task_ids) > 50
    assert all("milestones" in t.reward_info["details"] for t in random_runs)
    assert all(0.0 <= t.reward <= 1.0 for t in random_runs)

    class Scripted:
        name, model, adapter = "scripted", None, None

        def reset(self, observation, info, env=None):
            self.queue = list(_actions(SCRIPTS[info["task_id"]]))

        def act(self, observation):
            return self.queue.pop(0)

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(out.read_text())
    store = TrajectoryStore(mixed, resume=True)
    for task in SCRIPTS:
        store.append(run_episode(env, Scripted(), ENV_ID, Episode(task, 1, 7)))
    store.close()
    ident = run_cli(
        "identify", "--trajectories", str(mixed), "--analyst", "milestone", "--out", str(tmp_path / "ident")
    )
    assert ident.returncode == 0, ident.stderr[-2000:]
    report = json.loads((tmp_path / "ident" / "capabilities.json").read_text())
    assert report["analyst"]["analyst"] == "milestone" and report["analyst"]["calls"] == 0
    assert {c["name"] for c in report["candidates"]} <= set(MILESTONE_CAPABILITIES)
    assert report["selected"], "random failures against solved scripts must show some capability gap"
    assert Path(tmp_path / "ident" / "report.md").exists()
