"""trace/toolsandbox-v0 against ToolSandbox itself (the tool_sandbox package, live).

The reference for every score is ToolSandbox's own ``Scenario.play_and_evaluate``
driven by roles built on its ``BaseRole``: an agent role that plays the same
action texts the way its OpenAI agent turns model output into messages, and
its ``UnhelpfulAgent`` for the refusal.
"""

import json
import warnings

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401
from trace_gym.actions import format_tool_call, parse_action
from trace_gym.errors import UnknownTaskError, UserSimulatorError

pytestmark = pytest.mark.slow  # ToolSandbox builds its 1032 scenarios once per process (10-40 s)

FREDRIK = "9e137f06-916a-5310-8174-cf0b7e9f7054"
PETRUCCI = "a22e1984-6c6c-530c-8831-c3ea3b5138e7"
T = format_tool_call

# Correct action sequences, written from each scenario's milestones.
SCRIPTS = {
    "cellular_off": [T("set_cellular_service_status", {"on": False}), "Cellular service is turned off"],
    "get_cellular": [T("get_cellular_service_status", {}), "Cellular service is on"],
    "wifi_off": [T("set_wifi_status", {"on": False}), "Wifi is turned off"],
    "get_wifi": [T("get_wifi_status", {}), "Wifi is on"],
    "search_phone_number_with_name": [
        T("search_contacts", {"name": "Homer S"}),
        "I found Homer S's phone number: +10000000000",
    ],
    "search_name_with_relationship": [T("search_contacts", {"relationship": "boss"}), "Your boss is Homer S"],
    "search_relationship_with_phone_number": [
        T("search_contacts", {"phone_number": "+10000000000"}),
        "+10000000000 is your boss",
    ],
    "add_contact_with_name_and_phone_number": [
        T("add_contact", {"name": "Stephen Sondheim", "phone_number": "+19876543210"}),
        "Stephen Sondheim has been added to your contact",
    ],
    "remove_contact_with_id": [
        T("remove_contact", {"person_id": FREDRIK}),
        f"{FREDRIK} has been removed from your contact",
    ],
    "update_contact_with_id_and_phone_number": [
        T("modify_contact", {"person_id": FREDRIK, "phone_number": "+19876543210"}),
        f"{FREDRIK}'s  phone number have been updated to +19876543210",
    ],
    "remove_contact_by_phone": [
        T("search_contacts", {"phone_number": "+12453344098"}),
        T("remove_contact", {"person_id": FREDRIK}),
        "Phone number +12453344098 has been removed from your contact",
    ],
    "turn_on_wifi_low_battery_mode": [
        T("set_low_battery_mode_status", {"on": False}),
        T("set_wifi_status", {"on": True}),
        "Wifi has been turned on.",
    ],
    # Two calls in one turn: ToolSandbox replays them in every order, and one order fails.
    "turn_on_cellular_low_battery_mode": [
        '[{"name": "set_low_battery_mode_status", "arguments": {"on": false}}, '
        '{"name": "set_cellular_service_status", "arguments": {"on": true}}]',
        T("set_low_battery_mode_status", {"on": False}),
        T("set_cellular_service_status", {"on": True}),
        "Cellular service has been turned on.",
    ],
    "send_message_with_contact_content_cellular_off": [
        T("set_cellular_service_status", {"on": True}),
        T("search_contacts", {"name": "Fredrik Thordendal"}),
        T(
            "send_message_with_phone_number",
            {"phone_number": "+12453344098", "content": "How's the new album coming along"},
        ),
        "Your message to Fredrik Thordendal has been sent saying: How's the new album coming along",
    ],
    "update_contact_relationship_with_relationship": [
        T("search_contacts", {"relationship": "friend"}),
        [
            T("modify_contact", {"person_id": FREDRIK, "relationship": "enemy"}),
            T("modify_contact", {"person_id": PETRUCCI, "relationship": "enemy"}),
        ],
        "All your friends are now your enemies",
    ],
}
REFUSAL = "I am sorry, but I cannot assist with that."  # ToolSandbox's UnhelpfulAgent's words
REFUSAL_SCENARIOS = [
    "cellular_off",
    "search_phone_number_with_name",
    "remove_contact_by_phone",
    "find_days_till_holiday_insufficient_information",
    "remove_contact_by_phone_no_remove_contact_insufficient_information",
]


@pytest.fixture(scope="module")
def env():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = gym.make("trace/toolsandbox-v0")
    yield made
    made.close()


