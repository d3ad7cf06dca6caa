"""The host survives any env data, and every bound has an input it stops (issue 29,
findings 4 and 5): text that cannot be encoded, a 1-million-character observation,
150,000 reward components, a prompt past the model's context, a reset that differs
between workers, a step slower than training allows. Each is reproduced through the
real sandbox (bubblewrap and Docker) or the real training code; each used to crash
the host or grow without bound."""

from __future__ import annotations

import shutil
import textwrap
from types import SimpleNamespace

import pytest

from conftest import FIXTURE_ENVS
from test_sandbox_hostile import env_source
from trace_gym.errors import EnvContractError
from trace_gym.sandbox import Limits, SandboxWorker

FAST = Limits(call_timeout_s=5.0, start_timeout_s=20.0, memory_mb=256)
ORDER_LOOKUP = FIXTURE_ENVS / "order-lookup"


def lookup_variant(tmp_path, old: str, new: str):
    folder = tmp_path / "variant"
    shutil.copytree(ORDER_LOOKUP, folder)
    source = (folder / "env.py").read_text()
    assert old in source
    (folder / "env.py").write_text(source.replace(old, new))
    return folder


def test_a_lone_surrogate_from_env_code_becomes_a_replacement_character(sandbox_backend, tmp_path):
    body = "out = 'a' + chr(0xD800) + 'b'"
    with SandboxWorker(env_source(body), backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        out = worker.call("step", action={"type": "message", "content": "hi"})["observation"]
    assert out == "a\ufffdb"
    # through a whole episode and the trajectory store: the oracle's rollout is written, not lost
    from trace_gym.agents import OracleAgent
    from trace_gym.rollout import Episode, run_episode
    from trace_gym.sandbox.env import SandboxedEnv
    from trace_gym.store import TrajectoryStore

    folder = lookup_variant(tmp_path, '"reason": "lookup and answer"', '"reason": "lookup " + chr(0xDC00)')
    env = SandboxedEnv(folder, backend=sandbox_backend)
    try:
        trajectory = run_episode(env, OracleAgent(), "trace/test-order-lookup-v0", Episode(None, 0, 3))
    finally:
        env.close()
    assert trajectory.reward_info["reason"] == "lookup \ufffd"
    store = TrajectoryStore(tmp_path / "t.jsonl")
    store.append(trajectory)
    assert "\ufffd" in (tmp_path / "t.jsonl").read_text(encoding="utf-8")


def test_a_huge_observation_is_cut_and_says_so(sandbox_backend, tmp_path):
    from trace_gym.sandbox.env import SandboxedEnv

    folder = lookup_variant(
        tmp_path,
        'return {"observation": "Thanks!", "done": True}',
        'return {"observation": "x" * 1000000, "done": True}',
    )
    env = SandboxedEnv(folder, backend=sandbox_backend, max_observation_chars=5000)
    try:
        env.reset(seed=1)
        observation = env.step("Your order is pending.")[0]
    finally:
        env.close()
    assert len(observation) < 5200 and "cut at 5000 characters; the env sent 1000000" in observation


def test_too_many_reward_components_are_refused():
    from trace_gym.sandbox.env import parse_reward

    many = {"reward": 0.5, "components": {f"c{i}": 0.0 for i in range(150_000)}}
    with pytest.raises(EnvContractError, match="150000 components.*at most 32"):
        parse_reward(many)
    with pytest.raises(EnvContractError, match="at most 64 characters"):
        parse_reward({"reward": 0.5, "components": {"x" * 65: 1.0}})
    assert parse_reward({"reward": 0.5, "components": {f"c{i}": 1.0 for i in range(32)}}).reward == 0.5


def test_a_prompt_past_the_models_context_ends_the_episode_truncated(sandbox_backend):
    """A tiny model with a 96-token context: the first prompt (system prompt, tool
    schemas) does not fit, so the episode ends before any forward, with the reason."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trace_gym.agents import LLMAgent
    from trace_gym.llm.embedded import ensure_embedded_model
    from trace_gym.llm.local import LocalHF
    from trace_gym.rollout import Episode, play_batched, run_episode
    from trace_gym.sandbox.env import SandboxedEnv

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    config = AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=96,
    )
    torch.manual_seed(0)
    backend = LocalHF.from_model(AutoModelForCausalLM.from_config(config), tokenizer)
    assert backend.context_size == 96
    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend)
    try:
        trajectory = run_episode(
            env, LLMAgent(backend, max_new_tokens=8), "trace/test-order-lookup-v0", Episode(None, 0, 1)
        )
        assert trajectory.truncated and "pass the model's context of 96 tokens" in trajectory.error
        [played] = list(
            play_batched(
                [env], [LLMAgent(backend, max_new_tokens=8)], "trace/test-order-lookup-v0", [Episode(None, 0, 2)]
            )
        )
        assert "the episode ends here, truncated" in played.trajectory.error
    finally:
        env.close()


def test_a_group_whose_resets_differ_is_voided_and_training_goes_on():
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.rollouts import EnvRolloutFunc, IterationRecord

    def outcome(prompt):
        turn = SimpleNamespace(prompt_ids=prompt)
        return SimpleNamespace(failed=False, failure=None, played=SimpleNamespace(tokens=SimpleNamespace(turns=[turn])))

    rollout = EnvRolloutFunc(
        GRPOTrainingConfig(env_ids=["trace/x-v0"], out="x"), pool=None, tokenizer=SimpleNamespace(eos_token_id=2)
    )
    record = IterationRecord()
    rows = rollout._group_rows([outcome([1, 2, 3]), outcome([1, 2, 4])], [False, False], record)
    assert [r["env_reward"] for r in rows] == [None, None] and all(r["env_mask"] == [0] for r in rows)
    assert len(record.failed) == 2 and "not deterministic in its seed" in record.failed[0]


def test_training_bounds_have_settings_that_refuse_nonsense_and_reach_the_sandbox(monkeypatch):
    from trace_gym.training import GRPOTrainingConfig, TrainingError
    from trace_gym.training.trainer import _env_plan

    with pytest.raises(TrainingError, match="must be positive"):
        GRPOTrainingConfig(env_ids=["trace/tool-precision-v0"], out="x", env_call_timeout_s=0).check()
    _, kwargs, _ = _env_plan(
        GRPOTrainingConfig(
            env_ids=["trace/tool-precision-v0"],
            out="x",
            env_call_timeout_s=1.5,
            max_observation_chars=900,
            sandbox_backend="bwrap",
        )
    )
    plan = kwargs["trace/tool-precision-v0"]
    assert plan["limits"].call_timeout_s == 1.5 and plan["max_observation_chars"] == 900


def test_a_step_slower_than_training_allows_kills_the_worker(sandbox_backend):
    from trace_gym.sandbox import SandboxTimeout

    body = textwrap.dedent("""
    n = 0
    while n < 10**9:
        n += 1
    """)
    with pytest.raises(SandboxTimeout):
        with SandboxWorker(env_source(body), backend=sandbox_backend, limits=Limits(call_timeout_s=1.0)) as worker:
            worker.call("reset", seed=0, hint=False)
            worker.call("step", action={"type": "message", "content": "hi"})


@pytest.mark.parametrize(
    "bomb, fragment",
    [
        (None, None),
        (
            (
                'return {"reward": reward,',
                'return {"reward": 1.0 if self.big and self.answer is not None and not self.used_tool else reward,',
            ),
            "a message-only agent scored 1.00",
        ),
        (("self.looked_up = True\n", "self.looked_up = not self.big\n"), "the oracle scored 0.70"),
        (
            (
                'prompt += " Hint: look the order up before you answer."',
                'prompt += " Hint: the order is " + self.status + "." if self.big else " Hint: look the order up first."',
            ),
            "the hint spells out",
        ),
    ],
)
def test_training_spot_checks_its_own_seeds(sandbox_backend, tmp_path, bomb, fragment):
    """Finding 3: an env honest on small seeds and hostile on the 31-bit seeds training
    draws. Training plays the oracle and a message-only agent on one seed it trains on
    each iteration, and stops the env in one line when they disagree with validation."""
    from trace_gym.sandbox.env import SandboxedEnv
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.rollouts import EnvRolloutFunc, EnvTurnedError, episode_key

    folder = ORDER_LOOKUP
    if bomb:
        folder = lookup_variant(
            tmp_path, "rng = random.Random(seed)", "rng = random.Random(seed)\n        self.big = seed > 10**6"
        )
        source = (folder / "env.py").read_text()
        assert bomb[0] in source
        (folder / "env.py").write_text(source.replace(bomb[0], bomb[1]))
    pool = SimpleNamespace(make_env=lambda env_id: SandboxedEnv(folder, backend=sandbox_backend))
    rollout = EnvRolloutFunc(
        GRPOTrainingConfig(env_ids=["trace/test-order-lookup-v0"], out="x"),
        pool=pool,
        tokenizer=SimpleNamespace(eos_token_id=2),
    )
    small, big = 7, 1_234_567_890
    assert "oracle solved" in rollout.spot_check("trace/test-order-lookup-v0", small)  # what validation used to see
    if not bomb:
        assert "oracle solved, message-only unpaid" in rollout.spot_check("trace/test-order-lookup-v0", big)
        return
    with pytest.raises(EnvTurnedError, match=fragment) as caught:
        rollout.play([episode_key("trace/test-order-lookup-v0", seed=big)] * 2, backend=None)
    assert "training stops this env" in str(caught.value) and "\n" not in str(caught.value)


def test_an_episode_past_max_episode_s_ends_truncated(sandbox_backend):
    """The episode bound of training, in the one episode loop: a policy that keeps asking
    (the env never ends) is stopped after the step that passes the bound."""
    from trace_gym.rollout import Episode, play_batched
    from trace_gym.sandbox.env import SandboxedEnv

    class Stalling:  # a token-free agent that asks the same question forever (agents.base.LockStepAgent)
        name, model, adapter, tokens = "stalling", None, None, None
        backend = SimpleNamespace(complete=lambda requests: [SimpleNamespace() for _ in requests])

        def reset(self, observation, info, env=None):
            pass

        def act(self, observation):
            return self.receive(None)

        def usage(self):
            return {}

        def end_episode(self):
            pass

        def request(self):
            return None

        def receive(self, completion):
            import time

            time.sleep(0.2)
            return '{"name": "get_order_details", "arguments": {"order_id": "#W0"}}'

    env = SandboxedEnv(ORDER_LOOKUP, backend=sandbox_backend, max_steps=50)
    try:
        [played] = list(
            play_batched([env], [Stalling()], "trace/test-order-lookup-v0", [Episode(None, 0, 1)], max_episode_s=0.5)
        )
    finally:
        env.close()
    assert played.trajectory.truncated and "ran past max_episode_s (0.5 s)" in played.trajectory.error
    assert played.trajectory.steps < 10


def test_iteration_and_episode_bounds_refuse_nonsense():
    from trace_gym.training import GRPOTrainingConfig, TrainingError

    for field in ("max_episode_s", "max_iteration_s"):
        with pytest.raises(TrainingError, match="must be positive"):
            GRPOTrainingConfig(env_ids=["trace/tool-precision-v0"], out="x", **{field: 0}).check()


def test_an_iteration_past_max_iteration_s_stops_redrawing(monkeypatch):
    """Dynamic sampling redraws constant groups up to max_draws, unless the iteration
    has run past its bound: then the groups it has are what the update sees."""
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.rollouts import EnvRolloutFunc, episode_key

    def constant_rows(self, env_id, keys, group_ids, backend, rows, record):
        for g in group_ids:
            for s in range(self.config.rollouts_per_group):
                rows[g * self.config.rollouts_per_group + s] = {
                    "prompt_ids": [1],
                    "completion_ids": [2],
                    "logprobs": [0.0],
                    "env_mask": [1],
                    "env_reward": 0.0,
                    "hinted": False,
                }
        record.episodes_played += len(keys) * self.config.rollouts_per_group

    monkeypatch.setattr(EnvRolloutFunc, "_play_env", constant_rows)
    keys = [episode_key("trace/x-v0", seed=5)] * 2
    for bound, draws in ((3600.0, 3), (1e-9, 1)):
        rollout = EnvRolloutFunc(
            GRPOTrainingConfig(env_ids=["trace/x-v0"], out="x", max_iteration_s=bound, spot_check=False),
            pool=None,
            tokenizer=None,
        )
        rollout.play(keys, backend=None)
        record = rollout.records[-1]
        assert record.draws == 2 * draws and record.episodes_played == 2 * 4 * draws  # 2 groups of K = 4
        assert bool(record.bounds_hit) == (draws == 1)


def test_the_spot_check_plays_the_oracle_under_the_envs_own_step_limit(sandbox_backend):
    """Training may cap episodes shorter than an env's oracle needs (the quickstart's
    max_steps = 6); the spot check judges as validation did, under the env's own limit.
    Found by the quickstart: structured-data's oracle 'scored 0.43' at 6 steps."""
    from trace_gym.registry import make
    from trace_gym.training import GRPOTrainingConfig
    from trace_gym.training.rollouts import EnvRolloutFunc

    env_id = "trace/structured-data-v0"
    pool = SimpleNamespace(make_env=lambda e: make(e, backend=sandbox_backend, max_steps=2))
    rollout = EnvRolloutFunc(GRPOTrainingConfig(env_ids=[env_id], out="x", max_steps=2), pool=pool, tokenizer=None)
    assert "oracle solved" in rollout.spot_check(env_id, 533928935)
