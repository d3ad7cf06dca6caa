"""Rollout runs that cannot mix: settings recorded in the file and checked on resume,
given-up episodes replayed on request, synthesized envs played by seed, local adapters by path."""

import json
import shutil
import warnings

import pytest

from conftest import FIXTURE_ENVS, run_cli
from openai_double import OpenAIDouble, gold_answer
from test_llm import oracle_scripts, save_visible_lora
from trace_gym.errors import TraceGymError, TrajectoryStoreError
from trace_gym.rollout import rollout
from trace_gym.store import read_run_settings, read_trajectories

RETAIL = "trace/tau2-retail-v0"


def planted(out, **kwargs):
    options = dict(split="test", limit=2, seed=1, progress=False, agent_kwargs={"deficits": {"corrupt_ids": 0.5}})
    options.update(kwargs)
    return rollout(RETAIL, "planted", out, **options)


def test_settings_are_recorded_and_a_same_settings_resume_goes_on(tmp_path):
    out = tmp_path / "run.jsonl"
    planted(out)
    [settings] = read_run_settings(out)
    assert settings["agent"] == "planted" and settings["agent_options"] == {"seed": 1, "deficits": {"corrupt_ids": 0.5}}
    summary = planted(out, limit=3, resume=True)
    assert summary.resumed == 2 and summary.episodes == 3
    assert read_run_settings(out) == [settings]  # one header: still one run


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"seed": 2}, "agent_options.seed 1 in the file, 2 now"),
        (
            {"agent_kwargs": {"deficits": {"corrupt_ids": 0.9}}},
            "agent_options.deficits.corrupt_ids 0.5 in the file, 0.9 now",
        ),
        ({"env_kwargs": {"user": "llm", "user_model": "m"}}, 'env_options.user null in the file, "llm" now'),
        ({"env_kwargs": {"max_steps": 7}}, "env_options.max_steps null in the file, 7 now"),
    ],
)
def test_resume_refuses_a_file_made_with_other_settings(tmp_path, change, fragment):
    out = tmp_path / "run.jsonl"
    planted(out)
    before = out.read_bytes()
    with pytest.raises(TrajectoryStoreError, match="was made by another run") as caught:
        planted(out, resume=True, **change)
    assert fragment in str(caught.value)
    assert out.read_bytes() == before  # nothing appended


def test_resume_refuses_another_agent_model_temperature_or_adapter(tmp_path):
    out = tmp_path / "llm.jsonl"
    with OpenAIDouble(gold_answer(oracle_scripts(["0"]))) as server:
        common = ["rollout", "--env", RETAIL, "--split", "base", "--task-ids", "0", "--out", str(out), "--no-progress"]
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key"}
        first = run_cli(*common, "--agent", "llm", "--model", "openai:double", env=env)
        assert first.returncode == 0, first.stderr
        asked = len(server.requests)
        for flags, fragment in [
            (
                ["--agent", "llm", "--model", "openai:other"],
                'agent_options.model "openai:double" in the file, "openai:other" now',
            ),
            (
                ["--agent", "llm", "--model", "openai:double", "--temperature", "0.7"],
                "agent_options.temperature null in the file, 0.7 now",
            ),
            (
                ["--agent", "llm", "--model", "openai:double", "--adapter", "skill"],
                'agent_options.adapter null in the file, "skill" now',
            ),
            (["--agent", "oracle"], 'agent "llm" in the file, "oracle" now'),
        ]:
            result = run_cli(*common, *flags, "--resume", env=env)
            lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
            assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
        assert len(server.requests) == asked  # refused before any model call


def test_a_file_from_before_run_headers_is_checked_as_far_as_it_tells(tmp_path):
    out = tmp_path / "old.jsonl"
    rollout(RETAIL, "oracle", out, split="test", limit=2, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(line for line in lines if '"record": "run"' not in line))  # as an old version wrote it
    assert read_run_settings(out) == [] and len(read_trajectories(out)) == 2
    with pytest.raises(TrajectoryStoreError, match="agent oracle in the file, planted now"):
        planted(out, resume=True)
    with pytest.warns(UserWarning, match="only its env and agent could be checked"):
        summary = rollout(RETAIL, "oracle", out, split="test", limit=3, progress=False, resume=True)
    assert summary.resumed == 2 and summary.episodes == 3 and len(read_run_settings(out)) == 1


