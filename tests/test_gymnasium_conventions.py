"""Gymnasium's own conventions, kept: async vector envs with default settings,
close() releases what the env opened, render_mode honoured."""

import gc
import warnings

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401  (registers the envs)
from trace_gym.env import AnyText
from gymnasium.vector.utils import shared_memory

TEXTS = [
    "",
    "plain",
    '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}',
    "héllo — 你好 wörld 🙂\n\ttabs",
]


def test_any_text_travels_through_shared_memory_as_written():
    space = AnyText(max_length=64)
    memory = shared_memory.create_shared_memory(space, n=len(TEXTS))
    view = shared_memory.read_from_shared_memory(space, memory, n=len(TEXTS))  # read once, as the vector env does
    for i, text in enumerate(TEXTS):
        shared_memory.write_to_shared_memory(space, i, text, memory)
    assert tuple(view) == tuple(TEXTS)  # the view reads the memory as it is now
    shared_memory.write_to_shared_memory(space, 1, "changed", memory)
    assert view[1] == "changed"
    import copy

    assert copy.deepcopy(view) == tuple(view) and isinstance(copy.deepcopy(view), tuple)


def test_an_async_vector_env_works_with_default_settings():
    envs = gym.make_vec("trace/tau2-retail-v0", num_envs=2, vectorization_mode="async")
    try:
        observations, infos = envs.reset(seed=0)
        assert len(observations) == 2 and all(isinstance(o, str) and o for o in observations)
        first = tuple(observations)
        observations, rewards, terminated, truncated, infos = envs.step(
            [
                '{"name": "find_user_id_by_email", "arguments": {"email": "nobody@example.com"}}',
                "Héllo, how can I help — 你好?",
            ]
        )
        assert observations[0].startswith("Error") and observations[1] and tuple(observations) != first
    finally:
        envs.close()


def test_render_follows_the_render_mode():
    env = gym.make("trace/tau2-retail-v0")
    env.reset(seed=0)
    with pytest.warns(UserWarning, match="without a render mode"):
        assert env.render() is None
    env.close()
    env = gym.make("trace/tau2-retail-v0", render_mode="ansi")
    observation, _ = env.reset(seed=0)
    text = env.render()
    assert isinstance(text, str) and observation[:40] in text and text.startswith("[system]")
    env.step('<tool_call>{"name": "find_user_id_by_email", "arguments": {"email": "nobody@example.com"}}</tool_call>')
    last = env.render().splitlines()[-2:]  # the call, then its result naming its tool
    assert last[0] == '[assistant] -> find_user_id_by_email({"email": "nobody@example.com"})'
    assert last[1].startswith("[tool find_user_id_by_email] ")
    env.close()
    with pytest.raises(ValueError, match="render_mode 'human'"):
        gym.make("trace/tau2-retail-v0", render_mode="human")


def test_a_sandboxed_env_releases_its_worker_and_socket_on_close(sandbox_backend):
    gc.collect()  # what earlier tests in this process left is theirs, not this env's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(2):
            env = gym.make("trace/structured-data-v0", backend=sandbox_backend)
            env.reset(seed=1)
            worker = env.unwrapped.worker
            env.close()
            assert worker._channel is None
            del env, worker
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks


def test_a_users_target_from_the_example_and_the_scaffold_vectorises_async(tmp_path, monkeypatch):
    """The example target and what `targets new` writes use AnyText, so gym.make_vec's
    default async mode hands their texts back whole (gymnasium's own Text space, with
    a charset, came back as 10,000 '0's)."""
    from conftest import REPO, run_cli
    from trace_gym.registry import register_all

    made = run_cli("targets", "new", "async-desk", "--dir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("TRACE_GYM_REGISTRY_PATH", f"{REPO / 'examples' / 'bank-support'}:{tmp_path}")
    register_all()
    for env_id, opening, call in (
        ("trace/bank-support-v0", "Hi, my account is ACC-", '{"name": "get_card", "arguments": {"card_id": "x"}}'),
        ("trace/async-desk-v0", "Please cancel my order ORD-", '{"name": "get_order", "arguments": {"order_id": "x"}}'),
    ):
        envs = gym.make_vec(env_id, num_envs=2, vectorization_mode="async")
        try:
            observations, _ = envs.reset(seed=0)
            assert all(o.startswith(opening) for o in observations), observations
            observations, *_ = envs.step([call, "Héllo — 你好?"])
            assert observations[0] == "Error: not found" and observations[1] == "Thanks, bye."
        finally:
            envs.close()
