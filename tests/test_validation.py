"""The validator: good envs pass, and each flawed env is rejected by the right named check."""

import json
import shutil

import pytest

from conftest import FIXTURE_ENVS, run_cli
from trace_gym.registry import discover
from trace_gym.validation import ValidationConfig, validate

ORDER_LOOKUP = FIXTURE_ENVS / "order-lookup"
QUICK = ValidationConfig(
    seeds=40, floor_seeds=12, determinism_seeds=3, seed=0
)  # seeds fixed: the fixtures are judged alike every run


def variant(tmp_path, replace: dict[str, str]):
    folder = tmp_path / "flawed"
    shutil.copytree(ORDER_LOOKUP, folder)
    source = (folder / "env.py").read_text()
    for old, new in replace.items():
        assert old in source, old
        source = source.replace(old, new)
    (folder / "env.py").write_text(source)
    return folder


FLAWED = {
    "unseeded randomness": ({"rng = random.Random(seed)": "rng = random.Random()"}, "determinism"),
    "time-dependent": ({"import json\n": "import json\nimport time\n"}, "static_gate"),
    "constant reward": ({'return {"reward": reward,': 'return {"reward": 0.5,'}, "reward_range"),
    "renamed parameter": (
        {
            'action["arguments"].get("order_id")': 'action["arguments"].get("orderId")',
            '"arguments": {"order_id": self.order_id}': '"arguments": {"orderId": self.order_id}',
        },
        "interface_fidelity",
    ),
    "oracle calls a tool the target lacks": (
        {
            '{"type": "tool_call", "name": "get_order_details", "arguments"': '{"type": "tool_call", "name": "get_order_status", "arguments"'
        },
        "interface_fidelity",
    ),
    "oracle calls a tool with no name": (
        {
            '{"type": "tool_call", "name": "get_order_details", "arguments"': '{"type": "tool_call", "name": "", "arguments"'
        },
        "interface_fidelity",
    ),
    "extra tool": (
        {'TOOLS = ["get_order_details"]': 'TOOLS = ["get_order_details", "refund_everything"]'},
        "interface_fidelity",
    ),
    "never terminating": (
        {'return {"observation": "Thanks!", "done": True}': 'return {"observation": "Thanks!", "done": False}'},
        "termination",
    ),
    "crashes on some seeds": (
        {
            "rng = random.Random(seed)": "rng = random.Random(seed)\n        if seed % 10 == 3:\n            raise ValueError('bad seed')"
        },
        "reset_every_seed",
    ),
    "reward out of range": ({'return {"reward": reward,': 'return {"reward": reward * 2,'}, "reward_range"),
    "reward NaN": (
        {'return {"reward": reward,': 'return {"reward": float("nan") if not self.looked_up else reward,'},
        "reward_range",
    ),
    "hint leaks the answer": (
        {
            'prompt += " Hint: look the order up before you answer."': 'prompt += " Hint: the order is " + self.status + "."'
        },
        "hints",
    ),
    "trivially solvable": (
        {
            '"What is the status of my order %s?" % self.order_id': '"My order %s is %s. What is its status?" % (self.order_id, self.status)',
            'reward = 0.2 * components["used_tool"] + 0.3 * components["looked_up"] + 0.5 * components["correct_status"]': 'reward = components["correct_status"]',
        },
        "not_trivial",
    ),
    # time bombs (sandbox round 3, finding 3): honest on small seeds, hostile on the 31-bit ones training draws
    "time bomb: pays for not acting on training's seeds": (
        {
            "rng = random.Random(seed)": "rng = random.Random(seed)\n        self.big = seed > 10**6",
            'return {"reward": reward,': 'return {"reward": 1.0 if self.big and not self.used_tool else reward,',
        },
        "not_trivial",
    ),
    "time bomb: the hint states the answer on training's seeds": (
        {
            "rng = random.Random(seed)": "rng = random.Random(seed)\n        self.big = seed > 10**6",
            'prompt += " Hint: look the order up before you answer."': 'prompt += " Hint: the order is " + self.status + "." if self.big else " Hint: look the order up before you answer."',
        },
        "hints",
    ),
    "a difficulty level the oracle cannot solve": (
        {
            "STATUSES = [": "LEVELS = 2\nSTATUSES = [",
            "def reset(self, seed, hint=False):": "def reset(self, seed, hint=False, level=1):\n        self.level = level",
            '"Your order is %s." % self.status': '"Your order is %s." % (self.status if self.level else "lost")',
        },
        "levels",
    ),
    "same scenario for every seed": ({"rng = random.Random(seed)": "rng = random.Random(7)"}, "seed_diversity"),
    "no transfer rationale": ({'"""Transfer rationale: the agent': '"""The agent'}, "contract_shape"),
    "result field renamed (orderId where tau2 writes order_id)": (
        {
            "json.dumps(dict(ORDER, order_id=self.order_id, status=self.status))": 'json.dumps({("orderId" if k == "order_id" else k): v for k, v in dict(ORDER, order_id=self.order_id, status=self.status).items()})'
        },
        "interface_fidelity",
    ),
    "prose where tau2 returns JSON": (
        {
            "json.dumps(dict(ORDER, order_id=self.order_id, status=self.status))": '"Order %s is %s." % (self.order_id, self.status)'
        },
        "interface_fidelity",
    ),
    "an error not in tau2's style": ({'"Error: Order not found"': '"Sorry, no such order"'}, "interface_fidelity"),
    "hint states the count the answer gives": (
        {
            "self.status = rng.choice(STATUSES)\n": "self.status = rng.choice(STATUSES)\n        self.count = rng.randint(1, 9)\n",
            'prompt += " Hint: look the order up before you answer."': 'prompt += " Hint: look the order up; it has %d items." % self.count',
            '"content": "Your order is %s." % self.status}': '"content": "Your order is %s, with %d items." % (self.status, self.count)}',
        },
        "hints",
    ),
    "reward crashes after a bad argument": (
        {
            "self.used_tool = False": 'self.used_tool = False\n        self.last_id = ""',
            "self.used_tool = True  #": 'self.last_id = action["arguments"].get("order_id")\n            self.used_tool = True  #',
            "said = self.answer": "self.last_id.upper()\n        said = self.answer",
        },
        "robustness",
    ),
}