def _actions(script):
    """A script step is one action text, or a list of calls sent as one turn."""
    for step in script:
        if isinstance(step, list):
            calls = [parse_action(s).tool_calls[0] for s in step]
            yield json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls])
        else:
            yield step


def play_in_env(env, name, actions):
    env.reset(options={"task_id": name})
    reward, done, info = 0.0, False, {}
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        if done:
            break
    assert done, f"{name}: the scripted user should have ended the conversation"
    return reward, info["reward_info"]


def play_in_toolsandbox(env, name, actions, tmp_path, agent=None):
    """ToolSandbox's own play_and_evaluate of the same scenario object."""
    from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall, Function
    from tool_sandbox.common.execution_context import RoleType, get_current_context
    from tool_sandbox.common.message_conversion import Message, openai_tool_call_to_python_code
    from tool_sandbox.roles.base_role import BaseRole
    from tool_sandbox.roles.execution_environment import ExecutionEnvironment

    from trace_gym.targets.toolsandbox import LOCK, role_classes

    class ScriptAgent(BaseRole):
        role_type = RoleType.AGENT

        def __init__(self):
            self.queue, self.calls = list(actions), 0

        def respond(self, ending_index=None):
            messages = self.get_messages(ending_index=ending_index)
            self.messages_validation(messages)
            if self.filter_messages(messages)[-1].sender == RoleType.SYSTEM:
                return
            parsed = parse_action(self.queue.pop(0))
            if not parsed.is_tool_call:
                self.add_messages([Message(sender=RoleType.AGENT, recipient=RoleType.USER, content=parsed.content)])
                return
            names, out = set(self.get_available_tools()), []
            for call in parsed.tool_calls:
                self.calls += 1
                tool_call = ChatCompletionMessageToolCall(
                    id=f"tg_call_{self.calls}",
                    type="function",
                    function=Function(name=call.name, arguments=json.dumps(call.arguments)),
                )
                code = openai_tool_call_to_python_code(
                    tool_call, names, get_current_context().get_execution_facing_tool_name(call.name)
                )
                out.append(
                    Message(
                        sender=RoleType.AGENT,
                        recipient=RoleType.EXECUTION_ENVIRONMENT,
                        content=code,
                        openai_tool_call_id=tool_call.id,
                        openai_function_name=call.name,
                    )
                )
            self.add_messages(out)

    scenario = env.unwrapped.get_task(name)
    roles = {
        RoleType.AGENT: agent or ScriptAgent(),
        RoleType.USER: role_classes()[1](),
        RoleType.EXECUTION_ENVIRONMENT: ExecutionEnvironment(),
    }
    with LOCK:
        result = scenario.play_and_evaluate(roles=roles, output_directory=tmp_path, scenario_name=name)
    return result.evaluation_result


def test_default_split_is_the_playable_base_scenarios(env):
    core = env.unwrapped
    from trace_gym.targets.toolsandbox import catalogue

    base = [e for e in catalogue().entries.values() if e.variant == "base"]
    assert len(base) == 129
    assert len(catalogue().entries) == 1032
    assert set(core.task_ids) | set(core.excluded) == {e.name for e in base}
    live = {n for n, r in core.excluded.items() if r.startswith("live web API")}
    assert "find_stock_symbol_with_company_name" in live and "convert_currency" in live
    assert all(not catalogue().entries[n].live_tools for n in core.task_ids)
    assert all(not catalogue().entries[n].multi_turn for n in core.task_ids)  # scripted user: single-turn only
    assert len(SCRIPTS) >= 10 and set(SCRIPTS) <= set(core.task_ids)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripted_actions_score_exactly_as_toolsandbox_scores_them(env, name, tmp_path):
    actions = list(_actions(SCRIPTS[name]))
    reward, reward_info = play_in_env(env, name, actions)
    theirs = play_in_toolsandbox(env, name, actions, tmp_path)
    assert reward == theirs.similarity
    assert reward_info["details"]["milestone_similarity"] == theirs.milestone_similarity
    assert reward_info["details"]["minefield_similarity"] == theirs.minefield_similarity
    assert reward_info["details"]["turn_count"] == theirs.turn_count
    assert [m["similarity"] for m in reward_info["details"]["milestones"]] == [
        theirs.milestone_mapping[i][1] if i in theirs.milestone_mapping else 0.0
        for i in range(len(reward_info["details"]["milestones"]))
    ]
    assert 0.0 <= reward <= 1.0


