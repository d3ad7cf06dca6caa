"""Env validation CI: validate what a change touches, the workflow's own commands, the catalogue."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, REPO, run_cli
from trace_gym.catalog import CATALOG_JSON, CATALOG_MD, StaleCatalogError, check_catalog, write_catalog
from trace_gym.registry_ci import changed_envs

WORKFLOW = REPO / ".github" / "workflows" / "validate-envs.yml"
CI_SCRIPT = REPO / ".ci" / "validate-envs"


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def env_repo(tmp_path):
    """A contributor's repository: the retail target's frozen schemas and two scaffolded envs."""
    repo = tmp_path / "repo"
    registry = repo / "env_registry"
    registry.mkdir(parents=True)
    shutil.copytree(REPO / "env_registry" / "tau2-retail", registry / "tau2-retail")
    for name in ("alpha-lookup", "beta-lookup"):
        result = run_cli(
            "envs",
            "new",
            name,
            "--target",
            "trace/tau2-retail-v0",
            "--dir",
            str(registry),
            "--capability",
            f"{name} skill",
            "--description",
            "Look records up with exact ids.",
        )
        assert result.returncode == 0, result.stderr
    (repo / ".ci").mkdir()
    shutil.copy2(CI_SCRIPT, repo / ".ci" / "validate-envs")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "two envs")
    return repo


def test_changed_since_selects_only_the_changed_env(env_repo):
    registry = env_repo / "env_registry"
    assert changed_envs("HEAD", repo=env_repo).envs == {}
    env_py = registry / "beta-lookup" / "env.py"
    env_py.write_text(env_py.read_text().replace("max_steps = 8", "max_steps = 9"))
    selection = changed_envs("HEAD", repo=env_repo)
    assert sorted(selection.envs) == ["trace/beta-lookup-v0"]
    assert "env_registry/beta-lookup/ changed" in selection.reasons["trace/beta-lookup-v0"]
    # Committed on a branch: compared with the merge base, as a pull request is.
    git(env_repo, "checkout", "-q", "-b", "feature")
    git(env_repo, "commit", "-q", "-am", "beta: one more step")
    assert sorted(changed_envs("main", repo=env_repo).envs) == ["trace/beta-lookup-v0"]


def test_a_target_schema_change_selects_every_env_of_that_target(env_repo):
    tools = env_repo / "env_registry" / "tau2-retail" / "tools.json"
    tools.write_text(tools.read_text() + "\n")
    selection = changed_envs("HEAD", repo=env_repo)
    assert sorted(selection.envs) == ["trace/alpha-lookup-v0", "trace/beta-lookup-v0"]
    assert all("its target trace/tau2-retail-v0" in r for r in selection.reasons.values())


def test_a_world_kit_change_selects_every_env_on_the_kit_and_stales_its_report(env_repo, monkeypatch):
    from trace_gym.hashing import interface_hash
    from trace_gym.registry import read_manifest
    from trace_gym.sandbox import world

    registry = env_repo / "env_registry"
    kit_env = (REPO / "tests" / "fixtures" / "kit_lookup_env.py").read_text()
    (registry / "alpha-lookup" / "env.py").write_text(kit_env)  # alpha on the kit, beta not
    kit = env_repo / "sandbox" / "world.py"
    kit.parent.mkdir()
    kit.write_text(Path(world.__file__).read_text())
    git(env_repo, "add", "-A")
    git(env_repo, "commit", "-q", "-m", "alpha on the world kit")
    kit.write_text(kit.read_text() + "\n# a change\n")
    selection = changed_envs("HEAD", repo=env_repo)
    assert sorted(selection.envs) == ["trace/alpha-lookup-v0"]
    assert "the world kit it imports (sandbox/world.py) changed" in selection.reasons["trace/alpha-lookup-v0"]

    # what a report records: the kit's code for alpha, the target's interface alone for beta
    target = registry / "tau2-retail"
    before = {name: interface_hash(target, registry / name) for name in ("alpha-lookup", "beta-lookup")}
    monkeypatch.setattr(world, "__file__", str(kit))
    after = {name: interface_hash(target, registry / name) for name in ("alpha-lookup", "beta-lookup")}
    assert before["alpha-lookup"] != after["alpha-lookup"] and before["beta-lookup"] == after["beta-lookup"]
    assert read_manifest(registry / "beta-lookup").validation_status() != "stale"


def test_a_new_env_folder_is_selected_and_a_removed_one_reported(env_repo):
    registry = env_repo / "env_registry"
    assert (
        run_cli("envs", "new", "gamma-lookup", "--target", "trace/tau2-retail-v0", "--dir", str(registry)).returncode
        == 0
    )
    shutil.rmtree(registry / "alpha-lookup")
    selection = changed_envs("HEAD", repo=env_repo)
    assert sorted(selection.envs) == ["trace/gamma-lookup-v0"]
    assert selection.removed == ["alpha-lookup"]


def test_no_change_validates_nothing_and_says_so(env_repo):
    result = run_cli("validate", "--changed-since", "HEAD", cwd=env_repo)
    assert result.returncode == 0, result.stderr
    assert "nothing to validate" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--changed-since", "no-such-ref"], "unknown git ref 'no-such-ref'"),
        ([], "exactly one of them"),
        (["--all", "--changed-since", "HEAD"], "exactly one of them"),
        (["--changed-since", "HEAD", "--jobs", "0"], "--jobs: must be at least 1, got 0"),
    ],
)
def test_bad_ci_input_is_one_line(env_repo, args, message):
    (env_repo / "env_registry" / "beta-lookup" / "README.md").write_text("changed\n")
    result = run_cli("validate", *args, cwd=env_repo)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_outside_a_git_repository_is_one_line(tmp_path):
    result = run_cli("validate", "--changed-since", "HEAD", cwd=tmp_path)
    assert result.returncode == 2 and "not inside a git repository" in result.stderr


@pytest.mark.slow
def test_the_ci_script_validates_exactly_the_changed_env_and_fails_a_broken_one(env_repo):
    """The workflow's own command, on a change to one env: that env alone is validated,
    and a change that breaks it makes the script exit non-zero with the failing check."""
    registry = env_repo / "env_registry"
    env_py = registry / "beta-lookup" / "env.py"
    env_py.write_text(env_py.read_text().replace("max_steps = 8", "max_steps = 9"))
    script = env_repo / ".ci" / "validate-envs"

    def run():
        return subprocess.run(
            [str(script), "HEAD"],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHON": PYTHON},
            cwd=env_repo,
        )

    result = run()
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((env_repo / "validation-reports" / "summary.json").read_text())
    assert [e["env_id"] for e in summary["envs"]] == ["trace/beta-lookup-v0"] and summary["passed"]
    assert (registry / "beta-lookup" / "validation.json").exists()
    assert not (registry / "alpha-lookup" / "validation.json").exists()
    assert "1 of 1 envs passed" in result.stdout

    env_py.write_text(env_py.read_text().replace("rng = random.Random(seed)", "rng = random.Random()"))
    result = run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  trace/beta-lookup-v0" in result.stdout and "determinism" in result.stdout


@pytest.mark.slow
def test_every_registry_env_passes_validation_through_the_ci_script(tmp_path):
    """Env validation CI on every change: .ci/run (make test) runs the workflow's script over the whole registry."""
    result = subprocess.run(
        [str(CI_SCRIPT), "--all"],
        capture_output=True,
        text=True,
        timeout=1800,
        env={
            **os.environ,
            "PYTHON": PYTHON,
            "TRACE_GYM_REPORTS": str(tmp_path),
            "TRACE_GYM_VALIDATE_FLAGS": "--no-write",
        },
        cwd=REPO,
    )  # the committed reports stay
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert result.returncode == 0, result.stdout + result.stderr
    from trace_gym.registry import discover

    synthesized = {e.id for e in discover().values() if e.kind == "synthesized"}
    assert {e["env_id"] for e in summary["envs"]} == synthesized and summary["passed"]


