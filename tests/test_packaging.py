"""What a user gets from `pip install .`: cheap import, gym.make by id, with and without import."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import PYTHON, REPO

HEAVY = ("torch", "tau2", "litellm", "transformers", "openai")


def test_import_trace_gym_registers_without_heavy_imports():
    code = (
        "import sys, gymnasium, trace_gym\n"
        "print(sorted(k for k in gymnasium.registry if k.startswith('trace/')))\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout.splitlines()
    assert "trace/tau2-retail-v0" in out[0] and "trace/tau2-telecom-v0" in out[0]
    assert out[1] == "[]"


def test_every_package_of_the_tree_is_in_the_wheel():
    """pyproject.toml lists the packages by hand (agents/, sandbox/, env_registry/ are
    mapped into trace_gym), so a new subpackage is missing from a real install until it is
    listed; an editable install finds it anyway, so only this check notices."""
    import tomllib

    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for name, folder in tool["package-dir"].items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            parts = init.parent.relative_to(root).parts
            if "__pycache__" not in parts and all(p.isidentifier() for p in parts):
                found.add(".".join((name, *parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "listed, but no such package in the tree"


def test_module_prefixed_id_works_with_no_import():
    code = (
        "import gymnasium as gym\n"
        "e = gym.make('trace_gym:trace/tau2-retail-v0')\n"
        "print(e.reset(seed=0)[1]['tools'][0]['function']['name'])\n"
    )
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "calculate"


@pytest.mark.slow
def test_fresh_venv_pip_install(tmp_path):
    """A new venv gets our wheel installed for real (not editable); its
    third-party dependencies come from this venv through a .pth file, so the
    test checks our packaging without re-downloading tau2's dependency tree."""
    venv = tmp_path / "venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps-from-dev-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Build the wheel with this venv's setuptools (a new venv's stock one has no bdist_wheel offline).
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_NO_INDEX": "1"},
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("trace_gym-*.whl")
    install = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_NO_INDEX": "1"},
    )
    assert install.returncode == 0, install.stderr[-2000:]
    snippet = (
        'import gymnasium as gym; e=gym.make("trace_gym:trace/tau2-retail-v0"); '
        'print(e.reset(seed=0)[1]["tools"][0]["function"]["name"])'
    )
    first = subprocess.run([py, "-c", snippet], capture_output=True, text=True, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip() == "calculate"
    second = subprocess.run(
        [
            py,
            "-c",
            "import gymnasium as gym, trace_gym, trace_gym.agents, trace_gym.sandbox, trace_gym.llm, trace_gym.identification, trace_gym.targets.tau2; "
            "e = gym.make('trace/tau2-retail-v0'); e.reset(seed=1); print(trace_gym.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.strip().startswith(str(venv)), "the installed copy, not the checkout"
    assert (venv / "bin" / "trace-gym").exists()
    prompts = subprocess.run(
        [
            py,
            "-c",
            "from trace_gym.identification.llm_analyst import render; print(render('merge', candidates='x')[:20])",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert prompts.returncode == 0 and prompts.stdout.startswith("These capability"), prompts.stderr[-500:]