def test_most_correct_scripts_are_perfect_scores(env):
    perfect = [name for name in SCRIPTS if play_in_env(env, name, list(_actions(SCRIPTS[name])))[0] == 1.0]
    assert len(perfect) >= 10, perfect


@pytest.mark.parametrize("name", REFUSAL_SCENARIOS)
def test_a_refusal_scores_what_toolsandbox_scores_it(env, name, tmp_path):
    from tool_sandbox.roles.unhelpful_agent import UnhelpfulAgent

    reward, info = play_in_env(env, name, [REFUSAL])
    theirs = play_in_toolsandbox(env, name, [], tmp_path, agent=UnhelpfulAgent())
    assert reward == theirs.similarity
    assert info["details"]["milestone_similarity"] == theirs.milestone_similarity


def test_a_wrong_action_scores_below_a_correct_one(env):
    right, _ = play_in_env(env, "wifi_off", list(_actions(SCRIPTS["wifi_off"])))
    wrong, info = play_in_env(env, "wifi_off", [T("set_wifi_status", {"on": True}), "Wifi is turned off"])
    assert right == 1.0 and wrong < 1.0
    assert "milestone_0" in info["failed_components"] and info["details"]["milestones"][0]["constrains"] == [
        "state:setting"
    ]


def test_a_minefield_hit_zeroes_the_score_as_toolsandbox_does(env, tmp_path):
    name = "remove_contact_by_phone_no_search_contacts_insufficient_information"
    actions = [
        T("remove_contact", {"person_id": FREDRIK}),
        "Phone number +12453344098 has been removed from your contact",
    ]
    reward, info = play_in_env(env, name, actions)
    assert info["details"]["minefields"][0]["constrains"] == ["tool_call:remove_contact"]
    assert info["components"]["minefields_avoided"] == 0.0 and reward == 0.0
    assert "minefields_avoided" in info["failed_components"]
    theirs = play_in_toolsandbox(env, name, actions, tmp_path)
    assert theirs.minefield_similarity > 0 and reward == theirs.similarity
    refused, info = play_in_env(env, name, [REFUSAL])
    assert info["components"]["minefields_avoided"] == 1.0


def test_bad_calls_come_back_in_toolsandbox_words(env):
    obs, info = env.reset(options={"task_id": "cellular_off"})
    assert obs == "Turn off cellular"
    assert [t["function"]["name"] for t in info["tools"]] == ["set_cellular_service_status"]

    obs, *_ = env.step(T("no_such_tool", {}))
    assert obs.startswith("Agent tool call agent_facing_tool_name='no_such_tool' is not a known allowed tool.")
    obs, *_ = env.step(T("set_cellular_service_status", {"on": "off"}))
    assert obs == "TypeError: Parameter 'on' is of type '<class 'str'>', but expected '<class 'bool'>'."
    obs, *_ = env.step('<tool_call>{"name": "set_cellular_service_status", "arguments": {"on": fals</tool_call>')
    assert (
        obs == """RuntimeError: '{"name": "set_cellular_service_status", "arguments": {"on": fals' is not valid JSON"""
    )
    obs, reward, terminated, truncated, step_info = env.step(T("set_cellular_service_status", {}))
    assert obs == "TypeError: missing a required argument: 'on'"
    assert not (terminated or truncated) and step_info["tool_results"][0]["error"]
    # None of it derailed the episode: the right call still scores.
    env.step(T("set_cellular_service_status", {"on": False}))
    *_, terminated, _, step_info = env.step("Cellular service is turned off")
    assert terminated and step_info["reward_info"]["reward"] == 1.0


def test_the_host_words_misnamed_calls_exactly_as_live_toolsandbox(env):
    """Synthesized envs for this target get misnamed calls answered by the host (manifest [call_errors])."""
    from trace_gym.registry import get_entry
    from trace_gym.targets.toolsandbox import catalogue
    from trace_gym.tools import call_error, load_frozen_tools

    entry = get_entry("trace/toolsandbox-v0")
    tools, style = load_frozen_tools(entry.tools_path), entry.call_error_style()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        core = gym.make("trace/toolsandbox-v0", split="all").unwrapped
    scenarios, checked = catalogue().scenarios, 0
    unscrambled = [t for t in core.task_ids if not scenarios[t].starting_context.tool_augmentation_list]
    for schema in tools + [{"type": "function", "function": {"name": "no_such_tool", "parameters": {}}}]:
        name = schema["function"]["name"]
        offering = next((t for t in unscrambled if name in scenarios[t].starting_context.tool_allow_list), None)
        if offering is None and name != "no_such_tool":
            continue  # offered only beside live-web tools (get_current_location): never played
        for arguments in ({"zzz": 1}, {}):
            core.reset(options={"task_id": offering or unscrambled[0]})
            theirs, *_ = core.step(T(name, arguments))
            ours = call_error(tools, name, arguments, style)
            if ours is None:  # names right: ToolSandbox runs it
                assert "unexpected keyword" not in theirs and "missing a required" not in theirs, theirs
            elif name == "no_such_tool":
                assert theirs.startswith(ours)  # ToolSandbox goes on to list the tools it offered
            else:
                assert ours == theirs
            checked += 1
    assert checked > 40


