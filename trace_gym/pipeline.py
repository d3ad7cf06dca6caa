"""The whole TRACE loop as one command: ``trace-gym run CONFIG [--resume] [--from STAGE]``.

A TOML config names the target, the policy, the analyst and each stage's
settings (defaults = the paper's); every stage writes into one run directory::

    RUN/rollouts/   the base policy on the target's train split (trajectories.jsonl)
    RUN/identify/   capabilities.json, labels.jsonl, report.md (identification)
    RUN/envs/       one training env per selected capability (envs.json)
    RUN/adapters/   one LoRA adapter per capability, and the baselines' (adapters.json)
    RUN/gepa/       the GEPA baseline's search, when the config asks for it (best_prompt.txt, search.jsonl)
    RUN/eval/       every method on the held-out split (results.json/.md, plots)
    RUN/report.md   the whole run, every figure read from the files above

``state.json`` records, per stage, a hash of its inputs (its settings and the
upstream outputs it read). With ``--resume`` a finished stage whose inputs have
not changed is not redone, and an unfinished one continues from its own
checkpoints (rollouts and training resume); ``--from STAGE`` redoes that stage
and everything after it. A bad config is one line naming the field, before any
work starts.

This module only sequences stages and records what they did; each stage is a
library call (``rollout``, ``identify``, ``synthesize``, ``train``, ``gepa``, ``evaluate``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import shutil
import time
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal

from trace_gym.agents import AGENTS
from .artifacts import AdapterRecord, AdapterSet, EnvRecord, EnvSet, Identification, UntrainableRecord
from .config import ConfigError, from_table, read_toml, to_table
from .env import TextEnv
from .errors import TraceGymError
from .evaluation import (
    EvalContext,
    Unavailable,
    baseline_scale,
    build_methods,
    get_method,
    lacking_rates,
    method_result,
    policy_backend,
    specificity,
    task_flips,
    trace_budget,
    write_results,
)
from .gepa_baseline import DEFAULT_SEED_PROMPT, GEPAConfig, run_gepa
from .identification import identify, label_all, make_analyst
from .identification.llm_analyst import unknown_analyst
from .identification.stats import DegenerateInputError, LACKING, SelectionConfig
from .llm import LLMError, make_backend
from .llm.base import SumsAdapters
from .llm.registry import check_spec, is_chat_endpoint, is_server, is_token_endpoint, split_spec, with_template
from .pipeline_report import write_report
from .registry import EnvKind, add_registry_dir, get_entry, make, read_manifest, register_all
from .rollout import rollout
from .seeding import derive_seed
from .store import OtherRunError, read_run_settings, read_trajectories, write_trajectories
from .synthesis import serving_envs, synthesize
from .synthesis.loop import SynthesisConfig
from .training.config import GRPOTrainingConfig, TrainingError
from .training.jobs import Job, train_jobs, visible_gpus
from .training.log import TrainLog
from .training.ranks import world_size

STAGES = ("rollout", "identify", "synthesize", "train", "gepa", "evaluate")
METHODS = ("base", "trace", "grpo-target", "merged", "summed", "control", "gepa")
"""The default rows of ``[evaluate] methods`` (``trace_gym.evaluation.METHODS`` holds every registered one)."""
DEFAULT_STAGES = ("rollout", "identify", "synthesize", "train", "evaluate")
"""The GEPA baseline is opt-in: add "gepa" to ``[run] stages`` (it plays as many episodes as TRACE trained on)."""


@dataclass
class RunSettings:
    """``[run]``: what the run is about and where it goes."""

    target: str
    """The target env id, e.g. ``trace/tau2-retail-v0``."""
    dir: str = "runs/trace"
    """The run directory (relative paths are taken from the working directory)."""
    stages: list[str] = field(default_factory=lambda: list(DEFAULT_STAGES))
    """The stages to run, in pipeline order (a subset of rollout, identify, synthesize, train, gepa, evaluate;
    gepa, the prompt-optimization baseline, only when named)."""
    seed: int = 0
    """The run seed; every episode's and every stage's seed derives from it."""


@dataclass
class Endpoint:
    """Where a section's ``openai:`` or ``vllm:`` model is served: each role (policy,
    analysts, evaluation) may have its own server and key."""

    base_url: str | None = None
    """Its server, e.g. ``http://127.0.0.1:8000/v1`` (None: ``OPENAI_BASE_URL``)."""
    api_key_env: str | None = None
    """The environment variable holding its key (None: ``OPENAI_API_KEY``): a key never goes in a config file."""

    def endpoint(self) -> dict[str, str]:
        """The ``base_url``/``api_key`` options of its backend (none: the environment's)."""
        options = {"base_url": self.base_url} if self.base_url else {}
        if self.api_key_env:
            options["api_key"] = os.environ.get(self.api_key_env, "")
        return options


@dataclass
class PolicySettings(Endpoint):
    """``[policy]``: the model being improved (and the router, which is the same base model)."""

    model: str = "smollm2-135m-instruct"
    """``smollm2-135m-instruct`` (embedded, offline), ``hf:<path>`` or ``openai:<model>`` (vLLM multi-LoRA)."""
    temperature: float = 0.0
    """Sampling temperature of rollouts and evaluation (0: greedy)."""
    max_new_tokens: int = 256
    """Longest reply per turn."""
    batch: int = 8
    """Local models: episodes generated together in lock-step, one batched generation per turn."""
    workers: int = 1
    """API models: episodes played in parallel threads."""
    chat_template: str = "auto"
    """Local and ``vllm:`` models: the chat template the policy plays, trains and is served
    under. ``auto`` keeps the model's own where it appends turn for turn, else takes TRL's
    training template for its family; ``stock``, a template's name (``chatml_compact_tools``, ``qwen3_training``)
    or a ``.jinja`` path choose one. An ``openai:`` server renders with its own."""

    @property
    def spec(self) -> str:
        """The model spec every stage loads: ``model`` with its ``chat_template``."""
        return with_template(self.model, self.chat_template)


@dataclass
class RolloutStage:
    """``[rollout]``: the base policy on the target, the data identification contrasts."""

    agent: str = "policy"
    """Who plays: ``policy`` (the ``[policy]`` model: TRACE proper) or another agent by name,
    e.g. ``planted`` (the oracle with seeded ``deficits``: a known contrast, for demonstrations
    and checks of the pipeline). The report says which."""
    deficits: dict[str, float] = field(default_factory=dict)
    """With ``agent = "planted"``: each deficit's probability, e.g. ``{corrupt_ids = 0.4}``."""
    split: str = "train"
    """The target's split to roll out on (never the held-out split evaluation uses)."""
    tasks: int | None = None
    """Only the first N tasks of the split (None: all)."""
    samples: int = 1
    """Episodes per task."""
    max_steps: int | None = None
    """Messages per episode before truncation (None: the target's default)."""
    executor: Literal["local", "ray"] = "local"
    """``ray`` fans episodes out over a Ray cluster."""
    trajectories: str | None = None
    """An existing trajectory file (JSONL, e.g. your agent's logs) to identify from instead of
    rolling the policy out; its episodes must be of ``[run] target``."""
    min_contrast: int = 3
    """Successes and failures (each) the policy's own rollouts need for identification to contrast
    them; with fewer, ``fallback`` (if set) stands in for the side that is short."""
    fallback: str | None = None
    """An agent whose episodes stand in where the policy's own hold fewer than ``min_contrast``
    successes or failures: it plays the whole split (``tasks`` limits the policy only), and its
    episodes of the side the policy is short of join every episode of the policy's. ``oracle``:
    the target's own solutions stand in for the successes a weak policy lacks, so identification
    still explains the policy's own failures; ``planted`` (with ``deficits``): the oracle with
    seeded deficits. The report says which episodes are whose. None: contrast what the policy did."""


