"""Issue 10, item 10: an exception raised by env code inside a tool call is
answered as the target answers it (τ²: ``Error: <message>``, checked against
live tau2), its traceback kept as evidence; ``robustness`` rejects only what the
target would not survive."""

import json

import pytest

from test_validation import variant
from trace_gym.errors import TraceGymError
from trace_gym.sandbox.env import SandboxedEnv

LOOKUP = 'if action["arguments"].get("order_id") != self.order_id:'


def call(name: str, arguments: dict) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def test_an_exception_inside_a_tool_is_answered_as_tau2_answers_it(sandbox_backend, tmp_path):
    from tau2.data_model.message import ToolCall
    from tau2.registry import registry

    live = registry.get_env_constructor("retail")()
    theirs = live.get_response(ToolCall(id="x", name="get_order_details", arguments={"order_id": ["x"]})).content
    # The env looks the id up in a dict, as tau2's own tool does.
    folder = variant(tmp_path, {LOOKUP: 'if {self.order_id: 1}.get(action["arguments"].get("order_id")) is None:'})
    env = SandboxedEnv(folder, backend=sandbox_backend)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("get_order_details", {"order_id": ["x"]}))
    assert obs == theirs == "Error: unhashable type: 'list'"
    assert not terminated and env.worker.alive
    record = env.tool_exceptions[-1]
    assert record["exception"] == "TypeError" and record["tool"] == "get_order_details"
    assert 'File "env.py"' in record["traceback"]
    assert "Traceback" not in obs and "env.py" not in obs  # the agent sees what tau2 shows, nothing more
    obs, *_ = env.step(call("get_order_details", {"order_id": "#W0000000"}))  # the worker carries on
    assert obs.startswith("Error: Order not found") or obs.startswith("{")
    env.close()


def test_an_exception_outside_a_tool_call_is_still_an_error(sandbox_backend, tmp_path):
    folder = variant(tmp_path, {'self.answer = action["content"]': 'self.answer = action["content"].missing_method()'})
    env = SandboxedEnv(folder, backend=sandbox_backend)
    env.reset(seed=0)
    with pytest.raises(TraceGymError, match="AttributeError"):
        env.step("The order is pending.")
    env.close()


@pytest.mark.slow
def test_robustness_accepts_tool_exceptions_and_keeps_their_tracebacks(sandbox_backend, tmp_path):
    from trace_gym.validation import ValidationConfig, validate

    folder = variant(tmp_path, {LOOKUP: 'if action["arguments"]["order_id"].upper() != self.order_id:'})
    report = validate(
        folder,
        backend=sandbox_backend,
        config=ValidationConfig(seeds=40, floor_seeds=12, determinism_seeds=2, seed=0),
        write=False,
    )
    robustness = next(c for c in report.checks if c.name == "robustness")
    assert robustness.passed, robustness.evidence
    assert "raised inside a tool and were answered as trace/tau2-retail-v0 answers" in robustness.evidence
    assert any('File "env.py"' in e["traceback"] for e in robustness.details["tool_exceptions"])
