"""Environment synthesis end to end: a local OpenAI-compatible server on 127.0.0.1 replays
recorded analyst answers; gate, sandbox validation, repair, calibration and the atomic
write into a temporary registry all run for real."""

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from conftest import FIXTURE_ENVS, PYTHON, run_cli
from openai_double import OpenAIDouble

from trace_gym.synthesis import SynthesisConfig, load_capabilities, synthesize
from trace_gym.validation import ValidationConfig

TARGET = "trace/tau2-retail-v0"
# what the replayed analyst writes: an env on the world kit (import world), as the prompt teaches
GOOD = (FIXTURE_ENVS.parent / "kit_lookup_env.py").read_text()
QUICK = ValidationConfig(seeds=30, floor_seeds=10, determinism_seeds=2, calibration_seeds=4, k=2, seed=0)
BUGGY = GOOD.replace('return {"reward": reward,', 'return {"reward": reward * 2,')  # out of [0, 1]: reward_range
ESCAPES = {
    "reads a host file": GOOD.replace('prompt = "You are', 'prompt = open("/etc/hostname").read() + "You are'),
    "opens a socket": GOOD.replace("import json\n", "import json\nimport socket\n"),
    "walks to os through module attributes": GOOD.replace(
        "import random\n", "import random\nimport datetime\n"
    ).replace(
        "rng = random.Random(seed)", 'rng = random.Random(seed)\n        datetime.sys.modules["os"].system("id")'
    ),
    # past the gate: stopped at run time, and the report names the layer from the error's type
    "formats an attribute field": GOOD.replace('prompt = "You are', 'prompt = "{0.real}".format(1) + "You are'),
    "spins in reset": GOOD.replace(
        "rng = random.Random(seed)", "rng = random.Random(seed)\n        while True:\n            pass"
    ),
}


def fenced(code: str) -> str:
    return "Here is the environment.\n\n```python\n" + code + "```\n"


def capabilities_file(tmp_path: Path) -> Path:
    folder = tmp_path / "identify"
    folder.mkdir(exist_ok=True)
    (folder / "capabilities.json").write_text(
        json.dumps(
            {
                "selected": [
                    {
                        "name": "exact_lookup",
                        "description": "Look a record up with the exact id the user gives before answering.",
                    }
                ]
            }
        )
    )
    (folder / "labels.jsonl").write_text(
        json.dumps(
            {
                "episode_id": "e1",
                "capability": "exact_lookup",
                "label": "LACKING",
                "evidence": "message 3: order id W123 without '#'",
            }
        )
        + "\n"
    )
    return folder / "capabilities.json"


def replay(*answers: str):
    """Answer the n-th request with the n-th recorded answer (the last one again after)."""

    def answer(body):
        n = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return {"content": answers[min(n, len(answers) - 1)]}

    return answer


def run(tmp_path, double, **kwargs):
    config = SynthesisConfig(**{"validation": QUICK, "backend": "bwrap", **kwargs.pop("config", {})})
    return synthesize(
        capabilities_file(tmp_path),
        TARGET,
        analyst="openai:double",
        registry_dir=tmp_path / "registry",
        config=config,
        cache_dir=tmp_path / "cache",
        base_url=double.base_url,
        api_key="test-key",
        **kwargs,
    )