def test_given_up_episodes_are_replayed_only_when_asked(tmp_path):
    out = tmp_path / "llm.jsonl"
    broken = {"on": True}
    gold = gold_answer(oracle_scripts(["0", "1"]))

    def answer(body):
        return {"content": '{"name": "get_order_details", "arguments": '} if broken["on"] else gold(body)

    with OpenAIDouble(answer) as server:
        kwargs = dict(
            split="base",
            task_ids=["0", "1"],
            progress=False,
            agent_kwargs={"model": "openai:double", "base_url": server.base_url, "api_key": "test-key"},
        )
        first = rollout(RETAIL, "llm", out, **kwargs)
        assert first.aborted == 2 and first.successes == 0
        broken["on"] = False
        again = rollout(RETAIL, "llm", out, resume=True, **kwargs)
        assert again.resumed == 2 and again.aborted == 2  # a plain resume keeps what was given up
        retried = rollout(RETAIL, "llm", out, resume=True, retry_given_up=True, **kwargs)
    assert retried.resumed == 0 and retried.successes == 2 and retried.aborted == 0
    final = read_trajectories(out)
    assert [t.reward for t in final] == [1.0, 1.0] and not any(t.error for t in final)
    raw = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(1 for r in raw if r.get("error")) == 2  # the given-up records are kept, superseded


def test_settings_never_record_keys_or_endpoints(tmp_path):
    from trace_gym.rollout import run_settings

    settings = run_settings(
        RETAIL,
        "llm",
        {"model": "openai:m", "api_key": "sk-secret", "base_url": "http://x"},
        {"user": "llm", "user_base_url": "http://y", "user_api_key": "sk-2"},
    )
    assert "sk-" not in json.dumps(settings) and "http" not in json.dumps(settings)


# --- synthesized envs are played by seed ------------------------------------------------


@pytest.fixture()
def seeded_registry(tmp_path, monkeypatch):
    folder = tmp_path / "registry" / "seeded-lookup"
    shutil.copytree(FIXTURE_ENVS / "order-lookup", folder)
    manifest = folder / "manifest.toml"
    text = manifest.read_text().replace("trace/test-order-lookup-v0", "trace/test-seeded-lookup-v0")
    manifest.write_text(text + "\n[splits]\ntrain = [0, 50]\ntest = [50, 53]\n")
    monkeypatch.setenv("TRACE_GYM_REGISTRY_PATH", str(tmp_path / "registry"))
    return "trace/test-seeded-lookup-v0"


def test_a_synthesized_env_is_rolled_out_by_seeds_and_resumes(tmp_path, seeded_registry):
    out = tmp_path / "seeds.jsonl"
    summary = rollout(seeded_registry, "oracle", out, seeds=3, samples=2, progress=False)
    assert summary.episodes == 6 and summary.successes == 6
    got = read_trajectories(out)
    assert sorted({t.seed for t in got}) == [0, 1, 2] and {t.sample for t in got} == {0, 1}
    again = rollout(seeded_registry, "oracle", out, seeds=4, samples=2, progress=False, resume=True)
    assert again.resumed == 6 and again.episodes == 8


def test_a_given_up_episode_is_scored_by_the_env_for_what_it_did(tmp_path, seeded_registry):
    """The env, not the runner, scores an abandoned episode: the order-lookup env pays
    0.2 for a tool call and 0.3 for the right look-up, so a model that looks the order
    up and then writes nothing parsable scores 0.5, not 0 (τ² scores its agent error 0:
    test_llm's give-up test)."""
    import re

    def answer(body):
        if not any(m.get("role") == "tool" for m in body["messages"]):
            order = re.search(r"#W\d{7}", body["messages"][-1]["content"]).group(0)
            return {"tool_calls": [{"name": "get_order_details", "arguments": {"order_id": order}}]}
        return {"content": '<tool_call>{"name": "get_order_details", "arguments": '}

    out = tmp_path / "gave-up.jsonl"
    with OpenAIDouble(answer) as server:
        summary = rollout(
            seeded_registry,
            "llm",
            out,
            seeds=2,
            progress=False,
            agent_kwargs={"model": "openai:double", "base_url": server.base_url, "api_key": "test-key"},
        )
    assert summary.aborted == 2
    for t in read_trajectories(out):
        assert t.error and "did not parse as an action 5 times" in t.error and t.termination_reason == "agent_error"
        assert t.reward == 0.5 and t.reward_info["components"] == {
            "used_tool": 1.0,
            "looked_up": 1.0,
            "correct_status": 0.0,
        }
        assert t.reward_info["termination_reason"] == "agent_error"


