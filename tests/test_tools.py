from pathlib import Path

import pytest

from trace_gym.tools import canonical_tools, check_arguments, load_frozen_tools, select_tools, tools_hash

SCHEMA = {
    "type": "function",
    "function": {
        "name": "get_order",
        "description": "d",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["order_id"],
        },
    },
}


def test_canonical_form_ignores_key_order_and_list_order():
    other = {"function": dict(reversed(list(SCHEMA["function"].items()))), "type": "function"}
    second = {"type": "function", "function": {"name": "a", "parameters": {}}}
    assert canonical_tools([SCHEMA, second]) == canonical_tools([second, other])
    assert tools_hash([SCHEMA]) == tools_hash([other])


def test_canonical_form_sees_a_renamed_parameter():
    renamed = {
        "type": "function",
        "function": {
            **SCHEMA["function"],
            "parameters": {"type": "object", "properties": {"orderId": {"type": "string"}}, "required": ["orderId"]},
        },
    }
    assert canonical_tools([SCHEMA]) != canonical_tools([renamed])


def test_check_arguments():
    assert check_arguments(SCHEMA, {"order_id": "#W1"}) == []
    problems = check_arguments(SCHEMA, {"orderid": "x", "n": True})
    assert "missing required argument 'order_id'" in problems
    assert any("unknown argument 'orderid'" in p for p in problems)
    assert any("'n' should be integer, got bool" in p for p in problems)


def test_select_tools_and_frozen_files():
    registry = Path(__file__).resolve().parents[1] / "env_registry"
    tools = load_frozen_tools(registry / "tau2-retail" / "tools.json")
    picked = select_tools(tools, ["get_order_details", "get_user_details"])
    assert [t["function"]["name"] for t in picked] == ["get_order_details", "get_user_details"]
    with pytest.raises(KeyError, match="not tools of the target: nope"):
        select_tools(tools, ["nope"])
