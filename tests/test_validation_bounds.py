"""The validator's own limits: hostile envs are judged in bounded time, a
validation report goes stale when the target's frozen interface changes, and
the result-shape check accepts what tau2 itself answers."""

import json
import shutil

import pytest

from test_validation import ORDER_LOOKUP, QUICK, variant
from trace_gym.errors import TraceGymError
from trace_gym.registry import get_entry
from trace_gym.result_shapes import example_result, load_result_shapes, result_problems
from trace_gym.validation import ValidationConfig, validate

TWO_MINUTES = 120.0


@pytest.mark.slow
def test_a_spinning_reset_fails_after_one_time_out_per_check_and_validation_ends_in_bounded_time(tmp_path):
    folder = variant(
        tmp_path, {"rng = random.Random(seed)": "rng = random.Random(seed)\n        while True:\n            pass"}
    )
    timeout = 2.0  # the default 10 s would judge alike, five times slower
    report = validate(folder, backend="bwrap", write=False, config=ValidationConfig(call_timeout_s=timeout))
    checks = {c.name: c for c in report.checks}
    reset = checks["reset_every_seed"]
    assert reset.passed is False and "stopped at the first failing seed" in reset.evidence
    assert reset.seconds < 2 * timeout, reset.seconds  # one call time-out, not one per seed (100 by default)
    assert checks["interface_fidelity"].passed is False and checks["interface_fidelity"].seconds < 2 * timeout
    assert checks["solvable"].passed is False and "first decisive failure" in checks["solvable"].evidence
    assert "stopped at the first decisive failure" in checks["robustness"].evidence  # not one time-out per probe
    # no check pays more than one time-out, so the whole run is bounded by one per check
    assert not {c.name: c.seconds for c in report.checks if c.seconds >= 2 * timeout}, report.table()
    assert report.wall_s < len(report.checks) * 2 * timeout, report.table()


def test_a_call_time_out_must_be_positive():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(TraceGymError, match="call_timeout_s must be positive"):
            ValidationConfig(call_timeout_s=bad)


def test_an_absurd_max_steps_that_never_ends_fails_termination_under_the_validators_cap(tmp_path):
    folder = variant(
        tmp_path,
        {
            "max_steps = 6": "max_steps = 10**9",
            'return {"observation": "Thanks!", "done": True}': 'return {"observation": "Thanks!", "done": False}',
        },
    )
    report = validate(folder, backend="bwrap", config=QUICK, write=False)
    assert report.wall_s < TWO_MINUTES
    termination = next(c for c in report.checks if c.name == "termination")
    assert termination.passed is False
    assert "declares max_steps 1000000000, above the validator's cap of 100" in termination.evidence
    assert "without the env ending them" in termination.evidence


def test_the_time_budget_fails_the_running_check_and_skips_the_rest():
    """A spent budget (here: none at all) fails the check that meets it and skips the rest."""
    report = validate(ORDER_LOOKUP, backend="bwrap", write=False, config=ValidationConfig(seeds=40, time_budget_s=0.0))
    assert not report.passed
    names = [c.name for c in report.checks]
    fidelity = report.checks[names.index("interface_fidelity")]
    assert fidelity.passed is False and "time budget (0s) ran out" in fidelity.evidence, report.table()
    assert all(c.passed is True for c in report.checks[: names.index("interface_fidelity")])  # no sandbox needed
    after = report.checks[names.index("interface_fidelity") + 1 :]
    assert after and all(c.passed is None and "time budget ran out" in c.evidence for c in after)


def test_a_report_goes_stale_when_the_targets_frozen_interface_changes(tmp_path, monkeypatch):
    registry = tmp_path / "registry"
    target = registry / "retail-copy"
    shutil.copytree(get_entry("trace/tau2-retail-v0").path, target)
    manifest = target / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('id = "trace/tau2-retail-v0"', 'id = "trace/test-retail-copy-v0"'))
    env = registry / "order-lookup"
    shutil.copytree(ORDER_LOOKUP, env)
    (env / "manifest.toml").write_text(
        (env / "manifest.toml").read_text().replace("trace/tau2-retail-v0", "trace/test-retail-copy-v0")
    )
    monkeypatch.setenv("TRACE_GYM_REGISTRY_PATH", str(registry))

    report = validate(
        env, backend="bwrap", config=ValidationConfig(seeds=20, floor_seeds=5, determinism_seeds=1, seed=0)
    )
    assert report.passed, report.table()
    entry = get_entry("trace/test-order-lookup-v0")
    assert entry.validation_status() == "passed"

    shapes = json.loads((target / "results.json").read_text())
    shapes["tools"]["get_order_details"]["schema"]["properties"]["status"]["enum"].append("lost")
    (target / "results.json").write_text(json.dumps(shapes))
    assert entry.validation_status() == "stale"  # env.py did not change; what it is judged against did

    shutil.copy(get_entry("trace/tau2-retail-v0").path / "results.json", target / "results.json")
    assert entry.validation_status() == "passed"
    tools = json.loads((target / "tools.json").read_text())
    tools[0]["function"]["description"] += " "
    (target / "tools.json").write_text(json.dumps(tools, indent=2))
    assert entry.validation_status() == "stale"


def test_result_problems_name_what_differs_from_the_target():
    shapes = load_result_shapes(get_entry("trace/tau2-retail-v0").path)
    order = example_result(shapes, "get_order_details")
    assert result_problems(shapes, "get_order_details", json.dumps(order)) == []
    renamed = {("orderId" if k == "order_id" else k): v for k, v in order.items()}
    problem = result_problems(shapes, "get_order_details", json.dumps(renamed))[0]
    assert "missing 'order_id'" in problem and "fields the target never writes: 'orderId'" in problem
    assert (
        "expected number"
        in result_problems(
            shapes,
            "get_order_details",
            json.dumps(
                dict(
                    order, items=[{"name": "Lamp", "product_id": "1", "item_id": "2", "price": "12.50", "options": {}}]
                )
            ),
        )[0]
    )
    assert "not JSON" in result_problems(shapes, "get_order_details", "Your order is pending.")[0]
    assert result_problems(shapes, "get_order_details", "Error: Order not found") == []
    assert result_problems(shapes, "find_user_id_by_email", "sara_doe_496") == []  # tau2 sends this str as is
    assert (
        "none of"
        in result_problems(
            shapes,
            "get_user_details",
            json.dumps(
                dict(
                    example_result(shapes, "get_user_details"), payment_methods={"x": {"source": "bitcoin", "id": "x"}}
                )
            ),
        )[0]
    )