def test_a_good_env_passes_every_check(sandbox_backend):
    report = validate(ORDER_LOOKUP, backend=sandbox_backend, config=QUICK, write=False)
    assert report.passed, report.table()
    assert [c.name for c in report.checks] == [
        "static_gate",
        "contract_shape",
        "interface_fidelity",
        "reset_every_seed",
        "seed_diversity",
        "determinism",
        "solvable",
        "levels",
        "not_trivial",
        "reward_range",
        "termination",
        "robustness",
        "hints",
        "step_time",
    ]


@pytest.mark.parametrize("name", sorted(FLAWED))
def test_each_flaw_is_rejected_by_the_right_check(tmp_path, name):
    replace, check = FLAWED[name]
    report = validate(variant(tmp_path, replace), backend="bwrap", config=QUICK, write=False)
    assert not report.passed
    assert check in report.failed(), report.table()


def test_the_report_is_stored_with_the_code_hash_and_goes_stale(tmp_path):
    folder = tmp_path / "envs" / "order-lookup"
    shutil.copytree(ORDER_LOOKUP, folder)
    result = run_cli("validate", str(folder), "--backend", "bwrap", "--seeds", "20", "--seed", "0", "--json")
    assert result.returncode == 0, result.stderr
    stored = json.loads((folder / "validation.json").read_text())
    assert stored["passed"] and stored["code_hash"] == json.loads(result.stdout)["code_hash"]
    env = {"TRACE_GYM_REGISTRY_PATH": str(tmp_path / "envs")}
    rows = {r["id"]: r for r in json.loads(run_cli("envs", "list", "--json", env=env).stdout)}
    assert rows["trace/test-order-lookup-v0"]["status"] == "passed"
    (folder / "env.py").write_text((folder / "env.py").read_text() + "\n# changed\n")
    rows = {r["id"]: r for r in json.loads(run_cli("envs", "list", "--json", env=env).stdout)}
    assert rows["trace/test-order-lookup-v0"]["status"] == "stale"


