"""The GEPA baseline: real episodes of τ²-retail through the rollout loop, a real
GEPA search (the gepa package), both models behind a local OpenAI-compatible
server on 127.0.0.1 (the policy, and a reflection model replaying a recorded answer)."""

import json

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401
from conftest import run_cli
from openai_double import OpenAIDouble, gold_answer
from trace_gym.gepa_baseline import GEPAConfig, GEPAError, feedback, run_gepa
from trace_gym.store import read_trajectories

pytest.importorskip("gepa")  # an extra; make test installs it, so this never skips there

# The one instruction that unlocks the policy below; the reflection model proposes it.
KEY = "Before you answer, look up the user and their order with the tools, then make the change they ask for."
REFLECTION = f"The agent never used its tools. A better instruction:\n```\n{KEY}\n```"
TASKS = ["0", "1", "2", "3", "4", "5", "6", "7"]  # the first 8 of the train split: 4 train, 4 validation


def serve(split="train", tasks=TASKS, reflector_down=None, key="test-key"):
    env = gym.make("trace/tau2-retail-v0", split=split)
    scripts = {}
    for tid in env.unwrapped.task_ids[: len(tasks)]:
        obs, _ = env.reset(options={"task_id": tid})
        scripts[obs] = env.unwrapped.oracle_actions()
    env.close()
    gold = gold_answer(scripts)

    def answer(body):
        if body["model"] == "reflector":
            if reflector_down and reflector_down[0]:
                return {"status": 400, "message": "the reflector is overloaded"}
            return {"content": REFLECTION}
        if KEY in body["messages"][0]["content"]:  # the policy solves the task only with the instruction
            return gold(body)
        return {"content": "I am sorry, I cannot help with that. Is there anything else I can help you with?"}

    return OpenAIDouble(answer, models=("policy", "reflector"), key=key)


def episodes_served(server):
    """The policy's first request of each episode: no assistant turn yet after the user's first message."""
    firsts = []
    for r in server.requests:
        if r["model"] != "policy":
            continue
        start = next(i for i, m in enumerate(r["messages"]) if m["role"] == "user")
        if not any(m["role"] == "assistant" for m in r["messages"][start:]):
            firsts.append(r)
    return firsts


@pytest.fixture
def api(monkeypatch):
    with serve() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield server


def test_gepa_finds_the_instruction_within_the_budget_and_counts_every_episode(api, tmp_path):
    config = GEPAConfig(
        env="trace/tau2-retail-v0",
        model="openai:policy",
        reflection="openai:reflector",
        budget=20,
        out=str(tmp_path / "gepa"),
        tasks=8,
        val_tasks=4,
        minibatch=2,
    )
    outcome = run_gepa(config, say=lambda m: None)

    assert outcome.seed_val_score == 0.0 and outcome.best_val_score == 1.0
    assert KEY in outcome.best_prompt and outcome.best_index > 0
    assert (tmp_path / "gepa" / "best_prompt.txt").read_text().strip() == outcome.best_prompt
    # Every episode played counts, and the count is the episodes stored, GEPA's metric calls and the
    # policy's conversations on the server alike; none of it over the budget.
    files = sorted((tmp_path / "gepa" / "episodes").glob("call-*.jsonl"))
    stored = sum(len(read_trajectories(f)) for f in files)
    assert outcome.rollouts == stored == outcome.gepa_metric_calls == len(episodes_served(api)) <= config.budget
    assert outcome.reflection_calls == 1 and outcome.warning is None
    search = [json.loads(line) for line in (tmp_path / "gepa" / "search.jsonl").read_text().splitlines()]
    assert [c["val_score"] for c in search] == [0.0, 1.0] and search[1]["parents"] == [0]
    calls = [json.loads(line) for line in (tmp_path / "gepa" / "episodes" / "calls.jsonl").read_text().splitlines()]
    assert sum(c["episodes"] for c in calls) == stored and calls[-1]["rollouts_so_far"] == stored
    # The seed on validation (4); iteration 1: parent and child on a minibatch (2 + 2), the winning child on
    # validation (4); iteration 2: the new parent on a minibatch (2), perfect, so nothing to reflect on;
    # then 14 + 8 (the next iteration's worst case) > 20 stops the search.
    assert [c["episodes"] for c in calls] == [4, 2, 2, 4, 2]
    # The reflection model read the failed episodes with the env's verdict.
    [reflection] = [r for r in api.requests if r["model"] == "reflector"]
    prompt = reflection["messages"][0]["content"]
    assert "not solved" in prompt and "expected actions not taken" in prompt and "I am sorry" in prompt

    # A finished search is kept on --resume, and refused without it.
    assert run_gepa(config, resume=True, say=lambda m: None).best_prompt == outcome.best_prompt
    with pytest.raises(GEPAError, match="already holds a GEPA search"):
        run_gepa(config, say=lambda m: None)


