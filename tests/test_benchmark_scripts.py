"""Every script in ``benchmarks/`` says how to call it and refuses a bad argument in one line.

Only the command lines run here (``--help`` and a malformed argument exit before any
work); the figures themselves are the benchmarks' business, recorded in docs/benchmarks.md.
"""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def call(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)


def test_there_are_scripts():
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_help_and_a_bad_argument(script: Path):
    shown = call(script, "--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage:") and "Traceback" not in shown.stderr

    refused = call(script, "--no-such-option")
    assert refused.returncode == 2  # argparse's exit status for a usage error, before any work
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(f"{script.name}: error: ")


NUMBERS = {  # scripts whose positional arguments are counts: the arguments before the first count, if any
    "analyst_cost": [],
    "local_hf_throughput": [],
    "sandbox_latency": [],
    "step_overhead": [],
    "tau2_env_cost": ["retail"],
    "tau2_episodes": [],
}


@pytest.mark.parametrize("name", sorted(NUMBERS))
@pytest.mark.parametrize(("value", "said"), [("x", "invalid count: 'x'"), ("0", "must be at least 1, got 0")])
def test_a_count_that_is_not_a_positive_number_is_refused(name: str, value: str, said: str):
    refused = call(BENCHMARKS / f"{name}.py", *NUMBERS[name], value)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert said in refused.stderr.strip().splitlines()[-1]


def test_an_option_count_below_one_is_refused():
    for script, option in (("grpo_iteration.py", "--groups"), ("decode_step.py", "--rows")):
        refused = call(BENCHMARKS / script, option, "0")
        assert refused.returncode == 2 and "must be at least 1, got 0" in refused.stderr.strip().splitlines()[-1]


def test_decode_step_refuses_a_smallest_budget_above_the_largest():
    refused = call(BENCHMARKS / "decode_step.py", "--min-new", "9", "--max-new", "3")
    assert refused.returncode == 2 and "--min-new (9) is above --max-new (3)" in refused.stderr.strip().splitlines()[-1]


def test_validation_time_refuses_an_env_with_hostile():
    refused = call(BENCHMARKS / "validation_time.py", "trace/x", "--hostile")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].endswith("--hostile times its own envs: give it no env id")