def test_a_failing_env_exits_non_zero_with_the_failed_check_named(tmp_path):
    folder = variant(tmp_path, FLAWED["never terminating"][0])
    result = run_cli("validate", str(folder), "--backend", "bwrap", "--seeds", "20", "--seed", "0", "--no-write")
    assert result.returncode == 1
    assert "FAIL  termination" in result.stdout
    assert "termination" in result.stdout.strip().splitlines()[-1].removeprefix("FAILED: ").split(", ")


def test_calibration_with_a_policy(tmp_path):
    """The oracle always succeeds: every group is constant and all-success, so
    calibration must fail on exactly those rules and print pass@k."""
    report = validate(
        ORDER_LOOKUP,
        backend="bwrap",
        write=False,
        config=ValidationConfig(
            seeds=20, floor_seeds=5, determinism_seeds=1, policy="oracle", calibration_seeds=5, k=3, seed=0
        ),
    )
    calibration = report.checks[-1]
    assert calibration.name == "calibration" and calibration.passed is False
    assert "constant groups 1.00 <= 0.5" in calibration.evidence and "pass@3 1.00" in calibration.evidence


def test_scaffold_passes_validation_out_of_the_box(tmp_path):
    result = run_cli(
        "envs",
        "new",
        "my-check",
        "--target",
        "trace/tau2-retail-v0",
        "--dir",
        str(tmp_path),
        "--capability",
        "exact lookups",
        "--description",
        "Look records up with exact ids.",
    )
    assert result.returncode == 0, result.stderr
    report = validate(tmp_path / "my-check", backend="bwrap", config=QUICK, write=False)
    assert report.passed, report.table()
    manifest = (tmp_path / "my-check" / "manifest.toml").read_text()
    assert 'id = "trace/my-check-v0"' in manifest and 'name = "exact lookups"' in manifest


REFERENCE_ENVS = [
    "trace/structured-data-v0",
    "trace/verify-preconditions-v0",
    "trace/tool-precision-v0",
    "trace/policy-adherence-v0",
]


@pytest.mark.parametrize("env_id", REFERENCE_ENVS)
def test_reference_env_runs_end_to_end_through_gym_make(env_id):
    import gymnasium as gym

    import trace_gym  # noqa: F401
    from trace_gym.agents import OracleAgent, RandomAgent
    from trace_gym.rollout import Episode, run_episode

    env = gym.make(env_id)
    obs, info = env.reset(seed=42)
    assert obs and info["tools"] and info["system_prompt"]
    solved = run_episode(env, OracleAgent(), env_id, Episode(None, 0, 42))
    assert solved.reward == 1.0 and solved.terminated
    assert all(c.name in {t["function"]["name"] for t in info["tools"]} for c in solved.agent_tool_calls())
    floor = run_episode(env, RandomAgent(seed=1), env_id, Episode(None, 0, 43))
    assert floor.reward < 1.0
    env.close()


def test_the_stored_reports_of_the_registry_are_current():
    rows = {e.id: e.validation_status() for e in discover().values() if e.kind == "synthesized"}
    assert set(REFERENCE_ENVS) <= set(rows)
    assert all(status == "passed" for status in rows.values()), rows


def test_every_check_runs_after_the_checks_whose_results_it_reads():
    from trace_gym.validation.checks import CHECKS, NEEDS, order_problems

    assert order_problems(CHECKS) == []
    assert set(NEEDS) <= set(CHECKS)
    needs_fidelity = [c for c in CHECKS if c in NEEDS][0]
    swapped = [c for c in CHECKS if c is not needs_fidelity]
    swapped.insert(0, needs_fidelity)  # before interface_fidelity, which starts the env it uses
    assert order_problems(swapped) == [
        f"{needs_fidelity.__name__} runs before check_interface_fidelity, which it needs"
    ]
