"""Strict tool calls: the grammar refuses every kind of call a small policy gets
wrong, and a sampler that holds a row to it never emits a refused token."""

import json

import pytest

from trace_gym.actions import ActionKind, parse_action
from trace_gym.llm import LLMError
from trace_gym.llm.local.sampling import RowSampler
from trace_gym.llm.local.strict_calls import CallGrammar, ground, strict_from_env
from trace_gym.tools import check_arguments

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "return_delivered_order_items",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "item_ids": {"type": "array", "items": {"type": "string"}},
                    "payment_method_id": {"type": "string"},
                    "quantity": {"type": "integer"},
                    "reason": {"type": "string", "enum": ["damaged", "unwanted"]},
                },
                "required": ["order_id", "item_ids", "payment_method_id"],
            },
        },
    },
    {"type": "function", "function": {"name": "list_all_product_types", "parameters": {"type": "object"}}},
]


def feed(text: str, messages=None, tools=TOOLS):
    """The reply's progress after ``text``, or None where the grammar refuses it
    (``messages``: the conversation that grounds its ids)."""
    progress = CallGrammar(tools).start(messages)
    for ch in text:
        if not progress.accepts(ch):
            return None
        progress.advance(ch)
    return progress


CALL = '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>'
RETURN = (
    '{"name": "return_delivered_order_items", "arguments": {"order_id": "#W1", '
    '"item_ids": ["1", "2"], "payment_method_id": "card_1", "quantity": 2, "reason": "damaged"}}'
)


@pytest.mark.parametrize(
    "text",
    [
        CALL,
        RETURN,
        '<tool_call>{"name": "list_all_product_types", "arguments": {}}</tool_call>',
        '<tool_call>{"name":"get_order_details","arguments":{"order_id":"a \\"quoted\\" \\u00e9"}}</tool_call>\n',
    ],
)
def test_calls_that_keep_to_their_schema_are_accepted_whole(text):
    progress = feed(text)
    assert progress is not None and not progress.in_call
    (call,) = parse_action(text).tool_calls
    schema = next(t for t in TOOLS if t["function"]["name"] == call.name)
    assert check_arguments(schema, call.arguments) == []


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "get_orderdetails"',  # no such tool
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1", "item_ids"',  # not its argument
        '<tool_call>{"name": "get_order_details", "arguments": {}',  # required argument missing
        '<tool_call>{"name": "return_delivered_order_items", "arguments": {"order_id": "#W1"}',  # two missing
        '<tool_call>{"arguments"',  # name first
        '<tool_call>{"name": "get_order_details", "extra"',  # a call has name and arguments only
        '{"name": "get_order_details", "arguments": {"order_id": "#W1", "order_id"',  # a key twice
        '{"name": "return_delivered_order_items", "arguments": {"quantity": "2"',  # a string for an integer
        '{"name": "return_delivered_order_items", "arguments": {"quantity": 2.5',  # not an integer
        '{"name": "return_delivered_order_items", "arguments": {"reason": "broken',  # not in its enum
        '{"name": "return_delivered_order_items", "arguments": {"item_ids": "1"',  # a string for an array
        '{"name": "return_delivered_order_items", "arguments": {"item_ids": [1',  # an integer for a string item
        '{"name": "get_order_details", "arguments": {"order_id": "a\nb',  # a raw control character
        '{"name": "get_order_details", "arguments": {"order_id": "\\x',  # not an escape
        '{"name": "get_order_details", "arguments": {"order_id": "#W1"}} and more',  # text after the call
        CALL + "<tool_call>",  # one call per reply
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}} Sure',  # text before the tag
    ],
)
def test_the_grammar_refuses_the_calls_a_small_policy_gets_wrong(text):
    assert feed(text) is None