def test_a_synthesized_env_plays_the_split_its_manifest_names(tmp_path, seeded_registry):
    out = tmp_path / "split.jsonl"
    result = run_cli(
        "rollout",
        "--env",
        seeded_registry,
        "--agent",
        "oracle",
        "--split",
        "test",
        "--out",
        str(out),
        "--json",
        env={"TRACE_GYM_REGISTRY_PATH": str(tmp_path / "registry")},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["episodes"] == 3
    assert sorted(t.seed for t in read_trajectories(out)) == [50, 51, 52]


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({}, "pass --seeds N, or --split NAME of its manifest's [splits] (it names: test, train)"),
        ({"split": "dev"}, "has no split 'dev'"),
        ({"seeds": 2, "split": "test"}, "give --seeds or --split, not both"),
        ({"task_ids": ["1"]}, "played by seed"),
        ({"seeds": 1, "env_kwargs": {"user": "llm"}}, "plays its own user"),
    ],
)
def test_seed_selection_mistakes_are_clear(tmp_path, seeded_registry, kwargs, fragment):
    with pytest.raises(TraceGymError, match=None) as caught:
        rollout(seeded_registry, "oracle", tmp_path / "x.jsonl", progress=False, **kwargs)
    assert fragment in str(caught.value)


def test_seeds_on_a_target_is_a_clear_error(tmp_path):
    with pytest.raises(TraceGymError, match="has tasks: choose them with --split"):
        rollout(RETAIL, "oracle", tmp_path / "x.jsonl", seeds=3, progress=False)


# --- --adapter PATH with a local model ------------------------------------------------


def test_an_adapter_path_that_is_not_an_adapter_is_a_clear_error(tmp_path):
    with pytest.raises(TraceGymError, match="no LoRA adapter at"):
        rollout(
            RETAIL,
            "llm",
            tmp_path / "x.jsonl",
            split="test",
            limit=1,
            progress=False,
            agent_kwargs={"adapter": str(tmp_path / "nothing")},
        )


@pytest.mark.slow
def test_a_local_model_loads_the_adapter_given_by_path(tmp_path):
    """The adapter's path travels from the agent's options to the model and the run's
    settings: a tiny random model shows it (the 135M one prefilled τ²'s prompt twice)."""
    from families import tiny_model_folder

    base = tiny_model_folder(tmp_path / "tiny", layers=2, init=0.5)
    model = f"hf:{save_visible_lora(tmp_path / 'adapter', base)}"
    adapter = str(tmp_path / "adapter")
    runs = {}
    for name, options in (("plain", {"model": model}), ("adapted", {"model": model, "adapter": adapter})):
        out = tmp_path / f"{name}.jsonl"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rollout(
                RETAIL,
                "llm",
                out,
                split="test",
                limit=1,
                progress=False,
                env_kwargs={"max_steps": 2},
                agent_kwargs={"max_new_tokens": 12, **options},
            )
        [runs[name]] = read_trajectories(out)
    assert runs["adapted"].adapter == adapter and runs["plain"].adapter is None
    first = lambda t: next(m.raw for m in t.messages if m.role == "assistant" and m.raw is not None)  # noqa: E731
    assert first(runs["adapted"]) != first(runs["plain"])
    assert read_run_settings(tmp_path / "adapted.jsonl")[0]["agent_options"]["adapter"] == adapter