def test_variants_are_selectable_by_split(env):
    core = gym.make("trace/toolsandbox-v0", split="tool_name_scrambled").unwrapped
    name = "cellular_off_3_distraction_tools_tool_name_scrambled"
    assert name in core.task_ids and all(n.endswith("_tool_name_scrambled") for n in core.task_ids)
    obs, info = core.reset(options={"task_id": name})
    names = [t["function"]["name"] for t in info["tools"]]
    assert "set_cellular_service_status" not in names and len(names) == 4  # scrambled: the agent sees other names
    assert gym.make("trace/toolsandbox-v0", split="all").unwrapped.task_ids.__len__() > len(core.task_ids)
    with pytest.raises(UnknownTaskError, match="no split"):
        gym.make("trace/toolsandbox-v0", split="nope")
    with pytest.raises(ValueError, match="user must be one of 'scripted', 'llm'"):
        gym.make("trace/toolsandbox-v0", user="human")


def test_live_web_and_multi_turn_scenarios_say_why_they_are_not_played(env):
    core = env.unwrapped
    with pytest.raises(UnknownTaskError, match="RapidAPI"):
        core.reset(options={"task_id": "convert_currency"})
    multi = next(n for n, r in core.excluded.items() if r.startswith("multi-turn"))
    with pytest.raises(UnknownTaskError, match="LLM user"):
        core.reset(options={"task_id": multi})
    with pytest.warns(Warning, match="never called"):
        gym.make("trace/toolsandbox-v0")


def test_the_llm_user_needs_an_endpoint(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("TRACE_GYM_USER_MODEL", raising=False)
    with pytest.raises(UserSimulatorError, match="OpenAI-compatible endpoint"):
        gym.make("trace/toolsandbox-v0", user="llm")


def test_multi_turn_scenarios_play_with_toolsandbox_llm_user_through_any_endpoint(env):
    from openai_double import OpenAIDouble

    def answer(body):
        said = body["messages"][-1]["content"]  # the agent's last message, as the simulated user reads it
        if said == "Who should I send it to, and what should it say?":
            return {"content": "Fredrik Thordendal, and say: How's the new album coming along"}
        return {"tool_calls": [{"name": "end_conversation", "arguments": {}}]}

    with OpenAIDouble(answer, key="k") as server, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        core = gym.make(
            "trace/toolsandbox-v0", user="llm", user_model="double", user_base_url=server.base_url, user_api_key="k"
        ).unwrapped
        multi = [n for n in core.task_ids if core.scenario_entry(n).multi_turn]
        assert multi, "with an LLM user the multi-turn scenarios are in the split"
        name = "send_message_with_contact_content_cellular_off_multiple_user_turn"
        assert name in multi
        core.reset(options={"task_id": name})
        obs, _, terminated, _, _ = core.step("Who should I send it to, and what should it say?")
        assert obs == "Fredrik Thordendal, and say: How's the new album coming along" and not terminated
        *_, terminated, _, info = core.step("Sorry, I could not send it.")
        assert terminated and info["reward_info"]["termination_reason"] == "user_stop"
        assert 0.0 <= info["reward_info"]["reward"] < 1.0
        first = server.requests[0]
        assert first["model"] == "double" and first["messages"][0]["role"] == "system"
        assert any(t["function"]["name"] == "end_conversation" for t in first.get("tools", []))


def test_an_unreachable_user_endpoint_is_a_user_simulator_error(env):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        core = gym.make(
            "trace/toolsandbox-v0", user="llm", user_model="m", user_base_url=f"http://127.0.0.1:{port}/v1"
        ).unwrapped
    core.reset(options={"task_id": "cellular_off"})
    with pytest.raises(UserSimulatorError, match="LLM user could not answer"):
        core.step("Done.")