def test_a_message_is_free_until_it_opens_a_call_which_is_then_held():
    progress = feed("I'm sorry, I can't do that")
    assert progress is not None and not progress.constrained and not progress.in_call
    assert feed('Let me look. <tool_call>{"name": "nope"') is None
    assert feed('Let me look. <tool_call>{"name": "get_order_details", "arguments": {"order_id"').in_call


CONVERSATION = [
    {"role": "system", "content": "Example: user id sara_doe_496, order #W0000000."},
    {"role": "user", "content": "Hi, my order #W2378156 came broken."},
    {"role": "assistant", "content": "Let me check order #W9999999."},
    {"role": "tool", "content": '{"items": [{"item_id": "6469567736"}], "payment_method_id": "credit_card_9513926"}'},
]


@pytest.mark.parametrize(
    "order, items, card, kept",
    [
        ("#W2378156", '["6469567736"]', "credit_card_9513926", True),  # all copied from the user and the tool
        ("#W0000000", '["6469567736"]', "credit_card_9513926", False),  # the system prompt's example
        ("#W9999999", '["6469567736"]', "credit_card_9513926", False),  # the agent's own words ground nothing
        ("W2378156", '["6469567736"]', "credit_card_9513926", False),  # its "#" dropped
        ("#W2378156", '["646956773"]', "credit_card_9513926", False),  # an id cut short
        ("#W2378156", '["6469567736"]', "credit_card_1", False),  # invented
    ],
)
def test_grounded_ids_are_copied_whole_from_the_users_and_the_tools_messages(order, items, card, kept):
    call = (
        '{"name": "return_delivered_order_items", "arguments": {"order_id": "%s", "item_ids": %s, '
        '"payment_method_id": "%s", "reason": "damaged"}}' % (order, items, card)
    )
    assert (feed(call, CONVERSATION) is not None) is kept
    assert feed(call) is not None  # schema-strict alone: any string is an id


def test_ids_are_free_where_the_conversation_holds_none_and_other_strings_always_are():
    opening = [{"role": "user", "content": "Hi, I want to return something."}]
    assert feed('{"name": "get_order_details", "arguments": {"order_id": "#W1"}}', opening) is not None
    anything = '{"name": "return_delivered_order_items", "arguments": {"reason": "unwanted"'
    assert feed(anything, CONVERSATION) is not None


def test_grounding_reads_ids_without_digits_and_json_results_as_their_values():
    """τ² airline's reservation ids can be all capitals; a JSON result's escapes are
    not read as text; an id may be a prefix of another, and held whole."""
    messages = [
        {"role": "user", "content": "My reservation is VAAOXJ, URGENT."},
        {"role": "tool", "content": json.dumps({"note": "x\nW2378156", "user": "josé_12", "orders": ["#W1", "#W12"]})},
        {"role": "tool", "content": [{"type": "text", "text": "card_7 ok"}]},
    ]
    assert ground(messages) == ("VAAOXJ", "URGENT", "W2378156", "josé_12", "#W1", "#W12", "card_7")
    order = '{"name": "get_order_details", "arguments": {"order_id": "%s"}}'
    assert [feed(order % i, messages) is not None for i in ("#W1", "#W12", "#W123", "nW2378156", "VAAOX")] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert ground([{"role": "user", "content": "Hi, I need help with my order."}]) == ()


def test_a_grounded_id_that_may_be_null_takes_null_or_a_grounded_id():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "find",
                "parameters": {"type": "object", "properties": {"user_id": {"type": ["string", "null"]}}},
            },
        }
    ]
    messages = [{"role": "user", "content": "I am sara_lee_123."}]
    call = '{"name": "find", "arguments": {"user_id": %s}}'
    assert feed(call % "null", messages, tools) is not None
    assert feed(call % '"sara_lee_123"', messages, tools) is not None
    assert feed(call % '"sara_doe_496"', messages, tools) is None
    assert feed(call % "12", messages, tools) is None