def test_the_budget_is_a_hard_stop(api, tmp_path):
    # 4 validation for the seed + an iteration (2 x 2 minibatch, 4 validation) = 12; 13 cannot pay for a second.
    config = GEPAConfig(
        env="trace/tau2-retail-v0",
        model="openai:policy",
        reflection="openai:reflector",
        budget=13,
        out=str(tmp_path / "g"),
        tasks=8,
        val_tasks=4,
        minibatch=2,
        seed_prompt="Be brief.",
    )
    outcome = run_gepa(config, say=lambda m: None)
    assert outcome.rollouts <= 13
    with pytest.raises(GEPAError, match="cannot pay for the seed prompt's validation"):
        GEPAConfig(env="trace/tau2-retail-v0", budget=11, val_tasks=4, minibatch=2).check()


def test_a_failing_reflection_model_stops_the_search_loudly_and_resume_continues_it(tmp_path, monkeypatch):
    down = [True]
    with serve(reflector_down=down) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        config = GEPAConfig(
            env="trace/tau2-retail-v0",
            model="openai:policy",
            reflection="openai:reflector",
            budget=20,
            out=str(tmp_path / "g"),
            tasks=8,
            val_tasks=4,
            minibatch=2,
        )
        with pytest.raises(GEPAError, match="reflection model openai:reflector failed.*overloaded"):
            run_gepa(config, say=lambda m: None)
        before = sum(len(read_trajectories(f)) for f in (tmp_path / "g" / "episodes").glob("call-*.jsonl"))
        assert before == 4 + 2  # the seed's validation, the parent's minibatch; then no proposal, and it stopped
        down[0] = False
        outcome = run_gepa(config, resume=True, say=lambda m: None)
    assert KEY in outcome.best_prompt and outcome.best_val_score == 1.0
    # The episodes of the failed attempt were paid for: they count against the same budget.
    assert outcome.rollouts == sum(
        len(read_trajectories(f)) for f in (tmp_path / "g" / "episodes").glob("call-*.jsonl")
    )
    assert before < outcome.rollouts <= config.budget


def test_cli_baseline_gepa_prints_the_search_and_the_held_out_row(api, tmp_path):
    out = tmp_path / "cli"
    result = run_cli(
        "baseline",
        "gepa",
        "--env",
        "trace/tau2-retail-v0",
        "--model",
        "openai:policy",
        "--reflection",
        "openai:reflector",
        "--budget",
        "12",
        "--tasks",
        "8",
        "--val-tasks",
        "4",
        "--minibatch",
        "2",
        "--eval-split",
        "train",
        "--eval-tasks",
        "3",
        "--out",
        str(out),
        env={"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": "test-key"},
    )
    assert result.returncode == 0, result.stderr
    assert "candidate 1 of 2" in result.stdout and "| gepa |" in result.stdout
    row = json.loads((out / "eval" / "results.json").read_text())["results"][0]
    assert row["method"] == "gepa" and row["pass_1"] == 1.0 and row["cost"]["train_rollouts"] == 12
    again = run_cli(
        "baseline",
        "gepa",
        "--env",
        "trace/tau2-retail-v0",
        "--model",
        "openai:policy",
        "--budget",
        "12",
        "--val-tasks",
        "4",
        "--minibatch",
        "2",
        "--out",
        str(out),
        env={"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": "test-key"},
    )
    assert again.returncode == 2 and "already holds a GEPA search" in again.stderr and "Traceback" not in again.stderr


