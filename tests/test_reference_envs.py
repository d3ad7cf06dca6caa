"""The reference envs judge what the agent did, also where the kit refuses a call: a
mistyped value that makes the kit raise is answered as the target answers it, and the
env still counts the call it was (found by review, when three envs had moved their
bookkeeping after the kit's answer)."""

import json

import pytest

from trace_gym.registry import make


def call_of(action: str) -> dict:
    """The call in an oracle's action text (``<tool_call>{...}</tool_call>``); {} for a message."""
    text = action.strip()
    return json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>")) if "<tool_call>" in text else {}


def mistyped(action: str) -> str:
    """``action`` with its order id given as a list."""
    call = call_of(action)
    call["arguments"]["order_id"] = [call["arguments"]["order_id"]]
    return "<tool_call>%s</tool_call>" % json.dumps(call)


@pytest.mark.parametrize(
    "env_id, seed, tool, component, reason",
    [
        # a broken call costs the clean-run bonus
        ("trace/well-formed-calls-v0", 0, "get_order_details", "no_broken_calls", "1 mistyped"),
        # a write before the user confirmed breaks the protocol
        ("trace/policy-adherence-v0", 1, "modify_pending_order_address", "followed_protocol", "order was pending"),
        # a cancel before reading the account and the order was not verified
        ("trace/verify-preconditions-v0", 0, "cancel_pending_order", "verified_before_write", "case"),
    ],
)
def test_a_call_the_kit_refuses_still_counts(sandbox_backend, env_id, seed, tool, component, reason):
    env = make(env_id, backend=sandbox_backend)
    try:
        env.reset(seed=seed)
        oracle = env.unwrapped.oracle_actions()
        env.reset(seed=seed)
        broken = next(a for a in oracle if call_of(a).get("name") == tool)
        observation, *_ = env.step(mistyped(broken))
        assert observation.startswith("Error: "), observation  # answered as the target answers it
        for action in oracle:
            *_, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        info = env.unwrapped.reward_info
        assert info["components"][component] == 0.0 and reason in info["reason"], info
    finally:
        env.close()


def test_a_return_the_kit_raises_on_is_the_return_graded(sandbox_backend):
    """tool-precision grades the last return tried, also one whose value made the kit
    raise (its payment method as a list): the agent made that call, and the user, who
    saw it answered, takes it as the return and ends the call."""
    env = make("trace/tool-precision-v0", backend=sandbox_backend)
    try:
        env.reset(seed=0)
        *reads, write, _ = env.unwrapped.oracle_actions()
        env.reset(seed=0)
        for action in reads:
            env.step(action)
        call = call_of(write)
        call["arguments"]["payment_method_id"] = [call["arguments"]["payment_method_id"]]
        observation, *_ = env.step("<tool_call>%s</tool_call>" % json.dumps(call))
        assert observation.startswith("Error: "), observation
        *_, terminated, _, _ = env.step("Your return is requested.")
        assert terminated, "the user did not take the refused return as the return"
        parts = env.unwrapped.reward_info["components"]
        assert parts["write_called"] == 1.0 and parts["item_ids_exact"] == 1.0, parts
        assert parts["payment_method_id_exact"] == 0.0, parts
    finally:
        env.close()


def test_a_call_the_tool_refuses_costs_well_formed_calls_its_clean_run_bonus(sandbox_backend):
    """valid_tool_arguments is served by well-formed-calls: an order id that names no
    record is refused by the tool, and the run that made it is not a clean one, though
    the oracle then makes every call right."""
    env = make("trace/well-formed-calls-v0", backend=sandbox_backend)
    try:
        env.reset(seed=0)
        oracle = env.unwrapped.oracle_actions()
        env.reset(seed=0)
        read = call_of(next(a for a in oracle if call_of(a).get("name") == "get_order_details"))
        read["arguments"]["order_id"] = "#W0000000"
        observation, *_ = env.step("<tool_call>%s</tool_call>" % json.dumps(read))
        assert observation.startswith("Error: "), observation
        for action in oracle:
            *_, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        info = env.unwrapped.reward_info
        assert info["components"]["return_made"] == 1.0 and info["components"]["no_broken_calls"] == 0.0, info
        assert "1 refused" in info["reason"], info
    finally:
        env.close()
