"""OpenEnv both ways, on openenv-core's own server and client over 127.0.0.1: a registry
env served by `trace-gym envs serve`'s server (a sandboxed synthesized env included), and
an OpenEnv server as a target that rollout plays and GRPO trains on."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURE_ENVS, REPO
from openai_double import OpenAIDouble

pytest.importorskip("openenv.core", reason="OPENENV NOT TESTED HERE: pip install 'trace-gym[openenv]'")

from trace_gym.errors import TraceGymError  # noqa: E402
from trace_gym.openenv_server import BackgroundServer  # noqa: E402
from trace_gym.registry import make  # noqa: E402
from trace_gym.rollout import rollout  # noqa: E402
from trace_gym.store import read_trajectories  # noqa: E402

BANK = "trace/bank-support-v0"


def remote_target(folder, name, base_url, splits, **kwargs):
    """A target manifest for an OpenEnv server, as a user writes one (docs/targets.md)."""
    (folder / name).mkdir(parents=True)
    lines = [
        f'id = "trace/{name}-v0"',
        'kind = "target"',
        'entry_point = "trace_gym.targets.openenv:OpenEnvTarget"',
        f'description = "{name}, played on an OpenEnv server."',
        "[kwargs]",
        f'base_url = "{base_url}"',
        "splits = { " + ", ".join(f"{split} = {json.dumps(ids)}" for split, ids in splits.items()) + " }",
        *(f"{k} = {json.dumps(v)}" for k, v in kwargs.items()),
    ]
    (folder / name / "manifest.toml").write_text("\n".join(lines) + "\n")
    return f"trace/{name}-v0"


@pytest.fixture()
def registry(tmp_path, monkeypatch):
    """The example target and the order-lookup fixture env on the path, and a folder for remote targets."""
    folder = tmp_path / "registry"
    shutil.copytree(FIXTURE_ENVS / "order-lookup", folder / "order-lookup")
    monkeypatch.setenv(
        "TRACE_GYM_REGISTRY_PATH", os.pathsep.join([str(REPO / "examples" / "bank-support"), str(folder)])
    )
    return folder


def test_a_served_env_plays_an_episode_over_openenvs_own_client(registry):
    from openenv.core import GenericEnvClient

    with BackgroundServer(BANK) as server, GenericEnvClient(base_url=server.base_url).sync() as client:
        opened = client.reset(task_id="15", split="test")
        observation = opened.observation
        assert opened.done is False and observation["task_id"] == "15"
        assert [t["function"]["name"] for t in observation["tools"]] == ["get_account", "get_card", "freeze_card"]
        account = re.search(r"ACC-\d{5}", observation["text"]).group(0)
        looked = client.step({"text": json.dumps({"name": "get_account", "arguments": {"account_id": account}})})
        assert (
            looked.done is False
            and looked.reward == 0.0
            and json.loads(looked.observation["text"])["account_id"] == account
        )
        ended = client.step({"text": "Goodbye."})
        assert ended.done is True and ended.reward == pytest.approx(
            0.3
        )  # nothing frozen: only "froze nothing wrong" paid
        assert ended.observation["termination_reason"] == "done"
        with pytest.raises(RuntimeError, match="reset takes seed, episode_id, task_id and split; not \\['bogus'\\]"):
            client.reset(bogus=1)


def answer_order_lookup(body):
    """A model that looks the order up by its exact id, then says its status."""
    tool = [m for m in body["messages"] if m.get("role") == "tool"]
    if not tool:
        order = re.search(r"#W\d{7}", body["messages"][-1]["content"]).group(0)
        return {"tool_calls": [{"name": "get_order_details", "arguments": {"order_id": order}}]}
    return {"content": f"Your order is {json.loads(tool[-1]['content'])['status']}."}


def test_an_openenv_server_is_a_target_that_rollout_plays_sandbox_included(registry, tmp_path, sandbox_backend):
    with BackgroundServer("trace/test-order-lookup-v0", env_kwargs={"backend": sandbox_backend}) as server:
        # one id per backend: gymnasium keeps an id's first registration for the process
        target = remote_target(
            registry, f"remote-lookup-{sandbox_backend.name}", server.base_url, {"train": [0, 3], "test": [3, 5]}
        )
        out = tmp_path / "remote.jsonl"
        with OpenAIDouble(answer_order_lookup) as model:
            summary = rollout(
                target,
                "llm",
                out,
                split="test",
                progress=False,
                agent_kwargs={"model": "openai:double", "base_url": model.base_url, "api_key": "test-key"},
            )
        assert summary.episodes == 2 and summary.successes == 2
        episodes = read_trajectories(out)
        assert {t.task_id for t in episodes} == {"3", "4"}  # seeds of the test split only
        first = episodes[0]
        assert [m.role for m in first.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert first.reward_info["components"] == {"used_tool": 1.0, "looked_up": 1.0, "correct_status": 1.0}


@pytest.fixture()
def served_bank(registry, tmp_path):
    """`trace-gym envs serve` as a user starts it, in its own process (the example target on
    the registry path): its base URL."""
    import signal
    import subprocess

    from conftest import PYTHON

    def as_from_a_terminal():  # a test worker (xdist) ignores Ctrl-C, and a child would inherit that
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    exe = shutil.which("trace-gym", path=str(Path(PYTHON).parent)) or "trace-gym"
    log = tmp_path / "serve.log"  # (a pipe nobody reads could fill and stall the server)
    with log.open("w") as errors:
        server = subprocess.Popen(
            [exe, "envs", "serve", BANK, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            preexec_fn=as_from_a_terminal,
        )
    try:
        line = server.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        assert found, line + log.read_text()
        yield found.group(1)
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C, as its line says
        try:
            assert server.wait(timeout=30) == 0, log.read_text()
        finally:
            server.kill()


@pytest.mark.slow
def test_grpo_trains_one_iteration_through_envs_serve_over_http(registry, tmp_path, served_bank):
    from trace_gym.training import GRPOTrainingConfig, train

    target = remote_target(
        registry,
        "remote-bank",
        served_bank,
        {"train": [str(i) for i in range(14)], "test": ["14", "15"]},
        split_kwarg="split",
    )
    config = GRPOTrainingConfig(
        env_ids=[target],
        out=str(tmp_path / "grpo"),
        iterations=1,
        groups=2,
        rollouts_per_group=2,
        max_new_tokens=24,
        max_steps=3,
        calibrate=False,
        train_anyway=True,
        max_draws=1,
        learning_rate=1e-4,
    )
    result = train(config, progress=False)
    [row] = [json.loads(line) for line in result.log.read_text().splitlines()]
    assert row["rollouts"] == 4 and row["episodes_played"] == 4 and row["failed_episodes"] == 0
    assert all(key.startswith(f"{target}|task ") for key in row["played"])
    assert (tmp_path / "grpo" / "adapter" / "adapter_config.json").exists()


def test_an_openenv_target_says_what_is_wrong_in_one_line(registry):
    target = remote_target(registry, "nowhere", "http://127.0.0.1:9", {"train": [0, 2]})
    env = make(target, split="train")
    with pytest.raises(TraceGymError, match="no OpenEnv server at http://127.0.0.1:9"):
        env.reset(seed=0)
    with pytest.raises(TraceGymError, match="no split 'test' \\(its splits: train\\)"):
        make(target, split="test")
    bad = remote_target(registry, "bad-split", "http://127.0.0.1:9", {"train": [3, 1]})
    with pytest.raises(TraceGymError, match="must be \\[first_seed, end_seed\\] or a list of task ids"):
        make(bad, split="train")
    with BackgroundServer(BANK) as server:
        wrong = remote_target(registry, "wrong-field", server.base_url, {"train": ["0"]}, observation_field="message")
        env = make(wrong, split="train")
        try:
            with pytest.raises(TraceGymError, match="its observation has no field 'message'"):
                env.reset(seed=0)
        finally:
            env.close()