def test_feedback_names_what_the_env_found_missing():
    from trace_gym.trajectory import Message, Trajectory

    t = Trajectory(
        episode_id="e",
        env_id="x",
        agent="llm",
        messages=[Message(role="user", content="hi")],
        reward=0.0,
        reward_info={
            "components": {"DB": 0.0},
            "reason": "failed: DB",
            "details": {
                "actions": [{"name": "cancel_pending_order", "arguments": {}, "met": False}],
                "communicate": [{"info": "refund 10", "met": False}],
            },
        },
        terminated=True,
        truncated=False,
        termination_reason="user_stop",
        steps=3,
        started_at="",
        wall_s=0,
    )
    text = feedback(t)
    assert "not solved" in text and "DB=0" in text and "cancel_pending_order" in text and "refund 10" in text


def pipeline_config(tmp_path, policy_server="", reflection_server=""):
    """A run of the gepa and evaluate stages with both models on the double; the
    ``*_server`` lines go in [policy] and [gepa]."""
    config = tmp_path / "run.toml"
    config.write_text(f"""
[run]
target = "trace/tau2-retail-v0"
dir = "{tmp_path / "run"}"
stages = ["gepa", "evaluate"]

[policy]
model = "openai:policy"
{policy_server}

[gepa]
reflection = "openai:reflector"
{reflection_server}
budget = 12
tasks = 8
val_tasks = 4
minibatch = 2

[evaluate]
split = "train"   # the double knows the train split's tasks
tasks = 3
methods = ["base", "gepa"]
""")
    return config


def test_the_pipeline_shows_the_gepa_row_beside_the_others_when_the_config_asks(api, tmp_path):
    config = pipeline_config(tmp_path)
    env = {"OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": "test-key"}
    result = run_cli("run", str(config), env=env)
    assert result.returncode == 0, result.stderr
    rows = {r["method"]: r for r in json.loads((tmp_path / "run" / "eval" / "results.json").read_text())["results"]}
    assert rows["base"]["pass_1"] == 0.0 and rows["gepa"]["pass_1"] == 1.0
    assert rows["gepa"]["cost"] == {"train_rollouts": 12, "analyst_calls": 1, "wall_s": rows["gepa"]["cost"]["wall_s"]}
    table = (tmp_path / "run" / "eval" / "results.md").read_text()
    assert "| base |" in table and "| gepa |" in table
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| gepa |" in report and "GEPA" in report and KEY in report
    # Resuming keeps the search (no new episode, no new reflection).
    served = len(api.requests)
    again = run_cli("run", str(config), "--resume", env=env)
    assert again.returncode == 0 and "[gepa] unchanged" in again.stderr and len(api.requests) == served


def test_the_policy_and_the_reflection_model_each_reach_their_own_server(tmp_path):
    with serve(key="policy-key") as policy, serve(key="reflector-key") as reflector:
        config = pipeline_config(
            tmp_path,
            f'base_url = "{policy.base_url}"\napi_key_env = "POLICY_KEY"',
            f'base_url = "{reflector.base_url}"\napi_key_env = "REFLECTOR_KEY"',
        )
        env = {  # the shared variables point nowhere: every request must go to its role's own server
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
            "OPENAI_API_KEY": "nobody's",
            "POLICY_KEY": "policy-key",
            "REFLECTOR_KEY": "reflector-key",
        }
        result = run_cli("run", str(config), env=env)
    assert result.returncode == 0, result.stderr
    assert policy.requests and {r["model"] for r in policy.requests} == {"policy"}
    assert reflector.requests and {r["model"] for r in reflector.requests} == {"reflector"}
    rows = {r["method"]: r for r in json.loads((tmp_path / "run" / "eval" / "results.json").read_text())["results"]}
    assert rows["gepa"]["pass_1"] == 1.0  # the reflection's instruction reached the policy
    written = [p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert not any("policy-key" in text or "reflector-key" in text for text in written), "a key was written down"


@pytest.mark.slow
def test_offline_the_embedded_model_reflects_and_the_run_says_it_is_no_fair_baseline(api, tmp_path):
    said = []
    config = GEPAConfig(
        env="trace/tau2-retail-v0",
        model="openai:policy",
        reflection=None,
        budget=6,
        out=str(tmp_path / "offline"),
        tasks=4,
        val_tasks=2,
        minibatch=1,
        reflection_max_tokens=128,
    )
    outcome = run_gepa(config, say=said.append)
    assert outcome.reflection == "smollm2-135m-instruct" and outcome.reflection_calls == 1
    assert "not a fair GEPA baseline" in outcome.warning and any("not a fair GEPA baseline" in m for m in said)
    assert outcome.rollouts == 4 <= config.budget  # seed validation 2 + parent and child on a minibatch of 1
