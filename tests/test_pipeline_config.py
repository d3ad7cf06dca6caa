"""`trace-gym run CONFIG`: a bad config is one line naming the field, before any work starts."""

import pytest

from conftest import run_cli
from trace_gym.config import ConfigError
from trace_gym.pipeline import grpo_config, load_config

GOOD = """
[run]
target = "trace/tau2-retail-v0"
dir = "{dir}"
stages = ["rollout", "identify"]

[rollout]
tasks = 4

[identify.selection]
delta = 0.25
"""


def write(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text.replace("{dir}", str(tmp_path / "run")))
    return path


def test_a_good_config_maps_onto_the_stage_dataclasses(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert config.rollout.tasks == 4 and config.identify.selection.delta == 0.25
    assert config.identify.selection.rho == 0.10  # the paper's defaults
    grpo = grpo_config(config, ["trace/tool-precision-v0"], str(tmp_path / "a"))
    assert (grpo.lora_rank, grpo.groups, grpo.rollouts_per_group, grpo.iterations, grpo.learning_rate) == (
        32,
        4,
        4,
        40,
        1e-5,
    )
    result = run_cli("run", str(write(tmp_path, GOOD)), "--check")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


BAD = [
    (
        'stages = ["rollout", "identify"]',
        'stages = ["rollout", "fine-tune"]',
        "[run] stages: unknown stage 'fine-tune'",
    ),
    (
        'target = "trace/tau2-retail-v0"',
        'target = "trace/no-such-env-v0"',
        "[run] target: unknown env id 'trace/no-such-env-v0'",
    ),
    (
        'target = "trace/tau2-retail-v0"',
        'target = "trace/structured-data-v0"',
        "[run] target: trace/structured-data-v0 is a training env",
    ),
    ("[rollout]\ntasks = 4", '[rollout]\ntasks = "four"', "[rollout] tasks: must be a whole number"),
    ("[rollout]\ntasks = 4", "[rollout]\ntask = 4", "[rollout] task: unknown setting"),
    ("delta = 0.25", "delta = 0.25\nspeed = 1", "[identify.selection] speed: unknown setting"),
    (
        "[rollout]",
        '[identify]\nanalyst = "openai:gpt-x"\n[rollout]',
        "[identify] analyst: openai:gpt-x needs an analyst endpoint",
    ),
    ("[rollout]", '[synthesize]\nanalyst = "claude"\n[rollout]', "[synthesize] analyst: unknown analyst 'claude'"),
    (
        "[rollout]",
        '[identify]\nanalyst = "openai:"\n[rollout]',
        "[identify] analyst: unknown analyst 'openai:'; use gold, milestone, reference or openai:<model>",
    ),
    (
        "[rollout]",
        '[policy]\nmodel = "hf:/no/such/model"\n[rollout]',
        "[policy] model: no local model folder at /no/such/model",
    ),
    (
        "[rollout]",
        '[policy]\nchat_template = "nosuch"\n[rollout]',
        "[policy] chat_template: chat template 'nosuch': neither",
    ),
    (
        "[rollout]",
        '[policy]\nmodel = "openai:m"\nchat_template = "stock"\n[rollout]',
        "[policy] chat_template: openai:m: an OpenAI-compatible server renders conversations with its own",
    ),
    (
        "[rollout]",
        '[evaluate]\nmodel = "vllm:/no/such"\n[rollout]',
        "[evaluate] model: vllm:/no/such: no tokenizer at /no/such",
    ),
    ("[rollout]", '[evaluate]\nmethods = ["base", "magic"]\n[rollout]', "[evaluate] methods: unknown method 'magic'"),
    ("[rollout]", "[training]\niterations = 2\n[rollout]", "[training]: unknown section"),
    ('stages = ["rollout", "identify"]', 'stages = ["identify", "rollout"]', "[run] stages: must keep pipeline order"),
    ("[rollout]", "[train.grpo]\nlearning_rat = 1e-5\n[rollout]", "[train.grpo] learning_rat: unknown setting"),
    ("[rollout]", '[train.grpo]\nenv_ids = ["x"]\n[rollout]', "[train.grpo] env_ids: set by the pipeline"),
    (
        "[rollout]",
        "[train.grpo]\nrollouts_per_group = 1\n[rollout]",
        "[train.grpo] rollouts_per_group (K) must be at least 2",
    ),
    ("[rollout]", '[train]\ncontrol = ["telepathy"]\n[rollout]', "[train] control: no registry env serves 'telepathy'"),
    ("[rollout]\ntasks = 4", '[rollout]\nagent = "genius"', "[rollout] agent: unknown agent 'genius'"),
    (
        "[rollout]\ntasks = 4",
        "[rollout]\ndeficits = { corrupt_ids = 0.3 }",
        "[rollout] deficits: only apply with agent",
    ),
    ("[rollout]\ntasks = 4", '[rollout]\nfallback = "genius"', "[rollout] fallback: unknown agent 'genius'"),
    (
        "[rollout]\ntasks = 4",
        '[rollout]\nagent = "oracle"\nfallback = "planted"',
        "[rollout] fallback: only applies when",
    ),
    ("[rollout]\ntasks = 4", "[rollout]\nmin_contrast = -1", "[rollout] min_contrast: must be at least 0"),
    ("[rollout]", "[train.grpo]\nreward_band = [0.7, 0.2]\n[rollout]", "reward_band must be [low, high]"),
    ("delta = 0.25", "delta = 0.25\nruns = 5\nmin_runs = 8", "[identify.selection]: selection needs 1 <= K <= N runs"),
    (
        "[rollout]\ntasks = 4",
        '[rollout]\ntrajectories = "/no/such/logs.jsonl"',
        "[rollout] trajectories: no file at /no/such/logs.jsonl",
    ),
    (
        'stages = ["rollout", "identify"]',
        'stages = ["rollout", "identify", "gepa"]',
        "[gepa] budget: required when the train stage",
    ),
    (
        'stages = ["rollout", "identify"]',
        'stages = ["gepa"]\n[gepa]\nbudget = 20\nreflection = "openai:gpt-x"',
        "[gepa] reflection: openai:gpt-x needs an endpoint",
    ),
    (
        "[rollout]",
        '[policy]\nbase_url = "http://127.0.0.1:8000/v1"\n[rollout]',
        "[policy] base_url: only an openai: or vllm: model has a server, not 'smollm2-135m-instruct'",
    ),
    (
        "[rollout]",
        '[policy]\nmodel = "openai:m"\nbase_url = "127.0.0.1:8000/v1"\n[rollout]',
        "[policy] base_url: an http:// or https:// address",
    ),
    (
        "[rollout]",
        '[identify]\nanalyst = "openai:gpt-x"\nbase_url = "http://127.0.0.1:9/v1"\napi_key_env = "NO_SUCH_KEY_VAR"\n[rollout]',
        "[identify] api_key_env: the variable NO_SUCH_KEY_VAR is not set",
    ),
    (
        "[rollout]",
        '[identify]\nanalyst = "gold"\nbase_url = "http://127.0.0.1:9/v1"\n[rollout]',
        "[identify] base_url: only an openai: or vllm: model has a server, not 'gold'",
    ),
    (
        "[rollout]",
        '[evaluate]\nbase_url = "http://127.0.0.1:9/v1"\n[rollout]',
        "[evaluate] base_url: for [evaluate] model, which is not set",
    ),
    (
        'stages = ["rollout", "identify"]',
        'stages = ["gepa"]\n[gepa]\nbudget = 5\nval_tasks = 4',
        "[gepa] a budget of 5 episodes cannot pay for the seed prompt's validation",
    ),
]


@pytest.mark.parametrize("old, new, message", BAD, ids=[b[2].split(":")[0] for b in BAD])
def test_a_bad_config_is_one_line_naming_the_field_and_nothing_runs(tmp_path, monkeypatch, old, new, message):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(ConfigError, match=None) as info:
        load_config(path)
    assert message in str(info.value)
    result = run_cli("run", str(path), env={"OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""})
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing started


def test_missing_and_malformed_config_files_are_one_line(tmp_path):
    result = run_cli("run", str(tmp_path / "nope.toml"))
    assert result.returncode == 2 and "no config file" in result.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    result = run_cli("run", str(bad))
    assert result.returncode == 2 and "not valid TOML" in result.stderr
    no_run = tmp_path / "norun.toml"
    no_run.write_text('[policy]\nmodel = "smollm2-135m-instruct"\n')
    result = run_cli("run", str(no_run))
    assert result.returncode == 2 and "[run] target: required" in result.stderr


def test_the_example_configs_are_valid(tmp_path, monkeypatch):
    from pathlib import Path

    examples = Path(__file__).parent.parent / "examples"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert load_config(examples / "quickstart.toml").run.stages == [
        "rollout",
        "identify",
        "synthesize",
        "train",
        "evaluate",
    ]
    model = tmp_path / "model"
    model.mkdir()
    gpu = tmp_path / "gpu.toml"
    gpu.write_text((examples / "gpu.toml").read_text().replace("/models/Llama-3.1-8B-Instruct", str(model)))
    with pytest.raises(ConfigError, match="api_key_env: the variable ANALYST_KEY is not set"):
        load_config(gpu)
    monkeypatch.setenv("ANALYST_KEY", "sk-test")
    config = load_config(gpu)
    assert config.identify.endpoint() == {"base_url": "https://api.openai.com/v1", "api_key": "sk-test"}
    assert "gepa" in config.run.stages and config.gepa.reflection == "openai:gpt-4.1" and config.gepa.budget is None


def test_k_of_n_follows_n_in_a_config(tmp_path):
    """runs = 5 alone means K = 4 (the paper's 8 of 10), in the config as in the CLI."""
    config = load_config(write(tmp_path, GOOD.replace("delta = 0.25", "delta = 0.25\nruns = 5")))
    assert (config.identify.selection.runs, config.identify.selection.min_runs) == (5, 4)
    assert load_config(write(tmp_path, GOOD)).identify.selection.min_runs == 8


def test_merged_is_a_baseline_only_over_two_or_more_capability_envs(tmp_path):
    from trace_gym.pipeline import training_plan

    config = load_config(write(tmp_path, GOOD))
    config.train.grpo_target = True
    one = training_plan(config, {"precise_arguments": "trace/tool-precision-v0"})
    assert [job["name"] for job in one] == ["precise_arguments", "grpo-target"]
    two = training_plan(
        config, {"precise_arguments": "trace/tool-precision-v0", "complete_actions": "trace/complete-actions-v0"}
    )
    merged = next(job for job in two if job["name"] == "merged")
    assert merged["envs"] == ["trace/complete-actions-v0", "trace/tool-precision-v0"] and merged["scale"] == 2
    shared = training_plan(  # two capabilities one env serves: a merged run would be that env alone
        config,
        {"valid_tool_arguments": "trace/well-formed-calls-v0", "precise_arguments": "trace/well-formed-calls-v0"},
    )
    assert [job["name"] for job in shared] == ["precise_arguments", "valid_tool_arguments", "grpo-target"]


def test_a_control_the_cap_left_out_is_refused(tmp_path):
    """A capability over the cap passed the contrast: its adapter would be no untargeted control."""
    from dataclasses import replace

    from conftest import capability
    from trace_gym.artifacts import Identification
    from trace_gym.pipeline.stages import check_controls
    from trace_gym.pipeline.state import PipelineError

    config = load_config(write(tmp_path, GOOD.replace("delta = 0.25", "delta = 0.25\nmax_selected = 1")))
    identified = Identification(
        [
            capability("precise_arguments", "exact ids"),
            replace(capability("complete_actions", "every change", selected=False), over_cap=True),
            capability("read_before_write", "reads first", selected=False),
        ]
    )
    config.train.control = ["read_before_write"]
    check_controls(config, identified)  # not selected by the contrast: a control
    config.train.control = ["read_before_write", "complete_actions"]
    with pytest.raises(PipelineError, match="complete_actions passed the contrast and only the cap .*max_selected = 1"):
        check_controls(config, identified)


def test_each_role_names_its_own_server_and_the_key_stays_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("ANALYST_KEY", "sk-analyst")
    text = GOOD.replace(
        "[rollout]",
        '[policy]\nmodel = "openai:policy"\nbase_url = "http://127.0.0.1:8001/v1"\n'
        '[identify]\nanalyst = "openai:gpt-x"\nbase_url = "http://127.0.0.1:8002/v1"\napi_key_env = "ANALYST_KEY"\n'
        "[rollout]",
    )
    config = load_config(write(tmp_path, text))  # no OPENAI_BASE_URL: each role's own address suffices
    assert config.policy.endpoint() == {"base_url": "http://127.0.0.1:8001/v1"}
    assert config.identify.endpoint() == {"base_url": "http://127.0.0.1:8002/v1", "api_key": "sk-analyst"}
    assert config.eval_endpoint == config.policy.endpoint()
    assert config.synthesize.endpoint() == {}


def test_moving_a_role_to_another_server_keeps_every_stage(tmp_path, monkeypatch):
    from trace_gym.pipeline import RunState, stage_inputs_hash

    monkeypatch.setenv("OTHER_KEY", "sk-other")
    text = GOOD.replace(
        "[rollout]", '[policy]\nmodel = "openai:policy"\nbase_url = "http://127.0.0.1:8001/v1"\n[rollout]'
    )
    here = load_config(write(tmp_path, text))
    moved = load_config(write(tmp_path, text.replace("8001/v1", '8002/v1"\napi_key_env = "OTHER_KEY')))
    other_model = load_config(write(tmp_path, text.replace("openai:policy", "openai:another")))
    assert moved.policy.endpoint() == {"base_url": "http://127.0.0.1:8002/v1", "api_key": "sk-other"}
    state = RunState(tmp_path / "state")
    for stage in ("rollout", "identify"):
        assert stage_inputs_hash(here, stage, state) == stage_inputs_hash(moved, stage, state)
        assert stage_inputs_hash(here, stage, state) != stage_inputs_hash(other_model, stage, state)