def test_every_derived_seed_comes_from_the_one_formula_and_keeps_its_value():
    """Seeds are pinned: a run resumed by a later version must draw the seeds it drew
    (episodes, GRPO groups, redraws, calibration), so the formula may not drift."""
    from trace_gym.rollout import episode_seed, plan_seeded_episodes
    from trace_gym.seeding import derive_seed
    from trace_gym.training.config import GRPOTrainingConfig
    from trace_gym.training.rollouts import plan_groups

    assert derive_seed(0, "0", 0) == episode_seed(0, "0", 0) == 1204990841
    assert derive_seed(7, "trace/tool-precision-v0", 3) == 271336901
    [first, *_] = plan_groups(
        GRPOTrainingConfig(env_ids=["trace/tool-precision-v0"], out="x", seed=7, iterations=1),
        {"trace/tool-precision-v0": None},
    )
    assert json.loads(first)["seed"] == derive_seed(7, "trace/tool-precision-v0", 0)
    assert [e.seed for e in plan_seeded_episodes([5], 2, run_seed=3)] == [derive_seed(3, "seed-5", k) for k in range(2)]


def test_one_loop_plays_lock_step_agents_and_agents_that_act_side_by_side():
    """play_batched is the one episode loop: an oracle (which acts) and a model agent (which
    requests a generation) play side by side in one call, and run_episode is its one-episode
    case: the same trajectory as the oracle's slot, step for step."""
    import gymnasium as gym

    from trace_gym.agents import OracleAgent, make_agent
    from trace_gym.rollout import Episode, play_batched, run_episode

    envs = [gym.make("trace/tau2-mock-v0") for _ in range(2)]
    try:
        model = make_agent("llm", model="smollm2-135m-instruct", max_new_tokens=8)
        played = list(
            play_batched(envs, [OracleAgent(), model], "trace/tau2-mock-v0", [Episode("create_task_1", 0, 0)] * 2)
        )
        by_agent = {p.trajectory.agent: p for p in played}
        assert set(by_agent) == {"oracle", "llm"}
        assert by_agent["oracle"].trajectory.reward == 1.0 and by_agent["oracle"].tokens is None
        assert by_agent["llm"].tokens is not None and by_agent["llm"].tokens.turns
        alone = run_episode(envs[0], OracleAgent(), "trace/tau2-mock-v0", Episode("create_task_1", 0, 0))
        assert [m.model_dump() for m in alone.messages] == [
            m.model_dump() for m in by_agent["oracle"].trajectory.messages
        ]
    finally:
        for env in envs:
            env.close()


def test_an_agent_without_the_protocols_members_is_refused_before_it_plays():
    """agents.base.Agent declares name, model and adapter beside reset and act: an agent
    written without model is refused in one line before its episode, not after it."""
    import gymnasium as gym

    from trace_gym.rollout import Episode, run_episode

    class Modelless:
        name = "modelless"

        def reset(self, observation, info, env=None):
            raise AssertionError("never started")

        def act(self, observation):
            return "hello"

    env = gym.make("trace/tau2-mock-v0")
    try:
        with pytest.raises(TraceGymError, match="Modelless is not an agent: it needs name, model and adapter"):
            run_episode(env, Modelless(), "trace/tau2-mock-v0", Episode("create_task_1", 0, 0))
    finally:
        env.close()


def test_a_lock_step_batch_is_generated_in_one_pass_whatever_the_models_default(tmp_path):
    """`[policy] batch = 32` played as four generations of 8 rows, the local model's default:
    the rollout's batch now reaches the model, so each turn is one batched generation."""
    from trace_gym.llm import make_backend
    from trace_gym.rollout import rollout

    backend = make_backend("smollm2-135m-instruct")
    assert backend.max_batch == 8
    sizes: list[int] = []
    inner = backend._complete_batch
    backend._complete_batch = lambda requests, stats: sizes.append(len(requests)) or inner(requests, stats)
    rollout(
        "trace/tau2-mock-v0",
        "llm",
        tmp_path / "mock.jsonl",
        agent_kwargs={"model": backend, "max_new_tokens": 4},
        split="base",
        samples=2,
        batch=10,
        env_kwargs={"max_steps": 3},
        progress=False,
    )
    assert sizes[0] == 10 and backend.max_batch == 10