@dataclass
class IdentifyStage(Endpoint):
    """``[identify]`` (and ``[identify.selection]``): contrastive capability identification."""

    analyst: str = "gold"
    """``gold`` (τ² gold actions, no LLM), ``milestone`` (ToolSandbox), or ``openai:<model>``."""
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    """Selection thresholds (δ, ρ, K of N runs); the paper's defaults."""


@dataclass
class SynthesizeStage(Endpoint):
    """``[synthesize]`` (and ``[synthesize.loop]``): one training env per selected capability."""

    analyst: str = "registry"
    """``registry`` (offline: a registry env whose manifest names the capability) or ``openai:<model>``."""
    loop: SynthesisConfig = field(default_factory=SynthesisConfig)
    """Attempts, calibration rounds and policy, validation thresholds of the synthesis loop."""
    only: list[str] = field(default_factory=list)
    """Only these of the selected capabilities (empty: all of them)."""


@dataclass
class TrainStage:
    """``[train]`` (and ``[train.grpo]``): GRPO, one LoRA adapter per capability env, and the
    baselines at the same total rollout budget."""

    grpo: dict[str, Any] = field(default_factory=dict)
    """Settings of every training run: any field of ``GRPOTrainingConfig`` but ``env_ids``,
    ``out`` and ``model`` (the pipeline sets those); the paper's defaults otherwise."""
    grpo_target: bool = True
    """Also train GRPO on the target itself, with as many rollouts as all capability adapters together."""
    merged: bool = True
    """Also train one adapter on the mixture of the capability envs, at that same total."""
    control: list[str] = field(default_factory=list)
    """Capabilities the contrast did NOT select, trained and routed the same way (the causal
    control), each served by a registry env for the target."""


@dataclass
class GEPAStage(Endpoint):
    """``[gepa]``: the GEPA baseline (reflective prompt evolution of the policy's instructions)."""

    reflection: str = "smollm2-135m-instruct"
    """The reflection model: ``openai:<model>``, ``hf:<path>``, or the embedded model (offline; far too small
    to be a fair baseline, and the run says so)."""
    budget: int | None = None
    """Episodes the search may play (None: as many as the TRACE adapters were trained on, from the train stage)."""
    split: str = "train"
    tasks: int | None = None
    """Only the first N tasks of ``split`` (the last ``val_tasks`` of them validate)."""
    val_tasks: int = 4
    minibatch: int = 3
    seed_prompt: str | None = None
    """The instructions the search starts from (None: trace-gym's default seed)."""
    reflection_max_tokens: int = 1024
    """Longest reflection answer (a small local reflector is much faster with 256)."""


@dataclass
class EvaluateStage(Endpoint):
    """``[evaluate]``: every method on the target's held-out split."""

    split: str = "test"
    tasks: int | None = None
    """Only the first N tasks of the split (None: all)."""
    samples: int = 1
    """Episodes per task (pass^k for k up to this)."""
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """Rows of the table: base, trace (routed), grpo-target, merged, summed (adapters' weights added), control,
    gepa (the best prompt of the gepa stage); a row whose stage did not run is left out, with a note."""
    max_steps: int | None = None
    """Messages per episode before truncation (None: the target's default)."""
    calibrate_router: bool = False
    """Route by label scores minus those of a content-free task (off: the paper's plain argmax).
    Small routers such as the embedded 135M model prefer the first label whatever the task."""
    model: str | None = None
    """The trained policy served elsewhere, for this stage only: the same base weights behind
    a ``vllm:<model>`` server (the adapters are loaded into it by name) or an ``openai:`` one
    that already serves them, at this section's ``base_url``. Changing it re-plays evaluation
    and nothing before it (None: ``[policy]``'s model, in process)."""


@dataclass
class PipelineConfig:
    run: RunSettings
    policy: PolicySettings = field(default_factory=PolicySettings)
    rollout: RolloutStage = field(default_factory=RolloutStage)
    identify: IdentifyStage = field(default_factory=IdentifyStage)
    synthesize: SynthesizeStage = field(default_factory=SynthesizeStage)
    train: TrainStage = field(default_factory=TrainStage)
    gepa: GEPAStage = field(default_factory=GEPAStage)
    evaluate: EvaluateStage = field(default_factory=EvaluateStage)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir)

    @property
    def eval_model(self) -> str:
        """The model spec evaluation and routing load: ``[evaluate] model`` (a ``vllm:`` one
        rendering under the policy's chat template unless it names its own), else the policy's."""
        if self.evaluate.model is None:
            return self.policy.spec
        model, choice = split_spec(self.evaluate.model)
        if choice == "auto" and is_token_endpoint(model):
            return with_template(model, self.policy.chat_template)
        return self.evaluate.model

    @property
    def eval_endpoint(self) -> dict[str, str]:
        """The server options of ``eval_model``: ``[evaluate]``'s where it names a model, else the policy's."""
        return (self.evaluate if self.evaluate.model is not None else self.policy).endpoint()


def load_config(path: str | Path) -> PipelineConfig:
    """Read and check a pipeline config; every mistake is one line naming the field."""
    return config_from_data(read_toml(path))


def config_from_data(data: dict[str, Any]) -> PipelineConfig:
    """A checked config from its tables (a TOML file's, or a run's ``config.json``)."""
    sections = {f.name: f for f in dataclasses.fields(PipelineConfig)}
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"[{unknown[0]}]: unknown section; known: {', '.join(sections)}")
    if "run" not in data:
        raise ConfigError("[run] target: required (the target env id, e.g. trace/tau2-retail-v0)")

    hints = typing.get_type_hints(PipelineConfig)
    config = PipelineConfig(
        **{name: from_table(hints[name], data.get(name), name) for name in sections if name in data or name == "run"}
    )
    check_config(config)
    return config