def test_strict_calls_are_switched_on_by_the_environment_or_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("TRACE_GYM_STRICT_TOOLS", raising=False)
    assert strict_from_env() is False
    monkeypatch.setenv("TRACE_GYM_STRICT_TOOLS", "1")
    assert strict_from_env() is True
    monkeypatch.setenv("TRACE_GYM_STRICT_TOOLS", "ids")
    assert strict_from_env() == "ids"
    monkeypatch.setenv("TRACE_GYM_STRICT_TOOLS", "maybe")
    with pytest.raises(LLMError, match="must be 1, ids or 0"):
        strict_from_env()


class Request:
    def __init__(self, temperature: float, seed: int, max_new_tokens: int = 400):
        self.temperature, self.seed, self.max_new_tokens = temperature, seed, max_new_tokens


@pytest.mark.parametrize("temperature, messages", [(0.0, None), (1.0, None), (1.0, CONVERSATION)])
def test_a_sampler_holding_rows_to_the_grammar_never_emits_a_refused_token(temperature, messages):
    """Random logits over the embedded tokenizer's vocabulary, on rows that have just
    opened a call: held rows write calls their schemas accept; free rows do not."""
    import torch
    from transformers import AutoTokenizer

    from trace_gym.llm.embedded import ensure_embedded_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    grammar = CallGrammar(TOOLS)
    stop = {tokenizer.eos_token_id}
    opened = "<tool_call>"
    rows = 4

    def play(held: bool) -> list[str]:
        progress = [grammar.start(messages) for _ in range(rows)]
        for p in progress:
            p.advance(opened)
        sampler = RowSampler(
            torch,
            [Request(temperature, seed) for seed in range(rows)],
            device="cpu",
            stop_ids=stop,
            pad_id=0,
            model_name="random",
            grammars=progress if held else None,
            pieces=pieces,
        )
        logits = torch.Generator().manual_seed(7)
        while not sampler.done:
            sampler(torch.randn(rows, len(pieces), generator=logits) * 3)
        return [opened + "".join(pieces[t] for t in s if t not in stop) for s in sampler.sampled]

    for text in play(held=True):
        assert feed(text, messages) is not None, text
        action = parse_action(text)
        if action.kind is ActionKind.TOOL_CALLS:  # (a row may run out of budget inside its call)
            (call,) = action.tool_calls
            schema = next(t for t in TOOLS if t["function"]["name"] == call.name)
            assert check_arguments(schema, call.arguments) == [], json.dumps(call.arguments)
    assert all(feed(text) is None for text in play(held=False))


def test_a_local_model_grounds_each_requests_ids_in_that_requests_own_messages(monkeypatch):
    from families import family_tokenizer, tiny_model

    from trace_gym.llm.local import LocalHF
    from trace_gym.llm.local import model as local_model

    held = []

    def sampler(*args, grammars=None, **kwargs):
        held.extend(grammars)
        return RowSampler(*args, grammars=grammars, **kwargs)

    monkeypatch.setattr(local_model, "RowSampler", sampler)
    tokenizer = family_tokenizer("embedded")
    backend = LocalHF.from_model(tiny_model(tokenizer), tokenizer, strict_tools="ids")
    mine = [{"role": "user", "content": "My order is #W2378156."}]
    theirs = [{"role": "user", "content": "Order #W1111111, please."}]
    backend.generate([mine, theirs], tools=TOOLS, max_new_tokens=2)
    assert [set(p.call["x-ids"].full) for p in held] == [{"#W2378156"}, {"#W1111111"}]
    held.clear()
    LocalHF.from_model(backend.model, tokenizer, strict_tools=True).generate([mine], tools=TOOLS, max_new_tokens=2)
    assert "x-ids" not in held[0].call  # held to the schema, ids free
    for wrong in ("yes", 1):
        with pytest.raises(LLMError, match="strict_tools must be False, True or 'ids'"):
            LocalHF.from_model(backend.model, tokenizer, strict_tools=wrong)