def test_several_players_share_one_lock_step_batch_each_into_its_own_file(tmp_path):
    """Evaluation's methods: two agents over the same episodes, one batched generation per
    turn across both, each episode in its own player's file under its own settings; a
    second call resumes both and plays nothing."""
    from trace_gym.llm import make_backend
    from trace_gym.rollout import Player, rollout_players

    backend = make_backend("smollm2-135m-instruct")
    sizes: list[int] = []
    inner = backend._complete_batch
    backend._complete_batch = lambda requests, stats: sizes.append(len(requests)) or inner(requests, stats)
    players = [
        Player("llm", tmp_path / "short.jsonl", {"model": backend, "max_new_tokens": 2}),
        Player("llm", tmp_path / "long.jsonl", {"model": backend, "max_new_tokens": 6}),
    ]
    kwargs = dict(split="base", limit=3, batch=8, env_kwargs={"max_steps": 3}, progress=False, resume=True)
    summaries = rollout_players("trace/tau2-mock-v0", players, **kwargs)
    assert sizes[0] == 6  # 3 episodes of each player in one generation
    assert [s.out for s in summaries] == [str(p.out) for p in players]
    short, long = (read_trajectories(p.out) for p in players)
    assert [t.episode_id for t in short] != [] and sorted(t.episode_id for t in short) == sorted(
        t.episode_id for t in long
    )
    assert [read_run_settings(p.out)[0]["agent_options"]["max_new_tokens"] for p in players] == [2, 6]
    turns = {t.episode_id: sum(m.role == "assistant" for m in t.messages) for t in short}
    assert all(t.completion_tokens <= 2 * turns[t.episode_id] for t in short)
    assert any(t.completion_tokens > 2 * sum(m.role == "assistant" for m in t.messages) for t in long)
    sizes.clear()
    again = rollout_players("trace/tau2-mock-v0", players, **kwargs)
    assert sizes == [] and [s.resumed for s in again] == [3, 3]


def test_players_without_a_batch_play_in_turn_and_a_file_of_another_run_is_set_aside(tmp_path):
    from trace_gym.rollout import Player, rollout_players

    oracle, noop = tmp_path / "oracle.jsonl", tmp_path / "noop.jsonl"
    rollout("trace/tau2-mock-v0", "noop", noop, split="base", limit=2, env_kwargs={"max_steps": 2}, progress=False)
    players = [Player("oracle", oracle), Player("noop", noop)]
    moved = []

    def set_aside(path):
        moved.append(path)
        path.rename(path.with_suffix(".earlier"))

    kwargs = dict(split="base", limit=2, env_kwargs={"max_steps": 12}, progress=False, resume=True)
    with pytest.raises(TrajectoryStoreError, match="was made by another run"):
        rollout_players("trace/tau2-mock-v0", players, **kwargs)  # without set_aside: refused
    first = rollout_players("trace/tau2-mock-v0", players, **kwargs, set_aside=set_aside)
    assert moved == [noop] and [s.resumed for s in first] == [0, 0]
    assert [s.pass_at_1 for s in first] == [1.0, 0.0]
    assert {t.agent for t in read_trajectories(oracle)} == {"oracle"} and {
        t.agent for t in read_trajectories(noop)
    } == {"noop"}
    again = rollout_players("trace/tau2-mock-v0", players, **kwargs, set_aside=set_aside)
    assert [s.resumed for s in again] == [2, 2] and moved == [noop]
    with pytest.raises(TraceGymError, match="two players write to one file"):
        rollout_players("trace/tau2-mock-v0", [Player("oracle", oracle), Player("noop", oracle)], **kwargs)


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_players_on_threads_or_ray_each_fill_their_own_file_and_every_episode_is_heard(tmp_path, executor):
    """Without a lock-step batch each player plays in turn through the single-player paths:
    ``workers`` threads, or Ray's workers."""
    from trace_gym.rollout import Player, rollout_players

    heard = []
    players = [Player("oracle", tmp_path / "oracle.jsonl"), Player("noop", tmp_path / "noop.jsonl")]
    summaries = rollout_players(
        "trace/tau2-mock-v0",
        players,
        split="base",
        limit=2,
        executor=executor,
        workers=2,
        env_kwargs={"max_steps": 12},
        progress=False,
        on_episode=heard.append,
    )
    assert [s.out for s in summaries] == [str(p.out) for p in players]
    assert [s.pass_at_1 for s in summaries] == [1.0, 0.0] and [s.episodes for s in summaries] == [2, 2]
    for player in players:
        assert [t.agent for t in read_trajectories(player.out)] == [player.agent] * 2
    assert sorted(t.agent for t in heard) == ["noop", "noop", "oracle", "oracle"]