def test_workflow_is_valid_yaml_and_calls_only_what_exists():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert "env_registry/**" in triggers["pull_request"]["paths"]
    steps = workflow["jobs"]["validate"]["steps"]
    commands = [
        line.strip()
        for s in steps
        if "run" in s
        for line in s["run"].splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    repo_commands = [c for c in commands if c.startswith(".ci/")]
    assert repo_commands == ['.ci/validate-envs "origin/${{ github.base_ref }}"']
    for command in repo_commands:
        script = REPO / command.split()[0]
        assert script.is_file() and os.access(script, os.X_OK), command
    for command in commands:
        first = command.split()[0]
        assert first in {"sudo", ".ci/validate-envs"}, f"unexpected command in the workflow: {command}"
    uploaded = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert "validation-reports/" in uploaded["with"]["path"]


def test_pre_commit_hook_names_an_existing_command():
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    (hook,) = hooks
    assert hook["entry"].split()[:2] == ["trace-gym", "validate"] and "--changed-since" in hook["entry"]
    from trace_gym.cli import build_parser

    args = build_parser().parse_args(hook["entry"].split()[1:])
    assert args.changed_since == "HEAD"


def test_catalog_lists_every_env_and_catches_a_stale_one(tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    shutil.copytree(REPO / "env_registry" / "tau2-retail", registry / "tau2-retail")
    shutil.copytree(REPO / "env_registry" / "structured-data", registry / "structured-data")
    with pytest.raises(StaleCatalogError):
        check_catalog(registry)
    write_catalog(registry)
    check_catalog(registry)
    text = (registry / CATALOG_MD).read_text()
    assert "`trace/structured-data-v0`" in text and "`trace/tau2-retail-v0`" in text and "hand-written" in text
    data = json.loads((registry / CATALOG_JSON).read_text())
    assert {r["id"] for r in data["envs"]} == {"trace/structured-data-v0", "trace/tau2-retail-v0"}
    # A manifest edit makes the committed catalogue stale (and the report stale too).
    manifest = registry / "structured-data" / "manifest.toml"
    manifest.write_text(manifest.read_text().replace('name = "communicates_required_info"', 'name = "renamed"'))
    with pytest.raises(StaleCatalogError, match="CATALOG.md, catalog.json"):
        check_catalog(registry)
    result = run_cli("envs", "catalog", "--registry", str(registry), "--check")
    assert result.returncode == 1 and "out of date" in result.stderr


def test_the_committed_catalog_is_current():
    """make test fails when env_registry/CATALOG.md or catalog.json is out of date."""
    result = run_cli("envs", "catalog", "--registry", str(REPO / "env_registry"), "--check")
    assert result.returncode == 0, result.stderr
    data = json.loads((REPO / "env_registry" / CATALOG_JSON).read_text())
    from trace_gym.registry_ci import registry_folders

    # The folder itself, not discover(): other tests add run registries to TRACE_GYM_REGISTRY_PATH.
    assert {r["id"] for r in data["envs"]} == {e.id for e in registry_folders(REPO / "env_registry").values()}


def test_contributing_explains_every_check():
    from trace_gym.validation import CHECKS

    guide = (REPO / "CONTRIBUTING.md").read_text()
    missing = [
        c.__name__.removeprefix("check_") for c in CHECKS if f"| {c.__name__.removeprefix('check_')} |" not in guide
    ]
    assert not missing, f"CONTRIBUTING.md has no row for the checks {missing}"


def test_catalog_shows_a_synthesized_envs_provenance_and_calibration(tmp_path):
    """The manifest as the synthesis loop writes it (its own manifest_text): analyst,
    attempts and calibration figures reach the catalogue."""
    from trace_gym.synthesis.loop import manifest_text
    from trace_gym.synthesis.prompt import Capability

    registry = tmp_path / "registry"
    shutil.copytree(REPO / "env_registry" / "structured-data", registry / "sums")
    provenance = {
        "analyst": "openai:analyst-x",
        "template_version": "v1",
        "template_sha256": "ab" * 32,
        "attempts": [
            {"number": 1, "kind": "generate", "passed": False},
            {"number": 2, "kind": "repair", "passed": True},
        ],
        "calibration": {"mean_reward": 0.41, "success_rate": 0.35},
    }
    (registry / "sums" / "manifest.toml").write_text(
        manifest_text("trace/sums-v0", "trace/tau2-retail-v0", Capability("sums", "Add exactly.", [], []), provenance)
    )
    write_catalog(registry)
    text = (registry / CATALOG_MD).read_text()
    assert "synthesized by openai:analyst-x, 2 attempts" in text
    assert "mean_reward 0.41, success_rate 0.35" in text


def test_several_envs_are_validated_together_and_a_bad_id_is_one_line():
    result = run_cli(
        "validate",
        "trace/tool-precision-v0",
        "trace/structured-data-v0",
        "--seeds",
        "10",
        "--no-write",
        "--backend",
        "bwrap",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 of 2 envs passed" in result.stdout
    result = run_cli("validate", "trace/tool-precision-v0", "trace/nope-v0", "--no-write")
    assert result.returncode == 2 and "trace/nope-v0" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
