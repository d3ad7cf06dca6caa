"""Models and rollouts: OpenAI-compatible and local backends, LLM agents, executors."""

import json

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401
from conftest import run_cli
from openai_double import OpenAIDouble, gold_answer
from trace_gym.actions import parse_action
from trace_gym.agents import LLMAgent, PlantedDeficitAgent
from trace_gym.errors import TraceGymError
from trace_gym.llm import LLMError, make_backend
from trace_gym.rollout import Episode, rollout, run_episode
from trace_gym.store import read_trajectories

TASKS = ["0", "1", "2"]


def oracle_scripts(task_ids):
    env = gym.make("trace/tau2-retail-v0", split="base")
    scripts = {}
    for tid in task_ids:
        obs, _ = env.reset(options={"task_id": tid})
        scripts[obs] = env.unwrapped.oracle_actions()
    env.close()
    return scripts


def test_llm_agent_through_an_openai_compatible_server_completes_tasks():
    with OpenAIDouble(gold_answer(oracle_scripts(TASKS))) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key")
        env = gym.make("trace/tau2-retail-v0", split="base")
        for tid in TASKS:
            traj = run_episode(env, LLMAgent(backend), "trace/tau2-retail-v0", Episode(tid, 0, 0))
            assert traj.reward == 1.0, traj.reward_info
            assert traj.model == "openai:double" and traj.prompt_tokens > 0 and traj.completion_tokens > 0
        env.close()
        request = server.requests[0]
        assert request["tools"] and request["tools"][0]["type"] == "function" and request["temperature"] == 0.0