def test_a_lock_step_batch_refuses_model_agents_of_two_backends():
    import gymnasium as gym

    from trace_gym.agents import make_agent
    from trace_gym.llm.local import LocalHF
    from trace_gym.rollout import Episode, play_batched

    first = make_agent("llm", model="smollm2-135m-instruct", max_new_tokens=2)
    other = LocalHF.from_model(first.backend.model, first.backend.tokenizer)  # the same weights, another backend
    agents = {0: first, 1: make_agent("llm", model=other, max_new_tokens=2)}
    envs = [gym.make("trace/tau2-mock-v0") for _ in range(2)]
    try:
        with pytest.raises(TraceGymError, match="must share one backend"):
            list(
                play_batched(
                    envs, [], "trace/tau2-mock-v0", [Episode("create_task_1", k, k) for k in range(2)],
                    agent_for=lambda slot, episode: agents[slot],
                )
            )  # fmt: skip
        with pytest.raises(TraceGymError, match="must share one backend"):  # a list of agents: before any step
            episodes = [Episode("create_task_1", k, k) for k in range(2)]
            list(play_batched(envs, [agents[0], agents[1]], "trace/tau2-mock-v0", episodes))
    finally:
        for env in envs:
            env.close()


def test_a_leveled_env_is_played_at_the_level_asked_and_a_bad_level_is_one_line(tmp_path):
    asks = {}
    for level in (0, 1):
        out = tmp_path / f"level{level}.jsonl"
        result = run_cli(
            "rollout", "--env", "trace/complete-actions-v0", "--agent", "oracle", "--seeds", "3", "--level", str(level),
            "--out", str(out), "--no-progress",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert read_run_settings(out)[0]["env_options"] == {"level": level}  # recorded: a resume at another refuses
        asks[level] = [next(m.content for m in t.messages if m.role == "user") for t in read_trajectories(out)]
    assert all("; also, " not in a for a in asks[0])  # level 0: one change asked for
    assert all("; also, " in a for a in asks[1])  # level 1: two
    for env, level, fragment in (
        ("trace/complete-actions-v0", "5", "level must be an integer in 0..2, got 5"),
        ("trace/well-formed-calls-v0", "1", "has no difficulty levels"),
        (RETAIL, "1", "--level: trace/tau2-retail-v0 is a target; levels are for synthesized envs"),
    ):
        where = ["--tasks", "1"] if env == RETAIL else ["--seeds", "1"]
        result = run_cli("rollout", "--env", env, "--agent", "oracle", *where, "--level", level,
                         "--out", str(tmp_path / "bad.jsonl"), "--no-progress")  # fmt: skip
        assert result.returncode == 2 and fragment in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_pass_hat_k_is_tau2s_estimator_over_tasks():
    """pass^k averages, over tasks, the chance that k of a task's samples all succeed:
    C(successes, k) / C(trials, k), tau2's own ``pass_hat_k``; k runs up to the fewest
    samples any task has."""
    from tau2.metrics.agent_metrics import pass_hat_k

    from trace_gym.rollout import summarize
    from trace_gym.trajectory import Trajectory

    outcomes = {"a": [1.0, 1.0, 0.0], "b": [1.0, 0.0, 0.0], "c": [1.0, 1.0, 1.0, 0.0]}
    episodes = []
    for task, rewards in outcomes.items():
        for sample, reward in enumerate(rewards):
            episodes.append(
                Trajectory(
                    episode_id=f"trace/x-v0|{task}|{sample}", env_id="trace/x-v0", task_id=task, sample=sample,
                    agent="oracle", messages=[], reward=reward, terminated=True, truncated=False, steps=1,
                    started_at="2026-01-01T00:00:00+00:00", wall_s=0.1,
                )
            )  # fmt: skip
    summary = summarize(episodes, env_id="trace/x-v0", agent="oracle")
    assert sorted(summary.pass_hat_k) == [1, 2, 3]  # task a and b have 3 samples
    for k in (1, 2, 3):
        tau2 = sum(pass_hat_k(len(r), int(sum(r)), k) for r in outcomes.values()) / len(outcomes)
        assert summary.pass_hat_k[k] == pytest.approx(tau2)
    assert summary.pass_hat_k[2] == pytest.approx((1 / 3 + 0 + 1 / 2) / 3)
    assert summary.pass_at_1 == pytest.approx((2 / 3 + 1 / 3 + 3 / 4) / 3)