@pytest.mark.slow
def test_a_bug_the_validator_catches_is_repaired_from_its_evidence(tmp_path):
    import gymnasium as gym

    with OpenAIDouble(replay(fenced(BUGGY), fenced(GOOD))) as double:
        result = run(tmp_path, double)
    [outcome] = result.outcomes
    assert outcome.status == "registered", outcome.last_report
    assert [a.passed for a in outcome.attempts] == [False, True]
    assert "reward_range" in outcome.attempts[0].failing_checks
    # the second request carries the first attempt's failing evidence, in the same conversation
    assert len(double.requests) == 2
    second = double.requests[1]["messages"]
    assert second[1]["role"] == "assistant" and "reward * 2" in second[1]["content"]
    assert "reward_range" in second[2]["content"] and "reward() returned reward=2.0" in second[2]["content"]
    assert result.calls == 2 and result.tokens > 0

    folder = tmp_path / "registry" / "exact-lookup"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "env.py", "manifest.toml", "validation.json"]
    assert "import world" in (folder / "env.py").read_text()  # registered on the world kit
    assert not any((tmp_path / "registry" / ".synthesis").iterdir())
    env = gym.make(outcome.env_id, backend="bwrap")
    obs, info = env.reset(seed=3)
    assert "order" in obs and info["tools"][0]["function"]["name"] == "get_order_details"
    for action in env.unwrapped.oracle_actions():
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and reward == 1.0
    env.close()

    # provenance is complete and the code hash matches the files
    from trace_gym.hashing import code_hash
    from trace_gym.registry import read_manifest
    from trace_gym.synthesis import TEMPLATE_VERSION, template_hash

    entry = read_manifest(folder)
    prov = entry.manifest["provenance"]
    assert prov["analyst"] == "openai:double"
    assert prov["template_version"] == TEMPLATE_VERSION and prov["template_sha256"] == template_hash()
    assert prov["code_hash"] == code_hash(folder)
    assert prov["env_sha256"] == hashlib.sha256((folder / "env.py").read_bytes()).hexdigest()
    assert [(a["number"], a["kind"], a["passed"], a["failing_checks"]) for a in prov["attempts"]] == [
        (1, "generate", False, outcome.attempts[0].failing_checks),
        (2, "repair", True, []),
    ]
    assert "reward_range" in prov["attempts"][0]["failing_checks"] and prov["attempts"][0]["stopped_by"] == "validation"
    assert prov["calibration"] == {"run": False}
    assert entry.capability["serves"] == ["exact_lookup"]
    report = json.loads((folder / "validation.json").read_text())
    assert report["passed"] and report["code_hash"] == code_hash(folder)
    assert entry.validation_status() == "passed"

    # --resume: a registered capability with a matching code hash is not redone, and costs no call
    with OpenAIDouble(replay(fenced(GOOD))) as double:
        again = run(tmp_path, double, config={"resume": True})
    assert again.outcomes[0].status == "kept" and double.requests == []


@pytest.mark.slow
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_an_escaping_answer_is_stopped_and_the_report_names_the_layer(tmp_path, escape):
    config = {"max_attempts": 1}
    if escape == "spins in reset":  # each check pays one call time-out: 2 s each, not the default 10
        config["validation"] = dataclasses.replace(QUICK, call_timeout_s=2.0)
    with OpenAIDouble(replay(fenced(ESCAPES[escape]))) as double:
        result = run(tmp_path, double, config=config)
    [outcome] = result.outcomes
    assert outcome.status == "failed"
    layer = outcome.attempts[0].stopped_by
    expected = {
        "reads a host file": "static gate",
        "opens a socket": "static gate",
        "walks to os through module attributes": "static gate",  # datetime.sys: not on the allowlist
        "formats an attribute field": "sandbox language layer",
        "spins in reset": "sandbox time limit",
    }[escape]
    assert layer.startswith(expected), (layer, outcome.attempts[0].evidence)
    assert f"refused by {layer}" in outcome.message
    assert not (tmp_path / "registry" / "exact-lookup").exists()
    assert [p.name for p in (tmp_path / "registry").iterdir() if not p.name.startswith(".")] == []


