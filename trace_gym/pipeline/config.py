"""A run's configuration: the TOML sections of ``trace-gym run``, read and checked before any work."""

from __future__ import annotations

import dataclasses
import importlib
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..agents import AGENTS
from ..config import ConfigError, from_table, read_toml
from ..env import TextEnv
from ..errors import TraceGymError
from ..evaluation import METHODS as REGISTERED_METHODS  # the built-in rows and any a user registered
from ..gepa_baseline import DEFAULT_SEED_PROMPT, GEPAConfig
from ..identification.llm_analyst import unknown_analyst
from ..identification.stats import SelectionConfig
from ..llm import LLMError
from ..llm.registry import check_spec, is_chat_endpoint, is_server, is_token_endpoint, split_spec, with_template
from ..registry import HELD_OUT_SPLIT, TRAIN_SPLIT, EnvKind, get_entry, held_out_tasks, register_all, split_tasks
from ..store import read_trajectories
from ..synthesis import serving_envs
from ..synthesis.loop import SynthesisConfig
from ..training.config import GRPOTrainingConfig, TrainingError

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
    """Read and check a pipeline config before a run; every mistake is one line naming the field."""
    config = config_from_data(read_toml(path))
    check_no_held_out_task(config)
    return config


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


def check_no_held_out_task(config: PipelineConfig) -> None:
    """Refuses, in one line, a run whose stages but evaluation would play or read a task of
    the target's held-out split: a rollout split (or given trajectories) or a GEPA split
    that holds one. Checked before a run (``load_config``), not on a finished run's config
    (``trace-gym evaluate``, ``route`` and ``serve`` play nothing it guards). The train split
    is the target contract's own and disjoint from the held-out one: it is not listed."""
    stages = config.run.stages
    splits = []
    if "rollout" in stages and not config.rollout.trajectories:
        splits.append(("[rollout] split", config.rollout.split))
    if "gepa" in stages:
        splits.append(("[gepa] split", config.gepa.split))
    splits = [(where, split) for where, split in splits if split != TRAIN_SPLIT]
    given = config.rollout.trajectories if "rollout" in stages else None
    if not splits and not given:
        return
    target = config.run.target
    try:
        held = held_out_tasks(target)
        for where, split in splits:
            overlap = held if split == HELD_OUT_SPLIT else split_tasks(target, split) & held
            if overlap:
                raise ConfigError(
                    f"{where}: '{split}' holds {len(overlap)} of {target}'s held-out '{HELD_OUT_SPLIT}' tasks; "
                    f"only evaluation plays them (use {TRAIN_SPLIT})"
                )
    except ConfigError:
        raise
    except Exception as exc:  # a target of the user's that cannot list a split: one line, not a traceback
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"[run] target: cannot list {target}'s tasks by split ({type(exc).__name__}: {first})"
        ) from None
    if given and held:
        for trajectory in read_trajectories(given):  # the store's reader: one line on a malformed file
            if trajectory.env_id == target and trajectory.task_id is not None and str(trajectory.task_id) in held:
                raise ConfigError(
                    f"[rollout] trajectories: episode {trajectory.episode_id} plays task {trajectory.task_id} of "
                    f"{target}'s held-out '{HELD_OUT_SPLIT}' split; only evaluation may see it"
                )


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
    bad = [m for m in config.evaluate.methods if m not in REGISTERED_METHODS]
    if bad:
        raise ConfigError(f"[evaluate] methods: unknown method '{bad[0]}'; methods are {', '.join(REGISTERED_METHODS)}")
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