def test_cli_llm_rollout_with_threads_against_the_server(tmp_path):
    with OpenAIDouble(gold_answer(oracle_scripts(TASKS))) as server:
        out = tmp_path / "llm.jsonl"
        result = run_cli(
            "rollout",
            "--env",
            "trace/tau2-retail-v0",
            "--agent",
            "llm",
            "--model",
            "openai:double",
            "--split",
            "base",
            "--task-ids",
            ",".join(TASKS),
            "--workers",
            "2",
            "--out",
            str(out),
            "--json",
            env={"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key"},
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["episodes"] == 3 and summary["successes"] == 3 and summary["prompt_tokens"] > 0


@pytest.mark.parametrize(
    "setup, fragment",
    [
        (
            {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "test-key"},
            "no answer from http://127.0.0.1:9/v1",
        ),
        ({"OPENAI_API_KEY": "wrong-key"}, "the API key was refused"),
        ({"OPENAI_API_KEY": "test-key", "model": "openai:nope"}, "unknown model 'nope'"),
    ],
)
def test_bad_model_settings_are_one_clear_line(tmp_path, setup, fragment):
    with OpenAIDouble(lambda body: {"content": "hi"}) as server:
        env = {"OPENAI_BASE_URL": server.base_url, **{k: v for k, v in setup.items() if k != "model"}}
        result = run_cli(
            "rollout",
            "--env",
            "trace/tau2-retail-v0",
            "--agent",
            "llm",
            "--model",
            setup.get("model", "openai:double"),
            "--tasks",
            "1",
            "--out",
            str(tmp_path / "t.jsonl"),
            env=env,
        )
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_model_that_never_produces_a_valid_action_gives_up_the_episode(tmp_path):
    with OpenAIDouble(lambda body: {"content": '{"name": "get_order_details", "arguments": '}) as server:
        out = tmp_path / "t.jsonl"
        result = run_cli(
            "rollout",
            "--env",
            "trace/tau2-retail-v0",
            "--agent",
            "llm",
            "--model",
            "openai:double",
            "--tasks",
            "2",
            "--out",
            str(out),
            env={"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test-key"},
        )
    assert result.returncode == 0, result.stderr
    assert (
        "2 episodes were given up by the agent" in result.stderr
        and "did not parse as an action 5 times" in result.stderr
    )
    trajectories = read_trajectories(out)
    assert all(t.error and t.reward == 0.0 and t.termination_reason == "agent_error" for t in trajectories)


def test_transient_errors_are_retried_with_backoff():
    calls = {"n": 0}

    def flaky(body):
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionResetError  # the handler dies: the client sees a dropped connection
        return {"content": "hello"}

    with OpenAIDouble(flaky) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key", backoff_s=0.01)
        [completion] = backend.generate([[{"role": "user", "content": "hi"}]])
    assert completion.text == "hello" and backend.calls == 3


def test_a_remote_model_waits_as_long_as_trace_gym_request_timeout_says(monkeypatch):
    """A slow server times out at TRACE_GYM_REQUEST_TIMEOUT's seconds (an argument wins over it);
    a value that is no positive number is refused in one line."""
    import time

    from trace_gym.llm.vllm_tokens import VLLMTokens

    def slow(body):
        time.sleep(1.5)
        return {"content": "late"}

    monkeypatch.setenv("TRACE_GYM_REQUEST_TIMEOUT", "0.3")
    with OpenAIDouble(slow) as server:
        backend = make_backend("openai:double", base_url=server.base_url, api_key="test-key", max_retries=0)
        with pytest.raises(LLMError):
            backend.generate([[{"role": "user", "content": "hi"}]])
        patient = make_backend("openai:double", base_url=server.base_url, api_key="test-key", timeout=10.0)
        assert patient.generate([[{"role": "user", "content": "hi"}]])[0].text == "late"
    monkeypatch.setenv("TRACE_GYM_REQUEST_TIMEOUT", "600")
    assert VLLMTokens("smollm2-135m-instruct").timeout == 600.0
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv("TRACE_GYM_REQUEST_TIMEOUT", bad)
        with pytest.raises(LLMError, match="TRACE_GYM_REQUEST_TIMEOUT=.*above 0"):
            VLLMTokens("smollm2-135m-instruct")
    monkeypatch.delenv("TRACE_GYM_REQUEST_TIMEOUT")
    assert VLLMTokens("smollm2-135m-instruct").timeout == 120.0


@pytest.mark.slow
def test_ray_and_local_executors_give_the_same_trajectories(tmp_path):
    kwargs = dict(
        split="test", limit=4, samples=2, seed=5, agent_kwargs={"deficits": {"corrupt_ids": 0.5, "end_early": 0.3}}
    )
    local = rollout("trace/tau2-retail-v0", "planted", tmp_path / "local.jsonl", progress=False, **kwargs)
    ray_run = rollout(
        "trace/tau2-retail-v0", "planted", tmp_path / "ray.jsonl", executor="ray", workers=2, progress=False, **kwargs
    )
    assert local.episodes == ray_run.episodes == 8

    def strip(t):
        return (
            t.reward,
            t.agent_info,
            [m.model_dump(exclude={"content"} if m.role == "tool" else set()) for m in t.messages],
        )

    mine = {t.episode_id: strip(t) for t in read_trajectories(tmp_path / "local.jsonl")}
    theirs = {t.episode_id: strip(t) for t in read_trajectories(tmp_path / "ray.jsonl")}
    assert mine == theirs


def test_ray_gives_each_local_model_worker_a_gpu_of_its_own_or_refuses():
    """(Which GPU a worker then sees is Ray's CUDA_VISIBLE_DEVICES: no GPU here to watch it.)"""
    from trace_gym.errors import TraceGymError
    from trace_gym.rollout import ray_placement

    assert ray_placement("llm", {"model": "hf:/models/m"}, gpus_here=2, cluster_gpus=2) == {"num_gpus": 1}
    assert ray_placement("routed", {}, gpus_here=1, cluster_gpus=1) == {"num_gpus": 1}  # the embedded default
    assert ray_placement("llm", {"model": "openai:m"}, gpus_here=2, cluster_gpus=2) == {}  # a server holds it
    assert ray_placement("planted", {}, gpus_here=2, cluster_gpus=2) == {}  # no model to load
    assert ray_placement("llm", {"model": "hf:/models/m"}, gpus_here=0, cluster_gpus=0) == {}  # CPU copies
    with pytest.raises(TraceGymError, match="the Ray cluster offers no GPU"):
        ray_placement("llm", {"model": "hf:/models/m"}, gpus_here=2, cluster_gpus=0)


def test_planted_deficits_are_seeded_recorded_and_hurt():
    env = gym.make("trace/tau2-retail-v0", split="test")
    ids = env.unwrapped.task_ids[:12]
    clean = [run_episode(env, PlantedDeficitAgent(deficits={}), "x", Episode(t, 0, 1)) for t in ids]
    assert all(t.reward == 1.0 and t.agent_info["deficits"] == [] for t in clean)
    broken = [run_episode(env, PlantedDeficitAgent(deficits={"corrupt_ids": 1.0}), "x", Episode(t, 0, 1)) for t in ids]
    hit = [t for t in broken if t.agent_info["deficits"] == ["corrupt_ids"]]
    assert len(hit) >= 8, "most tasks have a write to corrupt"
    # A gold write that tau2 itself refuses (task 12) changes nothing when corrupted: rare, honest noise.
    failed = [t for t in hit if t.reward == 0.0 and "DB" in t.reward_info["failed_components"]]
    assert len(failed) >= len(hit) - 1
    assert all(t.reward == 1.0 for t in broken if not t.agent_info["deficits"])  # nothing to corrupt: nothing recorded
    harmless = [run_episode(env, PlantedDeficitAgent(deficits={"skip_reads": 1.0}), "x", Episode(t, 0, 1)) for t in ids]
    assert all(t.reward == 1.0 for t in harmless)
    again = [
        run_episode(env, PlantedDeficitAgent(seed=3, deficits={"end_early": 0.5}), "x", Episode(t, 0, 1)).agent_info
        for t in ids
    ]
    assert again == [
        run_episode(env, PlantedDeficitAgent(seed=3, deficits={"end_early": 0.5}), "x", Episode(t, 0, 1)).agent_info
        for t in ids
    ]
    env.close()


@pytest.mark.slow
def test_embedded_model_from_a_clean_cache_runs_tau2_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "smol.jsonl"
    summary = rollout(
        "trace/tau2-retail-v0",
        "llm",
        out,
        split="test",
        limit=2,
        batch=2,
        progress=False,
        env_kwargs={"max_steps": 2},
        agent_kwargs={"max_new_tokens": 24},
    )
    assert (tmp_path / "cache" / "models" / "smollm2-135m-instruct" / "model.safetensors").exists()
    assert summary.episodes == 2
    for traj in read_trajectories(out):
        # tau2 counts every message against max_steps: 2 messages leave room for one agent action.
        assert traj.model == "smollm2-135m-instruct" and traj.steps == 1 and traj.completion_tokens > 0
        assert traj.truncated or traj.terminated
        for message in traj.messages:
            if message.role == "assistant" and message.raw is not None:
                kind = parse_action(message.raw).kind
                assert (kind == "tool_calls") == bool(message.tool_calls) and (kind == "malformed") == message.error


def save_visible_lora(folder, base=None) -> str:
    """A real peft LoRA for the model in ``base`` (default: the embedded model), scaled to
    change its outputs; returns the base model's path."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_gym.llm.embedded import ensure_embedded_model

    path = str(base or ensure_embedded_model())
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(path)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.mul_(50.0)  # a visibly different policy
    lora.save_pretrained(folder)
    return path


@pytest.mark.slow
def test_local_model_loads_and_switches_lora_adapters(tmp_path):
    path = save_visible_lora(tmp_path / "adapter")
    backend = make_backend("hf:" + path, adapters={"skill": str(tmp_path / "adapter")})
    prompt = [[{"role": "user", "content": "Name a colour."}]]
    plain = backend.generate(prompt, max_new_tokens=12)[0].text
    adapted = backend.generate(prompt, max_new_tokens=12, adapter="skill")[0].text
    assert plain != adapted
    assert backend.generate(prompt, max_new_tokens=12)[0].text == plain  # switched back to the base
    with pytest.raises(LLMError, match="adapter 'other' is not loaded"):
        backend.generate(prompt, adapter="other")


def test_an_adapter_adds_nothing_only_when_every_update_is_zero(tmp_path):
    import torch
    from safetensors.torch import save_file

    from trace_gym.llm.local.lora import adds_nothing

    layer = "base_model.model.model.layers.0.self_attn.q_proj"
    zero_b = {f"{layer}.lora_A.weight": torch.randn(2, 8), f"{layer}.lora_B.weight": torch.zeros(8, 2)}
    cases = {
        "untrained": (zero_b, True),
        "zero A": ({f"{layer}.lora_A.weight": torch.zeros(2, 8), f"{layer}.lora_B.weight": torch.ones(8, 2)}, True),
        "one entry moved": (
            {**zero_b, f"{layer}.lora_B.weight": torch.zeros(8, 2).index_fill(0, torch.tensor([3]), 1e-9)},
            False,
        ),
        "a second layer trained": (
            {**zero_b, "x.lora_A.weight": torch.ones(2, 8), "x.lora_B.weight": torch.ones(8, 2)},
            False,
        ),
        "DoRA magnitudes": ({**zero_b, f"{layer}.lora_magnitude_vector": torch.ones(8)}, False),
        "a factor missing": ({f"{layer}.lora_B.weight": torch.zeros(8, 2)}, False),
        "no LoRA at all": ({}, False),
    }
    for name, (weights, expected) in cases.items():
        (tmp_path / name).mkdir()
        save_file(weights, str(tmp_path / name / "adapter_model.safetensors"))
        assert adds_nothing(tmp_path / name) is expected, name
    with pytest.raises(LLMError, match="no adapter weights at"):
        adds_nothing(tmp_path / "missing")


def test_unknown_model_spec_and_missing_local_model():
    from trace_gym.llm.registry import check_spec

    with pytest.raises(LLMError, match="unknown model 'gpt5'"):
        make_backend("gpt5")
    for bare in ("openai:", "vllm:", "openai: "):  # a server's prefix that names no model
        for refuse in (make_backend, check_spec):
            with pytest.raises(LLMError, match=f"unknown model '{bare}'"):
                refuse(bare)
    with pytest.raises(LLMError, match="never downloads weights"):
        make_backend("hf:HuggingFaceTB/SmolLM2-135M-Instruct")


def test_a_model_spec_carries_one_chat_template_and_refuses_what_names_none(tmp_path, monkeypatch):
    from trace_gym.llm import LLMError
    from trace_gym.llm.registry import split_spec, with_template

    assert split_spec("hf:/m") == ("hf:/m", "auto")
    assert with_template("hf:/m", "qwen3_training") == "hf:/m?template=qwen3_training"
    assert with_template("hf:/m", "auto") == with_template("hf:/m", None) == "hf:/m"
    assert split_spec(with_template("vllm:/m", "stock")) == ("vllm:/m", "stock")
    (tmp_path / "mine.jinja").write_text("{{ messages }}")
    monkeypatch.chdir(tmp_path)  # a relative file is recorded absolute: a later command elsewhere finds it
    assert with_template("hf:/m", "mine.jinja") == f"hf:/m?template={tmp_path / 'mine.jinja'}"
    for spec, template, words in (
        ("hf:/m?template=", None, "names no template"),
        ("hf:/m?template=stock", "qwen3_training", "already names chat template 'stock'"),
        ("openai:gpt", "stock", "renders conversations with its own chat template"),
        ("hf:/m", "no_such_template", "neither a file, one of ours .* nor one of TRL's"),
        ("hf:/m", "gone.jinja", "no such file"),
    ):
        with pytest.raises(LLMError, match=words):
            with_template(spec, template)


def test_what_a_backend_can_do_besides_generating_is_a_declared_protocol(tmp_path):
    """Loading, summing and saving adapters and serving top logprobs are protocols callers test
    with isinstance: the local model does all, the vLLM client loads adapters, a chat server none;
    an adapter for a model that cannot load one is refused in one line."""
    from trace_gym.errors import TraceGymError
    from trace_gym.llm.base import LoadsAdapters, NextTokenLogprobs, SumsAdapters
    from trace_gym.llm.local import LocalHF
    from trace_gym.llm.openai_compat import OpenAICompatible
    from trace_gym.llm.vllm_tokens import VLLMTokens
    from trace_gym.rollout import _with_local_adapter

    can = {
        cls.__name__: [issubclass(cls, p) for p in (LoadsAdapters, SumsAdapters, NextTokenLogprobs)]
        for cls in (LocalHF, VLLMTokens, OpenAICompatible)
    }
    assert can == {
        "LocalHF": [True, True, True],
        "VLLMTokens": [True, False, False],
        "OpenAICompatible": [False, False, False],
    }
    (tmp_path / "adapter_config.json").write_text("{}")
    chat = OpenAICompatible("m", base_url="http://127.0.0.1:9/v1", api_key="x")
    with pytest.raises(TraceGymError, match="cannot load LoRA adapters"):
        _with_local_adapter("llm", {"adapter": str(tmp_path), "model": chat}, "local")
    with pytest.raises(TraceGymError, match="model object cannot load LoRA adapters"):  # not a backend: one line
        _with_local_adapter("llm", {"adapter": str(tmp_path), "model": object()}, "local")


def test_a_local_model_runs_in_the_dtype_asked_and_refuses_others(monkeypatch):
    backend = make_backend("smollm2-135m-instruct", dtype="bfloat16")
    assert backend.dtype == "bfloat16"
    assert type(backend).from_model(backend.model, backend.tokenizer).dtype == "bfloat16"  # an in-memory model's own
    assert str(next(backend.model.parameters()).dtype) == "torch.bfloat16"
    monkeypatch.setenv("TRACE_GYM_DTYPE", "float32")
    assert str(next(make_backend("smollm2-135m-instruct").model.parameters()).dtype) == "torch.float32"
    with pytest.raises(LLMError, match="dtype must be one of auto, float32, bfloat16, got 'fp8'"):
        make_backend("smollm2-135m-instruct", dtype="fp8")
    with pytest.raises(LLMError, match="an in-memory model runs in its own dtype"):
        type(backend)(model=backend.model, tokenizer=backend.tokenizer, dtype="float32")
    monkeypatch.setenv("TRACE_GYM_DTYPE", "half")
    with pytest.raises(LLMError, match="TRACE_GYM_DTYPE must be one of auto, float32, bfloat16, got 'half'"):
        make_backend("smollm2-135m-instruct")


def test_auto_runs_bf16_only_where_the_cpu_multiplies_it_natively(monkeypatch):
    from trace_gym.llm import precision

    monkeypatch.setattr(precision, "native_bf16", lambda flags=None: False)
    assert precision.engine_dtype("auto", "cpu") == "float32"
    assert precision.engine_dtype("auto", "cuda:0") == "bfloat16"
    assert precision.resolve_dtype("auto", "mps", {"avx512_bf16"}) == "float32"  # not the host CPU's flags
    monkeypatch.setattr(precision, "native_bf16", lambda flags=None: True)
    assert precision.engine_dtype(None, "cpu") == "float32"  # the suite pins TRACE_GYM_DTYPE (conftest)
    monkeypatch.delenv("TRACE_GYM_DTYPE")
    assert precision.engine_dtype(None, "cpu") == "bfloat16"


def test_a_trajectory_file_records_a_local_models_dtype_where_earlier_versions_did_not_run_it(monkeypatch):
    """A resumed run must not mix float32 and bf16 episodes; files from before the choice
    (float32 on a CPU) record nothing and still resume."""
    from types import SimpleNamespace

    from trace_gym.rollout import run_settings

    def recorded(agent="llm", **kwargs):
        return run_settings("trace/tau2-mock-v0", agent, kwargs, {})["agent_options"].get("dtype")

    monkeypatch.setattr("trace_gym.rollout.local_device", lambda: "cpu")
    assert recorded(model="smollm2-135m-instruct") is None  # float32 (conftest)
    monkeypatch.setenv("TRACE_GYM_DTYPE", "bfloat16")
    assert recorded(model="smollm2-135m-instruct") == recorded() == "bfloat16"
    assert recorded(model="openai:m") is None and recorded("oracle") is None  # no local model
    assert recorded(model=SimpleNamespace(name="m", dtype="bfloat16", device="cuda")) is None  # CUDA ran bf16
    assert recorded(model=SimpleNamespace(name="m", dtype="bfloat16", device="cpu")) == "bfloat16"
    assert recorded(model=SimpleNamespace(name="m", dtype="bfloat16", device="cuda:1")) == "bfloat16"  # was float32
    monkeypatch.setenv("TRACE_GYM_DTYPE", "fp4")
    with pytest.raises(TraceGymError, match="TRACE_GYM_DTYPE must be one of auto, float32, bfloat16, got 'fp4'"):
        recorded()


def test_a_trajectory_file_records_strict_tool_calls_only_where_they_were_on(monkeypatch):
    """Episodes decoded with calls held to their schemas are another run than free ones."""
    from types import SimpleNamespace

    from trace_gym.rollout import run_settings

    def strict(agent="llm", **kwargs):
        return run_settings("trace/tau2-mock-v0", agent, kwargs, {})["agent_options"].get("strict_tools")

    monkeypatch.setattr("trace_gym.rollout.local_device", lambda: "cpu")
    monkeypatch.delenv("TRACE_GYM_STRICT_TOOLS", raising=False)
    assert strict() is None  # off: files from before the option resume as they were
    monkeypatch.setenv("TRACE_GYM_STRICT_TOOLS", "1")
    assert strict() is True and strict(model="smollm2-135m-instruct") is True
    assert strict(model="openai:m") is None and strict("oracle") is None  # no local decoding to hold
    assert strict(model=SimpleNamespace(name="m", strict_tools=False)) is None  # an object says for itself
    assert strict(model=SimpleNamespace(name="m", strict_tools=True)) is True
    monkeypatch.setenv("TRACE_GYM_STRICT_TOOLS", "ids")
    assert strict() == "ids"  # (grounded ids decode otherwise again: a resume must not mix them)