@pytest.mark.slow
def test_an_answer_that_never_validates_ends_at_the_limit_with_the_last_report(tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "keep.txt").write_text("untouched")
    before = sorted(p.name for p in registry.iterdir())
    with OpenAIDouble(replay(fenced(BUGGY))) as double:
        result = run(tmp_path, double, config={"max_attempts": 3})
    [outcome] = result.outcomes
    assert outcome.status == "failed" and len(outcome.attempts) == 3 and len(double.requests) == 3
    assert "reward_range" in outcome.last_report and "FAILED" in outcome.last_report
    assert sorted(p.name for p in registry.iterdir() if p.name != ".synthesis") == before
    assert (registry / "keep.txt").read_text() == "untouched"

    # the command line says the same: exit 1, the last report, which layer refused it
    with OpenAIDouble(replay(fenced(BUGGY))) as double:
        env = {"OPENAI_BASE_URL": double.base_url, "OPENAI_API_KEY": "test-key"}
        cli = run_cli(
            "synthesize",
            "--capabilities",
            str(capabilities_file(tmp_path)),
            "--target",
            TARGET,
            "--analyst",
            "openai:double",
            "--registry",
            str(registry),
            "--backend",
            "bwrap",
            "--seeds",
            "30",
            "--validation-seed",
            "0",
            "--max-attempts",
            "2",
            "--cache",
            str(tmp_path / "cli-cache"),
            env=env,
        )
    assert cli.returncode == 1, cli.stderr[-2000:]
    assert (
        "FAILED" in cli.stdout
        and "refused by validation" in cli.stdout
        and "last report for exact_lookup" in cli.stdout
    )
    assert "FAIL  reward_range" in cli.stdout and "2 calls" in cli.stdout
    assert "attempt 1" in cli.stderr and "attempt 2" in cli.stderr  # progress per attempt
    assert sorted(p.name for p in registry.iterdir() if p.name != ".synthesis") == before


@pytest.mark.slow
def test_an_always_succeeding_policy_gets_a_harder_variant_asked_for_with_the_reason(tmp_path):
    with OpenAIDouble(replay(fenced(GOOD))) as double:
        result = run(tmp_path, double, config={"policy": "oracle", "max_calibration_rounds": 1})
    [outcome] = result.outcomes
    assert [a.kind for a in outcome.attempts] == ["generate", "harder"]
    request = double.requests[1]["messages"][-1]["content"]
    assert "harder variant" in request and "succeeds too often" in request and "mean reward 1.00" in request
    assert outcome.status == "registered" and "out of band" in outcome.message
    prov = tomllib.loads((tmp_path / "registry" / "exact-lookup" / "manifest.toml").read_text())["provenance"]
    assert (
        prov["calibration"]["run"] and prov["calibration"]["mean_reward"] == 1.0 and not prov["calibration"]["in_band"]
    )
    assert prov["policy"] == "oracle"