def check_config(config: PipelineConfig) -> None:
    """What can be checked before any work: stage and method names, the target, the models and analysts."""
    bad = [s for s in config.run.stages if s not in STAGES]
    if bad:
        raise ConfigError(f"[run] stages: unknown stage '{bad[0]}'; stages are {', '.join(STAGES)}")
    if [s for s in STAGES if s in config.run.stages] != list(config.run.stages):
        raise ConfigError(f"[run] stages: must keep pipeline order ({', '.join(STAGES)})")
    try:
        entry = get_entry(config.run.target)
    except TraceGymError as exc:
        raise ConfigError(f"[run] target: {exc}") from None
    if entry.kind != EnvKind.TARGET:
        raise ConfigError(f"[run] target: {entry.id} is a training env, not a target benchmark")
    from .evaluation import METHODS as REGISTERED  # the built-in rows and any a user registered

    bad = [m for m in config.evaluate.methods if m not in REGISTERED]
    if bad:
        raise ConfigError(f"[evaluate] methods: unknown method '{bad[0]}'; methods are {', '.join(REGISTERED)}")
    _check_template(config.policy)
    for section in ("policy", "identify", "synthesize", "evaluate", "gepa"):
        _check_endpoint(getattr(config, section), section)
    _check_model(config.policy.model, "[policy] model", endpoint=not config.policy.base_url)
    if config.evaluate.model is not None:
        _check_model(config.evaluate.model, "[evaluate] model", endpoint=False)
    grpo_config(config, ["<env>"], "<out>")  # every [train.grpo] mistake, now
    for capability in config.train.control:
        if not serving_envs(capability, entry.id):
            raise ConfigError(f"[train] control: no registry env serves '{capability}' for {entry.id}")
    _check_analyst(config.identify, "[identify] analyst", ("gold", "milestone", "reference"))
    _check_analyst_fits(config.identify.analyst, entry)
    _check_analyst(config.synthesize, "[synthesize] analyst", ("registry",))
    if "gepa" in config.run.stages:
        _check_model(config.gepa.reflection, "[gepa] reflection", endpoint=not config.gepa.base_url)
        try:
            gepa_config(config, budget=config.gepa.budget or 10**6).check()
        except TraceGymError as exc:
            raise ConfigError(f"[gepa] {exc}") from None
        if config.gepa.budget is None and "train" not in config.run.stages:
            raise ConfigError("[gepa] budget: required when the train stage does not run (it sets the equal budget)")
    if config.rollout.agent != "policy":
        if config.rollout.agent not in AGENTS:
            raise ConfigError(
                f"[rollout] agent: unknown agent '{config.rollout.agent}'; use policy or one of "
                f"{', '.join(sorted(AGENTS))}"
            )
    if config.rollout.fallback is not None:
        if config.rollout.fallback not in AGENTS:
            raise ConfigError(
                f"[rollout] fallback: unknown agent '{config.rollout.fallback}'; use one of {', '.join(sorted(AGENTS))}"
            )
        if config.rollout.agent != "policy":
            raise ConfigError('[rollout] fallback: only applies when the policy plays (agent = "policy")')
    if config.rollout.min_contrast < 0:
        raise ConfigError(f"[rollout] min_contrast: must be at least 0, got {config.rollout.min_contrast}")
    if config.rollout.deficits and "planted" not in (config.rollout.agent, config.rollout.fallback):
        raise ConfigError('[rollout] deficits: only apply with agent = "planted" (or fallback = "planted")')
    if config.rollout.trajectories and not Path(config.rollout.trajectories).is_file():
        raise ConfigError(f"[rollout] trajectories: no file at {config.rollout.trajectories}")
    for name, value in (
        ("[rollout] samples", config.rollout.samples),
        ("[evaluate] samples", config.evaluate.samples),
        ("[policy] batch", config.policy.batch),
        ("[policy] workers", config.policy.workers),
    ):
        if value < 1:
            raise ConfigError(f"{name}: must be at least 1, got {value}")


def grpo_config(config: PipelineConfig, env_ids: list[str], out: str, *, iterations_scale: int = 1) -> Any:
    """The ``GRPOTrainingConfig`` of one training run of this pipeline."""
    fixed = sorted({"env_ids", "out", "model"} & set(config.train.grpo))
    if fixed:
        raise ConfigError(
            f"[train.grpo] {fixed[0]}: set by the pipeline (the capability envs, adapters/, [policy] model)"
        )
    table = {**config.train.grpo, "env_ids": env_ids, "out": out, "model": config.policy.spec}
    run = from_table(GRPOTrainingConfig, table, "train.grpo")
    run.iterations *= iterations_scale
    try:
        return run.check()
    except TrainingError as exc:
        raise ConfigError(f"[train.grpo] {exc}") from None


def gepa_config(config: PipelineConfig, budget: int) -> Any:
    """The ``GEPAConfig`` of this pipeline's GEPA stage."""
    g, p = config.gepa, config.policy
    return GEPAConfig(
        env=config.run.target,
        budget=budget,
        out=str(config.run_dir / "gepa"),
        model=p.spec,
        reflection=g.reflection,
        split=g.split,
        tasks=g.tasks,
        val_tasks=g.val_tasks,
        minibatch=g.minibatch,
        seed_prompt=g.seed_prompt or DEFAULT_SEED_PROMPT,
        reflection_max_tokens=g.reflection_max_tokens,
        temperature=p.temperature,
        max_new_tokens=p.max_new_tokens,
        max_steps=config.evaluate.max_steps,
        batch=p.batch,
        workers=p.workers,
        seed=config.run.seed,
        servers={"policy": p.endpoint(), "reflection": g.endpoint()},
    )


def _check_model(spec: str, where: str, endpoint: bool = True) -> None:
    try:
        check_spec(spec, endpoint=endpoint)
    except LLMError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_template(policy: PolicySettings) -> None:
    try:
        _ = policy.spec  # with_template refuses what names no template, or one for a server that renders its own
    except LLMError as exc:
        raise ConfigError(f"[policy] chat_template: {exc}") from None


def _check_endpoint(section: Endpoint, name: str) -> None:
    """A section's server settings: an http(s) address, a key variable that is set, and
    only where its model is reached over the network."""
    if section.base_url is None and section.api_key_env is None:
        return
    setting = "base_url" if section.base_url is not None else "api_key_env"
    model = next((getattr(section, f) for f in ("model", "analyst", "reflection") if getattr(section, f, None)), None)
    if model is None and name == "evaluate":
        raise ConfigError(f"[evaluate] {setting}: for [evaluate] model, which is not set ([policy]'s server serves)")
    if model is None or not is_server(model):
        raise ConfigError(f"[{name}] {setting}: only an openai: or vllm: model has a server, not {model!r}")
    if section.base_url is not None and not section.base_url.startswith(("http://", "https://")):
        raise ConfigError(f"[{name}] base_url: an http:// or https:// address, got {section.base_url!r}")
    if section.api_key_env is not None and not os.environ.get(section.api_key_env):
        raise ConfigError(f"[{name}] api_key_env: the variable {section.api_key_env} is not set")


def _check_analyst(section: IdentifyStage | SynthesizeStage, where: str, offline: tuple[str, ...]) -> None:
    spec = section.analyst
    if spec in offline:
        return
    if is_chat_endpoint(spec):
        if not section.base_url and not os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
            raise ConfigError(
                f"{where}: {spec} needs an analyst endpoint: set base_url here, or OPENAI_BASE_URL (and OPENAI_API_KEY)"
            )
        return
    raise ConfigError(f"{where}: {unknown_analyst(spec, offline)}")


