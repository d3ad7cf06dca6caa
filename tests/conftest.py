import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Local models in float32 whatever the CPU: the suite asserts that a batch samples what each row
# samples alone, which holds in float32 and not in bfloat16, and CI's CPU has bf16 on some days only.
os.environ["TRACE_GYM_DTYPE"] = "float32"

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def capability(name: str, description: str, *, selected: bool = True):
    """An identified capability as identification records it (figures of a plain selection)."""
    from trace_gym.identification.stats import SelectedCapability

    return SelectedCapability(
        name,
        description,
        gap_mean=0.3,
        gap_std=0.0,
        coverage_mean=0.5,
        coverage_std=0.0,
        er_plus_mean=0.1,
        er_minus_mean=0.4,
        runs_passed=5 if selected else 0,
        runs=5,
        selected=selected,
        runs_required=4,
    )


def run_cli(
    *args: str, timeout: float = 600, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run the installed console script as a user would."""
    exe = shutil.which("trace-gym", path=str(Path(PYTHON).parent)) or "trace-gym"
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd
    )


@pytest.fixture(autouse=True)
def _registry_dirs_added_stay_in_their_test():
    """A folder a test's run adds to the registry (``add_registry_dir``) is gone after it,
    as a monkeypatched TRACE_GYM_REGISTRY_PATH is."""
    from trace_gym import registry

    before = list(registry._ADDED)
    yield
    registry._ADDED[:] = before


@pytest.fixture(scope="session")
def retail_env():
    import gymnasium as gym

    import trace_gym  # noqa: F401

    env = gym.make("trace/tau2-retail-v0", split="base")
    yield env
    env.close()


FIXTURE_ENVS = Path(__file__).parent / "fixtures" / "envs"


@pytest.fixture(scope="session", params=["bwrap", "docker"])
def sandbox_backend(request):
    """Each real backend once per session; a missing engine skips loudly."""
    from trace_gym.sandbox import SandboxUnavailable, select_backend

    try:
        return select_backend(request.param)
    except SandboxUnavailable as exc:
        pytest.skip(f"SANDBOX BACKEND {request.param} NOT TESTED HERE: {exc}")


# The longest files (minutes each, by make test's --durations report of 2026-11-28 in
# docs/benchmarks.md) start first, so that `make test`'s two workers do not end with one
# of them running alone.
LONGEST_FIRST = (
    "test_sft.py",
    "test_evaluation.py",
    "test_pipeline_run.py",
    "test_identification.py",
    "test_tau2_target.py",
    "test_identification_honesty.py",
    "test_token_episodes.py",
    "test_serve.py",
    "test_training_run.py",
    "test_own_target.py",
    "test_synthesis.py",
    "test_validation_bounds.py",
    "test_toolsandbox_registry.py",
)


def pytest_collection_modifyitems(config, items):
    items.sort(
        key=lambda item: LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST else len(LONGEST_FIRST)
    )
