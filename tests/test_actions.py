import json
import random

import pytest

from trace_gym.actions import ToolCall, format_tool_call, parse_action


def test_bare_json_call():
    a = parse_action('{"name": "get_order_details", "arguments": {"order_id": "#W1"}}')
    assert a.kind == "tool_calls"
    assert a.tool_calls == (ToolCall("get_order_details", {"order_id": "#W1"}),)


def test_tool_call_blocks_several_calls_and_thought():
    text = (
        "Let me look both up.\n"
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    a = parse_action(text)
    assert [c.name for c in a.tool_calls] == ["a", "b"]
    assert a.thought == "Let me look both up."


def test_unclosed_block_at_end_is_still_a_call():
    a = parse_action('<tool_call>{"name": "a", "arguments": {}}')
    assert a.kind == "tool_calls" and a.tool_calls[0].name == "a"


def test_a_closing_tag_the_token_limit_cut_short_still_closes_the_call():
    for cut in ("</", "</tool", "</tool_call"):
        action = parse_action('<tool_call>{"name": "cancel", "arguments": {"order_id": "#W1"}}' + cut)
        assert action.is_tool_call and action.tool_calls[0].arguments == {"order_id": "#W1"}, cut
    for junk in ("}", "</tool_cal x", "</tol"):  # anything else after the call is still the model's mistake
        assert parse_action('<tool_call>{"name": "cancel", "arguments": {}}' + junk).kind == "malformed", junk


def test_openai_style_string_arguments_and_llama_parameters():
    assert parse_action('{"name": "f", "arguments": "{\\"k\\": 2}"}').tool_calls[0].arguments == {"k": 2}
    assert parse_action('{"name": "f", "parameters": {"k": 3}}').tool_calls[0].arguments == {"k": 3}
    nested = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert parse_action(json.dumps(nested)).tool_calls[0].name == "f"


def test_json_list_and_fenced_block():
    assert len(parse_action('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]').tool_calls) == 2
    assert parse_action('```json\n{"name": "a", "arguments": {"q": "x"}}\n```').tool_calls[0].arguments == {"q": "x"}


def test_plain_message_and_json_without_name_is_a_message():
    assert parse_action("Hello, how can I help?").kind == "message"
    assert parse_action('{"total": 3}').kind == "message"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"name": "a", "arguments": {"x": 1}', "not valid JSON"),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
        ('{"name": "a", "arguments": "{oops"}', "string that is not JSON"),
        ('{"name": "a", "args": {}}', "unexpected keys"),
        ("<tool_call></tool_call>", "invalid <tool_call>"),
        ("   ", "empty action"),
    ],
)
def test_malformed_calls_are_explained_not_raised(text, fragment):
    a = parse_action(text)
    assert a.kind == "malformed"
    assert fragment in a.error


def test_never_raises_on_random_text():
    rng = random.Random(0)
    alphabet = '{}[]":,<>/ tool_call name arguments 0123456789abc\n\\'
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        assert parse_action(text).kind in ("tool_calls", "message", "malformed")
    assert parse_action(None).kind == "malformed"  # type: ignore[arg-type]


def test_format_round_trips():
    text = format_tool_call("cancel", {"order_id": "#W9", "reason": "no longer needed"})
    assert parse_action(text).tool_calls[0] == ToolCall("cancel", {"order_id": "#W9", "reason": "no longer needed"})