def _check_analyst_fits(spec: str, entry: Any) -> None:
    """An offline analyst labels only targets with what it reads: τ²'s gold actions,
    ToolSandbox's milestones, or reference solutions (``oracle_actions()``)."""
    where = "[identify] analyst"
    if spec == "gold" and "domain" not in entry.kwargs:
        raise ConfigError(
            f"{where}: gold reads τ²-bench's gold actions, which {entry.id} has not; use reference "
            "(its oracle_actions(), if it has them) or openai:<model>"
        )
    if spec == "milestone" and "toolsandbox" not in entry.entry_point:
        raise ConfigError(
            f"{where}: milestone reads ToolSandbox's milestones, which {entry.id} has not; use reference "
            "or openai:<model>"
        )
    if spec == "reference":
        register_all()  # a user's target module beside its manifest becomes importable
        module, _, name = entry.entry_point.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except Exception as exc:  # noqa: BLE001 - a user's module: any error it raises is theirs, said in one line
            raise ConfigError(
                f"[run] target: {entry.id}'s entry point {entry.entry_point} cannot be loaded ({exc})"
            ) from None
        method = getattr(cls, "oracle_actions", None)
        if not callable(method) or method is TextEnv.oracle_actions:
            raise ConfigError(
                f"{where}: reference reads a target's reference solutions; {entry.id} has no "
                "oracle_actions() (docs/targets.md); use openai:<model>"
            )


# --- the run directory and its state -------------------------------------------------------


class PipelineError(TraceGymError):
    """A run that cannot go on as asked (an existing run without --resume, a missing upstream stage)."""


@dataclass
class StageRecord:
    stage: str
    inputs_hash: str
    outputs: dict[str, Any]
    wall_s: float
    finished_at: str


class RunState:
    """``RUN/state.json``: what each finished stage read and wrote."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "state.json"
        self.stages: dict[str, StageRecord] = {}
        self.moved: tuple[str, str] | None = None
        if self.path.exists():
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
                self.stages = {k: StageRecord(**v) for k, v in raw.get("stages", {}).items()}
            except (json.JSONDecodeError, TypeError) as exc:
                raise PipelineError(f"{self.path} is damaged ({exc}); move it away to start the run over") from None

    def relocate(self, old: str, new: str) -> None:
        """Read paths under the run's recorded folder ``old`` as under ``new`` (where it is
        now), in the stages' outputs and, through ``path()``, in the files they name."""
        self.moved = (old.rstrip("/"), new.rstrip("/"))
        for record in self.stages.values():
            record.outputs = self.path_in(record.outputs)

    def path_in(self, value: Any) -> Any:
        """``value`` (a path, or a structure of them) with the run's old folder replaced by its new one."""
        if self.moved is None:
            return value
        old, new = self.moved
        if isinstance(value, str):
            return new + value[len(old) :] if value == old or value.startswith(old + "/") else value
        if isinstance(value, dict):
            return {k: self.path_in(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.path_in(v) for v in value]
        return value

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"stages": {k: dataclasses.asdict(v) for k, v in self.stages.items()}}, indent=2) + "\n"
        )
        tmp.replace(self.path)


HASHED_WHEN_SET = {"policy": {"chat_template": "auto"}, "evaluate": {"model": None}}
"""Settings added after runs were recorded, with their defaults: hashed only when set, so
that an earlier run resumes with its finished stages kept."""
NOT_HASHED = ("base_url", "api_key_env")
"""Where a model is reached, not what it is: a run moved to another server keeps its stages."""


def _hashed(section: str, table: dict[str, Any]) -> dict[str, Any]:
    late = HASHED_WHEN_SET.get(section, {})
    return {k: v for k, v in table.items() if not (k in late and v == late[k]) and k not in NOT_HASHED}


STAGE_VERSIONS = {"rollout": 2}
"""A stage whose outputs changed meaning is at a new version, so that a resumed run made
before redoes it (and what follows). rollout 2: a fallback's episodes join the policy's
own instead of replacing them."""