@pytest.mark.slow
def test_kill_9_mid_run_leaves_no_half_written_env_folder(tmp_path):
    """Killed while the final files are being written and re-validated, then rerun: the
    registry shows either nothing or a complete env, never a partial folder."""
    registry = tmp_path / "registry"
    caps = capabilities_file(tmp_path)
    args = [
        "synthesize",
        "--capabilities",
        str(caps),
        "--target",
        TARGET,
        "--analyst",
        "openai:double",
        "--registry",
        str(registry),
        "--backend",
        "bwrap",
        "--seeds",
        "30",
        "--validation-seed",
        "0",
        "--cache",
        str(tmp_path / "cache"),
    ]
    with OpenAIDouble(replay(fenced(GOOD))) as double:
        env = {**os.environ, "OPENAI_BASE_URL": double.base_url, "OPENAI_API_KEY": "test-key"}
        exe = str(Path(PYTHON).parent / "trace-gym")
        proc = subprocess.Popen(
            [exe, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.time() + 300
        killed_in_final_write = False
        while time.time() < deadline and proc.poll() is None:
            staged = (
                list((registry / ".synthesis").glob("*/manifest.toml")) if (registry / ".synthesis").is_dir() else []
            )
            if staged and "[provenance]" in staged[0].read_text():
                os.killpg(proc.pid, signal.SIGKILL)
                killed_in_final_write = True
                break
            time.sleep(0.02)
        proc.wait(timeout=30)
        assert killed_in_final_write, proc.stderr.read().decode()[-2000:]
        assert not (registry / "exact-lookup").exists()
        assert [p.name for p in registry.iterdir() if not p.name.startswith(".")] == []

        again = run_cli(*args, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "REGISTERED" in again.stdout and "1 cached answers" in again.stdout  # the answer came from the disk cache
    assert sorted(p.name for p in (registry / "exact-lookup").iterdir()) == [
        "README.md",
        "env.py",
        "manifest.toml",
        "validation.json",
    ]
    assert not any((registry / ".synthesis").iterdir())  # the dead run's staging folder was cleaned


def test_offline_every_gold_capability_on_retail_is_served_by_a_validated_registry_env(tmp_path):
    from trace_gym.identification import GOLD_CAPABILITIES

    rows = [{"name": n, "description": d} for n, d in GOLD_CAPABILITIES.items()]
    rows.append({"name": "greets_the_customer", "description": "Says hello."})
    (tmp_path / "capabilities.json").write_text(json.dumps({"selected": rows}))
    result = run_cli("synthesize", "--capabilities", str(tmp_path / "capabilities.json"), "--target", TARGET, "--json")
    assert result.returncode == 1  # one capability could not be served
    outcomes = {o["capability"]: o for o in json.loads(result.stdout)["outcomes"]}
    assert outcomes["greets_the_customer"]["status"] == "not_synthesized"
    from trace_gym.registry import get_entry

    for name in GOLD_CAPABILITIES:
        assert outcomes[name]["status"] == "served", outcomes[name]
        assert "nothing was synthesized" in outcomes[name]["message"]
        entry = get_entry(outcomes[name]["env_id"])
        assert entry.target == TARGET and name in entry.capability["serves"]
        assert entry.validation_status() == "passed", (entry.id, entry.validation_status())
    human = run_cli("synthesize", "--capabilities", str(tmp_path / "capabilities.json"), "--target", TARGET)
    assert "SERVED" in human.stdout and "served by the registry env trace/" in human.stdout
    assert "NOT_SYNTHESIZED" in human.stdout and "no registry env serves it" in human.stdout


def test_user_mistakes_are_one_line(tmp_path):
    result = run_cli("synthesize", "--capabilities", str(tmp_path / "missing.json"), "--target", TARGET)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "no file at" in result.stderr
    (tmp_path / "c.json").write_text(json.dumps({"selected": [{"name": "x_y", "description": "d"}]}))
    for extra, words in (
        (["--analyst", "gpt-4"], "unknown analyst"),
        (["--only", "nope"], "--only nope"),
        (["--target", "trace/tool-precision-v0"], "is not a target"),
    ):
        args = ["synthesize", "--capabilities", str(tmp_path / "c.json"), "--target", TARGET, *extra]
        result = run_cli(*args)
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_code_is_taken_from_the_fenced_block_and_an_answer_without_code_is_refused():
    from trace_gym.synthesis import SynthesisError, extract_code

    assert extract_code("Sure:\n```python\nTOOLS = []\nclass Environment:\n    pass\n```\nDone.").startswith(
        "TOOLS = []"
    )
    with pytest.raises(SynthesisError, match="no ```python block"):
        extract_code("I cannot write that environment.")


def test_calibration_asks_for_an_easier_variant_when_the_policy_never_succeeds():
    from trace_gym.synthesis.loop import calibration_request

    never = {
        "mean_reward": 0.0,
        "success_rate": 0.0,
        "all_success_groups": 0.0,
        "all_zero_groups": 1.0,
        "constant_groups": 1.0,
    }
    direction, reason, _ = calibration_request(never, ValidationConfig())
    assert direction == "easier" and "rarely succeeds" in reason
    flat = {
        "mean_reward": 0.4,
        "success_rate": 0.4,
        "all_success_groups": 0.0,
        "all_zero_groups": 0.0,
        "constant_groups": 0.9,
    }
    assert calibration_request(flat, ValidationConfig())[0] == "more graded"


@pytest.mark.slow
def test_the_prompt_is_built_from_any_target_and_the_capability_evidence(tmp_path):
    """Nothing benchmark-specific in the loop: the mock target's own tools, policy and
    results fill the same template, and identification's evidence is quoted."""
    from trace_gym.registry import get_entry
    from trace_gym.synthesis.prompt import generation_prompt, target_context
    from trace_gym.tools import load_frozen_tools, tool_name

    [cap] = load_capabilities(capabilities_file(tmp_path))
    entry = get_entry("trace/tau2-mock-v0")
    context = target_context(entry)
    prompt = generation_prompt(cap, context)
    assert "trace/tau2-mock-v0" in prompt and "retail" not in prompt.lower()
    tools = load_frozen_tools(entry.tools_path)
    assert json.dumps(tools, indent=1, ensure_ascii=False) in prompt  # the frozen schemas, whole
    assert all(f'"name": "{tool_name(t)}"' in prompt for t in tools)
    assert context.policy and context.policy.strip() in prompt
    assert context.tool_results and context.tool_results[0] in prompt
    assert "order id W123 without '#'" in prompt and cap.description in prompt
    assert "Transfer rationale" in prompt and "random.Random(seed)" in prompt
    assert "world kit (`import world`)" in prompt and "It has nothing for trace/tau2-mock-v0 yet" in prompt


def test_the_prompt_teaches_the_world_kit_from_the_kits_own_functions():
    from trace_gym.sandbox import world
    from trace_gym.synthesis.prompt import world_kit_text

    text = world_kit_text("trace/tau2-retail-v0")
    public = [n for n in vars(world) if n.startswith("retail_") and callable(getattr(world, n))]
    assert public and all(f"`world.{n}(" in text for n in public + ["script", "graded"])
    assert "`world.CANCEL_SAID` = {'no longer needed'" in text and "`world.json" not in text
    from trace_gym.sandbox.language import MODULES

    taught = set(re.findall(r"`world\.(\w+)", text))
    assert taught and taught <= MODULES["world"]  # nothing the prompt teaches is refused by the static gate
    assert "return_delivered_order_items" in text and "_retail_call" not in text
    airline = world_kit_text("trace/tau2-airline-v0")
    public = [n for n in vars(world) if n.startswith("airline_") and callable(getattr(world, n))]
    assert public and all(f"`world.{n}(" in airline for n in public + ["called", "script", "graded"])
    assert "retail_" not in airline and "logged_in" not in airline  # retail's login calls: not airline's
    assert set(re.findall(r"`world\.(\w+)", airline)) <= MODULES["world"] and "cancel_reservation" in airline
    assert world_kit_text("trace/tau2-telecom-v0").startswith("It has nothing for trace/tau2-telecom-v0")


def test_an_env_folder_is_named_after_the_capability_id():
    from trace_gym.identification.stats import capability_id
    from trace_gym.synthesis.loop import env_name

    for name in ["precise_arguments", "Tool-call precision!", "verify  preconditions"]:
        assert env_name(name) == capability_id(name).replace("_", "-")  # one normaliser, two spellings
    assert env_name("9 lives") == "env-9-lives"  # a folder name starts with a letter
    assert len(env_name("x" * 80)) == 48


def test_a_prompt_fills_any_placeholder_name_and_refuses_a_missing_one(tmp_path):
    from trace_gym.prompts import render_prompt

    (tmp_path / "ask_v9.md").write_text("$name asks about $folder", encoding="utf-8")
    assert render_prompt(tmp_path, "ask", "v9", name="Ann", folder="orders") == "Ann asks about orders"
    with pytest.raises(KeyError, match="folder"):
        render_prompt(tmp_path, "ask", "v9", name="Ann")


def test_an_llm_analyst_that_names_no_server_is_refused_in_one_line(tmp_path):
    from trace_gym.errors import TraceGymError
    from trace_gym.identification.llm_analyst import LLMAnalyst
    from trace_gym.synthesis.analyst import SynthesisAnalyst

    for make in (LLMAnalyst, SynthesisAnalyst):
        for spec in ("claude", "openai:"):  # no scheme; a scheme without a model
            with pytest.raises(TraceGymError, match=rf"^unknown analyst '{spec}'; .*openai:<model>$") as refused:
                make(spec, cache_dir=tmp_path)
            assert ("use registry or" in str(refused.value)) == (make is SynthesisAnalyst)  # its offline choice