def stage_inputs_hash(config: PipelineConfig, stage: str, state: RunState) -> str:
    """A stage's inputs: the run's target and seed, the policy, its own settings, its
    version (from 2 on), and every upstream stage's recorded outputs (so a changed upstream
    redoes it)."""
    upstream = STAGES[: STAGES.index(stage)]
    version = STAGE_VERSIONS.get(stage, 1)
    payload = {
        **({"version": version} if version > 1 else {}),  # version 1 hashes as before versions existed
        "target": config.run.target,
        "seed": config.run.seed,
        "policy": _hashed("policy", to_table(config.policy)),
        "settings": _hashed(stage, to_table(getattr(config, stage))),
        "upstream": {s: state.stages[s].outputs for s in upstream if s in state.stages},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


StageFn = Callable[[PipelineConfig, RunState, Callable[[str], None]], dict[str, Any]]


def run_pipeline(
    config: PipelineConfig, *, resume: bool = False, from_stage: str | None = None, say: Callable[[str], None] = print
) -> Path:
    """Run the configured stages in order; returns the path of ``report.md``."""
    run_dir = config.run_dir
    if world_size() > 1:
        raise PipelineError(
            f"trace-gym run under a launcher ({world_size()} ranks): every rank would run every stage; run the "
            "pipeline as one process (a launcher spreads `trace-gym train` over ranks, one job at a time)"
        )
    if from_stage is not None and from_stage not in config.run.stages:
        raise PipelineError(f"--from {from_stage}: not one of this run's stages ({', '.join(config.run.stages)})")
    if run_dir.exists() and (run_dir / "state.json").exists() and not resume and from_stage is None:
        raise PipelineError(
            f"{run_dir} already holds a run; pass --resume to continue it (finished stages with "
            "unchanged inputs are kept) or --from STAGE to redo from a stage, or choose another [run] dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_table(config), indent=2, default=str) + "\n")
    state = RunState(run_dir)
    redo = False
    for stage in config.run.stages:
        redo = redo or stage == from_stage
        inputs = stage_inputs_hash(config, stage, state)
        record = state.stages.get(stage)
        if record and record.inputs_hash == inputs and not redo:
            say(f"[{stage}] unchanged since {record.finished_at}; kept ({_summary(record.outputs)})")
            continue
        _run_stage(config, state, stage, say)

    return write_report(config, state)


def _run_stage(config: PipelineConfig, state: RunState, stage: str, say: Callable[[str], None]) -> None:
    inputs = stage_inputs_hash(config, stage, state)
    say(f"[{stage}] running")
    started = time.perf_counter()
    outputs = STAGE_FUNCTIONS[stage](config, state, lambda m, s=stage: say(f"[{s}] {m}"))
    state.stages[stage] = StageRecord(
        stage,
        inputs,
        outputs,
        round(time.perf_counter() - started, 1),
        datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    # A redone stage invalidates what came after it: their recorded inputs no longer match.
    state.save()
    say(f"[{stage}] done in {state.stages[stage].wall_s:.0f}s ({_summary(outputs)})")


def load_run(run_dir: str | Path) -> tuple[PipelineConfig, RunState]:
    """An earlier run's config and state (``config.json``, ``state.json`` in its folder)."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not (run_dir / "state.json").exists() or not path.exists():
        raise PipelineError(f"{run_dir} holds no run of trace-gym run (no config.json and state.json there)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PipelineError(f"{path} is damaged ({exc})") from None
    config = config_from_data(data)
    state = RunState(run_dir)
    if Path(config.run.dir) != run_dir:  # moved, or named from another folder: its recorded paths follow it
        state.relocate(config.run.dir, str(run_dir))
    config.run.dir = str(run_dir)
    return config, state


def evaluate_run(
    run_dir: str | Path,
    *,
    methods: list[str] | None = None,
    split: str | None = None,
    tasks: int | None = None,
    samples: int | None = None,
    model: str | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """``trace-gym evaluate RUN``: the evaluate stage alone, over the artifacts of an
    earlier run, with its ``[evaluate]`` settings or these; returns ``report.md``."""
    config, state = load_run(run_dir)
    changes = {
        k: v
        for k, v in {"methods": methods, "split": split, "tasks": tasks, "samples": samples, "model": model}.items()
        if v is not None
    }
    config.evaluate = dataclasses.replace(config.evaluate, **changes)
    if "evaluate" not in config.run.stages:
        config.run.stages = [*config.run.stages, "evaluate"]
    check_config(config)
    if changes:
        (config.run_dir / "config.json").write_text(json.dumps(to_table(config), indent=2, default=str) + "\n")
    _run_stage(config, state, "evaluate", say)

    return write_report(config, state)


def route_run(
    run_dir: str | Path, *, messages: list[str] | None = None, split: str | None = None, tasks: int | None = None
) -> list[tuple[str, Any]]:
    """``trace-gym route RUN``: the routing decision of TRACE's router, built from an
    earlier run's artifacts, for each message, or for the first observation of each task
    of ``split`` (the first ``tasks``); returns (task or message, decision) pairs."""
    config, state = load_run(run_dir)
    ctx = eval_context(
        config, state, make_backend(config.eval_model, **config.eval_endpoint)
    )  # the base model routes: no adapter needed
    try:
        router = get_method("trace").build(ctx).kwargs["router"]
    except Unavailable as exc:
        raise PipelineError(f"{run_dir}: nothing to route to ({exc})") from None
    if messages:
        return [(m, router.route(m)) for m in messages]

    env = make(config.run.target, split=split or config.evaluate.split)
    try:
        ids = list(env.unwrapped.task_ids)[:tasks]
        out = []
        for task_id in ids:
            observation, _ = env.reset(options={"task_id": task_id})
            out.append((task_id, router.route(observation)))
        return out
    finally:
        env.close()


def _summary(outputs: dict[str, Any]) -> str:
    return outputs.get("summary", "")


# --- stages --------------------------------------------------------------------------------


def _agent_kwargs(config: PipelineConfig, **extra: Any) -> dict[str, Any]:
    return {
        "model": config.policy.spec,
        "temperature": config.policy.temperature,
        "max_new_tokens": config.policy.max_new_tokens,
        **config.policy.endpoint(),
        **extra,
    }


def stage_rollout(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    if config.rollout.trajectories:
        return _given_trajectories(config)
    # One file per distinct set of settings: changed settings start a new file, the same ones resume it.
    out = config.run_dir / "rollouts" / f"trajectories-{stage_inputs_hash(config, 'rollout', state)[:10]}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    env_kwargs = {"max_steps": config.rollout.max_steps} if config.rollout.max_steps else {}

    def play(who: str, path: Path, limit: int | None = config.rollout.tasks) -> dict[str, Any]:
        if who == "policy":
            agent, agent_kwargs = "llm", _agent_kwargs(config)
        else:
            agent, agent_kwargs = who, ({"deficits": config.rollout.deficits} if config.rollout.deficits else {})
        summary = rollout(
            config.run.target,
            agent,
            path,
            agent_kwargs=agent_kwargs,
            split=config.rollout.split,
            limit=limit,
            samples=config.rollout.samples,
            seed=config.run.seed,
            resume=True,
            env_kwargs=env_kwargs,
            executor=config.rollout.executor,
            workers=config.policy.workers if agent == "llm" else 1,
            batch=config.policy.batch if agent == "llm" else 1,
        )  # batching is for model generation
        return {
            "trajectories": str(path),
            "sha256": content_hash(path),
            "agent": who,
            "deficits": config.rollout.deficits if who != "policy" else {},
            "episodes": summary.episodes,
            "successes": summary.successes,
            "pass_rate": summary.successes / max(summary.episodes, 1),
            "mean_reward": summary.mean_reward,
            "wall_s": summary.wall_s,
            "summary": f"{summary.episodes} episodes, pass rate {summary.successes / max(summary.episodes, 1):.3f}",
        }

    ceilings = _check_ceilings(config, out.parent, say)
    played = play(config.rollout.agent, out)
    short = [
        side
        for side, n in (("successes", played["successes"]), ("failures", played["episodes"] - played["successes"]))
        if n < config.rollout.min_contrast
    ]
    if config.rollout.agent == "policy" and config.rollout.fallback and short:
        who = config.rollout.fallback
        reason = (
            f"the policy's {played['episodes']} episodes hold {played['successes']} successes and "
            f"{played['episodes'] - played['successes']} failures, fewer than {config.rollout.min_contrast} of each "
            "to contrast"
        )
        # (the whole split: a scripted fallback costs no model time, and selection needs contrast)
        other = play(who, out.with_name(out.stem + f"-{who}.jsonl"), None)
        mixed = out.with_name(out.stem + "-contrast.jsonl")
        added = write_stand_ins(Path(played["trajectories"]), Path(other["trajectories"]), mixed, short)
        said = " and ".join(f"{added[side]} {side}" for side in short)
        say(f"{reason}: the {who} agent's {said} stand in for the policy's; its own episodes are all kept")
        episodes, successes = played["episodes"] + sum(added.values()), played["successes"] + added["successes"]
        if min(successes, episodes - successes) < config.rollout.min_contrast:
            say(f"still fewer than {config.rollout.min_contrast} of each with them: identification may select nothing")
        return {
            "trajectories": str(mixed),
            "sha256": content_hash(mixed),
            "agent": "policy",
            "episodes": episodes,
            "successes": successes,
            "pass_rate": successes / max(episodes, 1),
            "wall_s": played["wall_s"] + other["wall_s"],
            "policy": played,
            "stand_in": {**other, "sides": short, "added": added},
            "fallback_reason": reason,
            "ceilings": ceilings,
            "summary": f"policy: {played['summary']}; too few to contrast, {who} adds {said}",
        }
    return {**played, "ceilings": ceilings}


def write_stand_ins(own: Path, other: Path, out: Path, sides: list[str]) -> dict[str, int]:
    """One file for identification: every episode of ``own`` and, of ``other``, those on the
    ``sides`` (``successes``, ``failures``) the first is short of. Both played the same split, so
    a stand-in's episode id gains its agent's name. Written whole or not at all; returns how many
    of each side were added."""
    kept, added = read_trajectories(own), {"successes": 0, "failures": 0}
    for t in read_trajectories(other):
        side = "successes" if t.success else "failures"
        if side in sides:
            kept.append(t.model_copy(update={"episode_id": f"{t.episode_id}|{t.agent}"}))
            added[side] += 1
    write_trajectories(out, read_run_settings(own) + read_run_settings(other), kept)
    return added


def oracle_ceiling(
    target: str, out: Path, *, split: str | None, tasks: int | None, max_steps: int | None, seed: int = 0
) -> dict[str, Any] | None:
    """The target's own solutions played on these tasks within ``max_steps``: the most any agent
    can pass there. None when the target knows no solutions (``oracle_actions`` gives None)."""
    env_kwargs = {"max_steps": max_steps} if max_steps else {}
    env = make(target, **({"split": split} if split else {}), **env_kwargs)
    try:
        task_ids = list(getattr(env.unwrapped, "task_ids", None) or [])
        solutions = getattr(env.unwrapped, "oracle_actions", None)
        if not task_ids or not callable(solutions):
            return None
        env.reset(seed=0, options={"task_id": task_ids[0]})
        if solutions() is None:
            return None
    finally:
        env.close()
    summary = rollout(
        target, "oracle", out, split=split, limit=tasks, seed=seed, resume=True, env_kwargs=env_kwargs, progress=False
    )
    return {
        "episodes": summary.episodes,
        "successes": summary.successes,
        "max_steps": max_steps,
        "split": split,
        "trajectories": str(out),
    }


def _check_ceilings(config: PipelineConfig, folder: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Refuse, before any model time, a step limit within which even the target's own
    solutions pass none of the tasks: no agent could, and every figure would read 0.
    Evaluation's limit is checked on the rollout split too (only evaluation plays held-out tasks)."""
    limits = {"rollout": (config.rollout.max_steps, config.rollout.tasks)}
    if "evaluate" in config.run.stages:
        limits["evaluate"] = (config.evaluate.max_steps, config.evaluate.tasks or config.rollout.tasks)
    found: dict[str, Any] = {}
    for stage, (max_steps, tasks) in limits.items():
        name = f"oracle-{config.rollout.split}-{max_steps or 'default'}-{tasks or 'all'}.jsonl"
        ceiling = oracle_ceiling(
            config.run.target,
            folder / name,
            split=config.rollout.split,
            tasks=tasks,
            max_steps=max_steps,
            seed=config.run.seed,
        )
        if ceiling is None:
            return {}  # a target without reference solutions: nothing to measure the limits against
        found[stage] = ceiling
        if ceiling["successes"] == 0:
            raise PipelineError(
                f"[{stage}] max_steps {max_steps if max_steps else '(the default)'}: the target's own solutions "
                f"pass none of the first {ceiling['episodes']} {config.rollout.split} tasks within it, so no agent "
                "can; raise it"
            )
        say(
            f"the target's own solutions pass {ceiling['successes']} of {ceiling['episodes']} {config.rollout.split} "
            f"tasks within [{stage}] max_steps {max_steps or '(default)'}"
        )
    return found


def _given_trajectories(config: PipelineConfig) -> dict[str, Any]:
    path = Path(config.rollout.trajectories)
    trajectories = read_trajectories(path)
    other = sorted({t.env_id for t in trajectories} - {config.run.target})
    if other:
        raise PipelineError(
            f"[rollout] trajectories: {path} holds episodes of {', '.join(other)}, not only of {config.run.target}"
        )
    successes = sum(t.success for t in trajectories)
    return {
        "trajectories": str(path),
        "sha256": content_hash(path),
        "episodes": len(trajectories),
        "successes": successes,
        "pass_rate": successes / max(len(trajectories), 1),
        "mean_reward": sum(t.reward for t in trajectories) / max(len(trajectories), 1),
        "wall_s": 0.0,
        "given": True,
        "summary": f"{len(trajectories)} given episodes (not rolled out), pass rate "
        f"{successes / max(len(trajectories), 1):.3f}",
    }


def stage_identify(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    upstream = _require(state, "rollout", "identify")
    trajectories = read_trajectories(upstream["trajectories"])
    out = config.run_dir / "identify"
    analyst = make_analyst(config.identify.analyst, cache_dir=out / ".analyst_cache", **config.identify.endpoint())
    try:
        result = identify(
            trajectories, analyst, out, config=config.identify.selection, seed=config.run.seed, progress=say
        )
    except DegenerateInputError as exc:
        # No contrast is possible (all successes or all failures): say so, select nothing.
        Identification([], {"calls": 0, "tokens": 0}, degenerate=str(exc)).save(out)
        say(f"no capability can be selected: {exc}")
        return {
            "dir": str(out),
            "selected": [],
            "degenerate": str(exc),
            "analyst_calls": 0,
            "summary": "nothing selected (no contrast possible)",
        }
    return {
        "dir": str(out),
        "sha256": content_hash(out / "capabilities.json", out / "labels.jsonl"),
        "selected": list(result.selected),
        "analyst_calls": result.analyst.get("calls", 0),
        "analyst_tokens": result.analyst.get("tokens", 0),
        "summary": f"selected {', '.join(result.selected) or 'nothing'}",
    }


def content_hash(*paths: Path) -> str:
    """sha256 over files (a folder: every file below it, by relative path), so that a
    stage downstream notices when an upstream output changed, not only its path."""
    digest = hashlib.sha256()
    for path in paths:
        path = Path(path)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if f.exists():
                digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
                digest.update(f.read_bytes() + b"\0")
    return digest.hexdigest()


def _require(state: RunState, stage: str, by: str) -> dict[str, Any]:
    if stage not in state.stages:
        raise PipelineError(
            f"the {by} stage needs the {stage} stage's output; add '{stage}' to [run] stages or run it first"
        )
    return state.stages[stage].outputs


def stage_synthesize(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    identified = _require(state, "identify", "synthesize")
    out = config.run_dir / "envs"
    registry = out / "registry"
    registry.mkdir(parents=True, exist_ok=True)
    add_registry_dir(registry)  # the run's own envs are visible to gym.make (workers are told: registry_dirs())
    envs = EnvSet()
    if not identified["selected"]:
        say("no capability was selected; nothing to synthesize")
        summary, calls, tokens = "nothing to synthesize", 0, 0
    else:
        loop = dataclasses.replace(config.synthesize.loop, resume=True)  # a registered env with a matching hash is kept
        unknown = sorted(set(config.synthesize.only) - set(identified["selected"]))
        if unknown:
            raise PipelineError(
                f"[synthesize] only: {', '.join(unknown)} not selected by identification "
                f"(selected: {', '.join(identified['selected'])})"
            )
        result = synthesize(
            Path(identified["dir"]) / "capabilities.json",
            config.run.target,
            analyst=config.synthesize.analyst,
            registry_dir=registry,
            config=loop,
            only=config.synthesize.only or None,
            trajectories=state.stages["rollout"].outputs["trajectories"] if "rollout" in state.stages else None,
            cache_dir=out / ".analyst_cache",
            progress=say,
            **config.synthesize.endpoint(),
        )

        for o in result.outcomes:
            status = read_manifest(Path(o.path)).validation_status() if o.path else "-"
            env_id = o.env_id if o.ok else None  # a failed outcome may name a folder it refused to use
            envs.envs.append(EnvRecord(o.capability, env_id, o.path, o.status, status, len(o.attempts), o.message))
        for note in result.notes:
            say(note)
        summary = f"{len(envs.trainable())} of {len(envs.envs)} capabilities have an env"
        calls, tokens = result.calls, result.tokens
    envs_json = envs.save(out)
    return {
        "envs_json": str(envs_json),
        "registry": str(registry),
        "sha256": content_hash(envs_json, registry),
        "envs": envs.trainable(),
        "analyst_calls": calls,
        "analyst_tokens": tokens,
        "summary": summary,
    }


def training_plan(config: PipelineConfig, envs: dict[str, str]) -> list[dict[str, Any]]:
    """The training runs of the train stage: one adapter per capability env, then the
    baselines at the same total rollout budget, then the causal control."""
    plan = [{"name": cap, "kind": "capability", "envs": [env_id], "scale": 1} for cap, env_id in sorted(envs.items())]
    total = baseline_scale(len(plan))  # the baselines get as many rollouts as all capability adapters together
    if config.train.grpo_target and plan:
        plan.append({"name": "grpo-target", "kind": "baseline", "envs": [config.run.target], "scale": total})
    if config.train.merged and len(envs) > 1:  # one adapter over all capability envs: only a baseline with two or more
        plan.append({"name": "merged", "kind": "baseline", "envs": sorted(envs.values()), "scale": total})
    for cap in config.train.control:
        if cap in envs:
            continue  # selected after all: it is a TRACE adapter, not a control
        plan.append(
            {
                "name": f"control-{cap}",
                "kind": "control",
                "capability": cap,
                "envs": [serving_envs(cap, config.run.target)[0].id],
                "scale": 1,
            }
        )
    return plan


def stage_train(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    synthesized = _require(state, "synthesize", "train")
    add_registry_dir(synthesized["registry"])
    out = config.run_dir / "adapters"
    out.mkdir(parents=True, exist_ok=True)
    made = AdapterSet()
    plan = training_plan(config, EnvSet.load(synthesized["envs_json"]).trainable())
    if not plan:
        say("no capability env to train on")
    runs = {
        job["name"]: grpo_config(config, job["envs"], str(out / job["name"]), iterations_scale=job["scale"])
        for job in plan
    }
    todo = []
    for i, job in enumerate(plan, 1):
        folder, run = out / job["name"], runs[job["name"]]
        done = TrainLog(folder / "train_log.jsonl").read()
        if (folder / "adapter" / "adapter_config.json").exists() and done and done[-1]["iteration"] >= run.iterations:
            say(f"({i}/{len(plan)}) {job['name']}: already trained ({run.iterations} iterations); kept")
            continue
        resume = (folder / "run.json").exists()
        say(
            f"({i}/{len(plan)}) {job['name']} on {', '.join(job['envs'])}: {run.iterations} iterations of "
            f"{run.groups}x{run.rollouts_per_group} rollouts" + (" (resuming)" if resume else "")
        )
        todo.append(Job(job["name"], run, resume))
    devices = visible_gpus() if todo and todo[0].run.device == "cuda" else []
    outcomes = train_jobs(todo, devices, say, registry=[str(synthesized["registry"])])
    for job in plan:
        folder, run = out / job["name"], runs[job["name"]]
        outcome = outcomes.get(job["name"])
        if outcome is not None and outcome.not_trained:
            say(f"{job['name']}: not trained: {outcome.not_trained}")
            made.untrainable.append(
                UntrainableRecord(job["name"], job["envs"], outcome.not_trained, str(folder / "calibration.json"))
            )
            continue
        log = TrainLog(folder / "train_log.jsonl").read()
        made.adapters.append(
            AdapterRecord(
                job["name"],
                job["kind"],
                job["envs"],
                str(folder / "adapter"),
                str(folder / "train_log.jsonl"),
                run.iterations,
                rollouts=log[-1]["rollouts"] if log else 0,
                episodes_played=(log[-1].get("episodes_played", 0) + log[-1].get("calibration_episodes", 0))
                if log
                else 0,
                calibration=str(folder / "calibration.json") if (folder / "calibration.json").exists() else None,
                wall_s=log[-1].get("elapsed_s") if log else None,
                reward_curve=str(folder / "reward_curve.png") if (folder / "reward_curve.png").exists() else None,
                capability=job.get("capability"),
            )
        )
    adapters_json = made.save(out)
    untrainable = [u.name for u in made.untrainable]
    return {
        "adapters_json": str(adapters_json),
        "sha256": content_hash(adapters_json, *[Path(a.adapter) for a in made.adapters]),
        "summary": f"{len(made.adapters)} adapters; the TRACE adapters used {trace_budget(made)} rollouts"
        + (f"; untrainable for this policy: {', '.join(untrainable)}" if untrainable else ""),
    }


def stage_gepa(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    budget = config.gepa.budget
    if budget is None:
        trained = _require(state, "train", "gepa (its budget is the TRACE adapters' rollouts; or set [gepa] budget)")
        budget = trace_budget(AdapterSet.load(trained["adapters_json"]))
        if budget < 1:
            raise PipelineError(
                "[gepa] budget: the train stage trained no capability adapter to match; set [gepa] budget"
            )
        say(f"budget {budget} episodes: as many as the TRACE adapters were trained on")
    run = gepa_config(config, budget)
    out = Path(run.out)
    if (out / "settings.json").exists() and json.loads((out / "settings.json").read_text()) != json.loads(
        json.dumps(run.settings())
    ):
        say(f"the settings changed since {out} was searched; starting the search over")
        shutil.rmtree(out)
    outcome = run_gepa(run, resume=True, say=say)
    return {
        "dir": str(out),
        "best_prompt": outcome.best_prompt,
        "rollouts": outcome.rollouts,
        "budget": budget,
        "reflection": outcome.reflection,
        "reflection_calls": outcome.reflection_calls,
        "seed_val_score": outcome.seed_val_score,
        "best_val_score": outcome.best_val_score,
        "candidates": outcome.candidates,
        "wall_s": outcome.wall_s,
        "warning": outcome.warning,
        "summary": f"{outcome.candidates} candidates, {outcome.rollouts}/{budget} episodes, validation "
        f"{outcome.seed_val_score:.3f} -> {outcome.best_val_score:.3f}",
    }


def eval_context(config: PipelineConfig, state: RunState, backend: Any) -> Any:
    """What evaluation's methods build from: this run's artifacts, loaded typed."""
    outputs = {name: record.outputs for name, record in state.stages.items()}
    adapters = AdapterSet.load(outputs["train"]["adapters_json"]) if "train" in outputs else AdapterSet()
    for record in adapters.adapters:  # paths inside the file follow a moved run too
        for name in ("adapter", "train_log", "calibration", "reward_curve"):
            setattr(record, name, state.path_in(getattr(record, name)))
    return EvalContext(
        target=config.run.target,
        backend=backend,
        adapters=adapters,
        identification=Identification.load(outputs["identify"]["dir"]) if "identify" in outputs else None,
        train_trajectories=read_trajectories(outputs["rollout"]["trajectories"]) if "rollout" in outputs else [],
        gepa=outputs.get("gepa"),
        calibrate_router=config.evaluate.calibrate_router,
        analyst_calls=sum(outputs[s].get("analyst_calls", 0) for s in ("identify", "synthesize") if s in outputs),
        pre_training_wall_s=sum(
            state.stages[s].wall_s for s in ("rollout", "identify", "synthesize") if s in state.stages
        ),
    )


def stage_evaluate(config: PipelineConfig, state: RunState, say: Callable[[str], None]) -> dict[str, Any]:
    out = config.run_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    ctx = eval_context(config, state, None)
    ctx.backend = policy_backend(config.eval_model, ctx.adapters, **config.eval_endpoint)
    adapters = ctx.adapters
    env_kwargs = {"max_steps": config.evaluate.max_steps} if config.evaluate.max_steps else {}
    played = {}
    reused = set()  # rows scored from another method's episodes (their note says whose)
    for name, built, cost in build_methods(config.evaluate.methods, ctx, say):
        if built.same_as in played:
            say(f"{name}: {built.note}; not played again")
            played[name] = (played[built.same_as][0], built, cost)
            reused.add(name)
            continue
        path = out / f"{name}.jsonl"
        if name == "summed" and isinstance(ctx.backend, SumsAdapters):  # the sum of these adapters, every time
            say(f"summed adapter saved to {ctx.backend.save_adapter('summed', out / 'summed-adapter')} (servable)")
        say(f"{name} on the {config.evaluate.split} split")

        def play(path: Path = path, built: Any = built) -> Any:
            return rollout(
                config.run.target,
                built.agent,
                path,
                agent_kwargs={**_agent_kwargs(config, model=ctx.backend), **built.kwargs},
                split=config.evaluate.split,
                limit=config.evaluate.tasks,
                samples=config.evaluate.samples,
                seed=derive_seed(config.run.seed, "evaluate"),
                resume=True,
                env_kwargs=env_kwargs,
                batch=config.policy.batch,
                workers=config.policy.workers,
                progress=False,
            )

        try:
            summary = play()
        except OtherRunError:  # an earlier evaluation with other settings: kept, not resumed
            aside = _set_aside(path, out / "earlier")
            say(f"{name}: {path.name} holds an evaluation made with other settings; kept as {aside}, played again")
            summary = play()
        planned = set(summary.episode_ids)  # the file may hold episodes of an earlier, larger evaluation
        played[name] = ([t for t in read_trajectories(path) if t.episode_id in planned], built, cost)
    base = played["base"][0] if "base" in played else []
    labels = _held_out_labels(config, ctx, played, out, say)
    groups: dict[str, set[str]] = {}  # the truth routing is scored against: where base lacked each capability
    if "base" in labels and config.identify.analyst in TRUTH_ANALYSTS:
        task_of = {t.episode_id: t.task_id for t in base}
        groups = {
            c: {task_of[x.episode_id] for x in labels["base"] if x.capability == c and x.label == LACKING}
            for c in sorted({x.capability for x in labels["base"]})
        }
    results = []
    for name, (trajectories, built, cost) in played.items():
        result = method_result(name, trajectories, groups=groups, routed_capabilities=built.routed, cost=cost)
        result.note = built.note if name in reused else ""
        if name in labels:
            result.lacking = lacking_rates(labels[name], _measured_capabilities(ctx))
        if base and name != "base":
            result.flips = task_flips(base, trajectories)
        results.append(result)
    base_result = next((r for r in results if r.method == "base"), None)
    for result in results:
        built = played[result.method][1]
        if base_result is not None and result is not base_result and built.targets and result.lacking:
            result.specificity = specificity(base_result, result, built.targets)
    paths = write_results(results, out, reward_curves={a.name: Path(a.train_log) for a in adapters.adapters})
    best = max(results, key=lambda r: r.pass_1) if results else None
    return {
        "results_json": str(out / "results.json"),
        "results_md": str(out / "results.md"),
        "plots": [str(p) for p in paths if p.suffix == ".png"],
        "sha256": content_hash(out / "results.json"),
        "summary": f"{len(results)} methods" + (f"; best pass^1 {best.pass_1:.3f} ({best.method})" if best else ""),
    }


def _set_aside(path: Path, folder: Path) -> Path:
    """Move ``path`` into ``folder`` under the first free numbered name; returns where it went."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 1
    while (folder / f"{path.stem}.{n}{path.suffix}").exists():
        n += 1
    return path.rename(folder / f"{path.stem}.{n}{path.suffix}")


TRUTH_ANALYSTS = ("gold", "milestone", "reference")
"""Analysts whose labels are rules over the target's reference solutions: routing is
scored against them (an LLM analyst's labels measure, but are no truth to score against)."""


def _measured_capabilities(ctx: Any) -> list[str]:
    """Every candidate capability identification weighed (selected or not)."""
    return [c.name for c in ctx.identification.candidates] if ctx.identification is not None else []


def _held_out_labels(
    config: PipelineConfig, ctx: Any, played: dict[str, Any], out: Path, say: Callable[[str], None]
) -> dict[str, list[Any]]:
    """The run's analyst's labels of every method's held-out episodes (capability-level
    figures); none where identification did not run or its analyst cannot label them."""
    capabilities = _measured_capabilities(ctx)
    if not capabilities or not played:
        return {}
    candidates = {c.name: c.description for c in ctx.identification.candidates}
    try:
        analyst = make_analyst(config.identify.analyst, cache_dir=out / ".analyst_cache", **config.identify.endpoint())
        return {name: label_all(analyst, trajectories, candidates) for name, (trajectories, _, _) in played.items()}
    except TraceGymError as exc:
        say(
            f"capability-level figures left out: the {config.identify.analyst} analyst could not label the "
            f"held-out episodes ({exc})"
        )
        return {}


STAGE_FUNCTIONS: dict[str, StageFn] = {
    "rollout": stage_rollout,
    "identify": stage_identify,
    "synthesize": stage_synthesize,
    "train": stage_train,
    "gepa": stage_gepa,
    "evaluate": stage_evaluate,
}
