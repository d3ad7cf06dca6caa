"""The settings of one GRPO training run, paired with ``trainer.py`` (TRL-style),
and of one SFT warm start (``SFTTrainingConfig``, paired with ``sft.py``).

Every field is documented once, here, where it is defined; the defaults are
the TRACE paper's (LoRA rank 32, G = 4 seeds per iteration, K = 4 rollouts per
seed, AdamW at lr 1e-5, 40 iterations, clip 0.2 with a KL term to the base
policy, hints on 25-50% of rollouts). Where the paper gives no number the
choice is named as ours in the field's docstring. Nothing here touches a model
or an environment: ``check()`` only validates values, ``to_grpo_args()`` maps
them onto TRL's ``GRPOConfig``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_gym.errors import TraceGymError
from trace_gym.llm.precision import DTYPES, resolve_dtype

LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # TRL 1.16's GRPO losses


class TrainingError(TraceGymError):
    """A training run that cannot start or continue: a bad setting, a missing package, an out folder in use."""


@dataclass
class GRPOTrainingConfig:
    """One LoRA adapter trained with GRPO on one env or a mixture of envs."""

    env_ids: list[str]
    """Registry env ids to train on. One id: an adapter per capability (or, with a
    target id, the GRPO-on-target baseline); several: one merged adapter over
    their mixture, the seeds of each iteration drawn round-robin over the ids."""
    out: str
    """Run folder: the adapter (PEFT format) in ``adapter/``, ``train_log.jsonl``,
    ``reward_curve.png``, ``checkpoints/`` and ``run.json`` (this config)."""
    model: str = "smollm2-135m-instruct"
    """The policy: the embedded model's name or a local Hugging Face folder (never a hub id)."""

    # --- GRPO (the paper's settings) -------------------------------------------------
    iterations: int = 40
    """GRPO iterations; each plays ``groups`` x ``rollouts_per_group`` episodes and makes one optimizer step."""
    groups: int = 4
    """G: seeds (tasks) per iteration."""
    rollouts_per_group: int = 4
    """K: episodes per seed; the advantage of each is its reward normalised within its group."""
    learning_rate: float = 1e-5
    """AdamW learning rate (constant schedule)."""
    clip_epsilon: float = 0.2
    """epsilon of the clipped policy-ratio objective (the paper: about 0.2)."""
    kl_beta: float = 0.04
    """Weight of the KL term to the base policy (the LoRA disabled). The paper uses a KL
    term without giving its weight; 0.04 is GRPO's original (DeepSeekMath) value. 0 drops
    the reference forward pass."""
    loss_type: str = "grpo"
    """TRL loss aggregation; ``grpo`` is the paper's per-sequence mean (TRL's default is ``dapo``)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    hint_share: float = 0.25
    """Share of each group played with ``reset(hint=True)`` (the paper: 0.25-0.5); the
    update sees the hint-free prompt with the hinted episode's completion. Must leave
    at least one hint-free rollout per group (it gives the hint-free prompt). Envs
    that cannot hint (targets) play every rollout without one."""
    seed: int = 0
    """Seeds the env seeds of every iteration, the sampler and the LoRA initialisation."""

    # --- what the policy trains on: calibration and dynamic sampling ---------------------
    max_draws: int = 3
    """Draws per group per iteration (dynamic sampling): a group whose K rewards are all
    equal gives GRPO nothing to learn, so it is played again under a fresh seed (a
    target: another training task), up to this many draws. Every episode played counts
    (``episodes_played`` in the log), so methods compare at equal rollouts. 1: off. The
    authors' code re-samples constant groups; TRL does not (its issue 3708)."""
    calibrate: bool = True
    """Before the first iteration, play G x K episodes of each env with the policy being
    trained (seeds drawn as training draws them, hints as training gives them) at its
    difficulty levels (an env's ``LEVELS``), moving the level until the policy is in
    ``reward_band``; the figures go to ``calibration.json``. An env that no level makes
    trainable (``min_informative``) is refused unless ``train_anyway``."""
    level: int | None = None
    """Difficulty level to train at (an env with ``LEVELS``); None: calibration's choice,
    or the env's own default when calibration is off."""
    reward_band: list[float] = field(default_factory=lambda: [0.2, 0.6])
    """Mean reward calibration aims for (the authors' code: [0.2, 0.6]): a level above it
    is made harder, below it easier."""
    min_informative: float = 0.5
    """Share of informative groups (rewards not all equal) an env needs at its calibrated
    level to be trained (the authors' code: at least half)."""
    calibration_groups: int | None = None
    """Groups calibration plays per level; None: G."""
    train_unvalidated: list[str] = field(default_factory=list)
    """Synthesized envs to train although their validation report is missing, stale
    or failed, each named by id (training an env validation has not passed is a
    decision, never a default)."""
    train_anyway: bool = False
    """Train an env that calibration found untrainable for this policy, or that was not
    calibrated (``calibrate`` off), instead of refusing it."""

    # --- LoRA ----------------------------------------------------------------------------
    lora_rank: int = 32
    """LoRA rank r (the paper: 32, about 5% of the parameters of its 8B model)."""
    lora_alpha: int = 64
    """LoRA scaling alpha (ours: 2 x rank; the paper does not say)."""
    lora_dropout: float = 0.0
    """LoRA dropout (ours: none, so the rollout policy and the trained policy agree)."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Modules that get an adapter (attention projections, as the authors' code)."""

    # --- episodes ------------------------------------------------------------------------
    max_new_tokens: int = 256
    """Tokens the policy may sample per turn."""
    max_steps: int | None = None
    """Agent actions per episode; None keeps each env's own limit."""
    sandbox_backend: str = "auto"
    """Sandbox backend of synthesized envs: auto, docker, bwrap."""
    sandbox_cpu_seconds: int = 600
    """CPU seconds one sandbox worker may use over its life (an rlimit). The pool
    replaces each worker after ``recycle_after`` episodes, long before this, so a
    long run never meets the limit; it stays as a backstop to the call time limit."""
    spot_check: bool = True
    """Each iteration, on one seed it trains on, play each synthesized env's oracle and a
    message-only agent (no model, not counted as rollouts): the oracle must solve it
    and the floor go unpaid, as validation saw, or the env is stopped in one line
    (``EnvTurnedError``): validation cannot see an env that is honest on its own seeds
    only. Envs in ``train_unvalidated`` are not checked (no validation to compare with)."""
    env_call_timeout_s: float = 2.0
    """Wall-clock limit of one call into a synthesized env (reset, step, reward) in
    training: validation passed its steps at p99 under 0.5 s, so an env that now takes
    longer has changed its behaviour on training's seeds. The worker is killed and the
    episode voided (counted in the log with its reason), and training goes on."""
    max_episode_s: float = 600.0
    """Wall time of one training episode (its share of batched generation and its env
    steps); past it the episode ends after its current step, truncated, with the
    reason in the log."""
    max_iteration_s: float = 3600.0
    """Wall time of one iteration's rollouts: past it, constant groups are no longer
    redrawn (the first draw of every group is always played; each episode is bounded
    by ``max_episode_s``)."""
    max_observation_chars: int = 20_000
    """Longest text a synthesized env may hand the agent at once; longer is cut and
    says so (sandbox/env.py ``MAX_OBSERVATION_CHARS``)."""
    recycle_after: int = 64
    """Episodes a sandbox worker plays before the pool replaces it with a fresh one."""

    # --- machine --------------------------------------------------------------------------
    device: str = "cpu"
    """``cpu`` or ``cuda``. On CPU: ``use_cpu`` and TRL's ``bf16`` (autocast mixed
    precision) off, whatever ``dtype`` is: the weights' dtype is the precision; on
    CUDA: TRL's ``bf16`` on when the weights are bfloat16."""
    dtype: str = "auto"
    """The model weights' dtype: ``auto``, ``float32`` or ``bfloat16``. ``auto``:
    bfloat16 on CUDA and on a CPU with bf16 matrix instructions (AVX512-BF16 or
    AMX on x86, the BF16 extension on Arm), float32 on other CPUs, where bf16
    products are emulated and slower. The LoRA weights, their gradients and the
    optimizer state stay float32 either way (peft keeps adapters in float32), a
    resumed run continues in the dtype it started in (``run.json``), and
    log-probabilities and the loss are taken in float32 from bf16 logits, as TRL
    does on a GPU. What each costs: docs/benchmarks.md (``grpo_iteration.py --dtype``)."""
    use_vllm: bool = False
    """Generate through TRL's vLLM integration (only where ``vllm`` is importable)."""
    micro_batch: int | None = None
    """Episodes per forward/backward pass; None: K (one group). The optimizer still
    steps once per iteration. A larger pass runs the system prompt its groups share
    once instead of once per group: faster, for more memory (measured in docs/benchmarks.md,
    ``grpo_iteration.py --micro-batch``)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (saves memory, costs about a third
    more compute); TRL turns it on by default, we keep it off: an adapter of a small
    model fits without it. Turn it on for large models on a GPU. It is
    non-reentrant, and the shared-prefix update stays on under it."""
    shared_prefix_update: bool = True
    """Score the rows' shared prompt once per micro-batch in the update (its KL
    reference and policy passes) instead of once per row, put each group's rows
    into one micro-batch, and run only the sampled tokens through the output
    layer; exact for the ``grpo``, ``dapo`` and ``dr_grpo`` losses (``bnpo`` and an
    entropy bonus average per micro-batch, now per group), see ``shared_update.py``.
    Off: TRL's own passes."""
    torch_threads: int | None = None
    """CPU threads of torch; None keeps torch's choice. On a shared machine 1 is often fastest."""
    save_every: int = 1
    """Iterations between checkpoints (``--resume`` continues from the last one)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted)."""

    @property
    def rollouts_per_iteration(self) -> int:
        return self.groups * self.rollouts_per_group

    @property
    def hinted_per_group(self) -> int:
        """Rollouts of each group played with a hint: the share of K, rounded to nearest."""
        return int(math.floor(self.hint_share * self.rollouts_per_group + 0.5))

    def check(self) -> "GRPOTrainingConfig":
        """Raise ``TrainingError`` naming the first bad setting; returns self."""
        if not self.env_ids or not all(isinstance(e, str) and e for e in self.env_ids):
            raise TrainingError("--env needs at least one registry env id")
        positive = {
            "iterations": self.iterations,
            "groups": self.groups,
            "lora_rank": self.lora_rank,
            "max_new_tokens": self.max_new_tokens,
            "save_every": self.save_every,
            "keep_checkpoints": self.keep_checkpoints,
            "recycle_after": self.recycle_after,
        }
        for name, value in positive.items():
            if value < 1:
                raise TrainingError(f"{name} must be at least 1, got {value}")
        if self.rollouts_per_group < 2:
            raise TrainingError(
                f"rollouts_per_group (K) must be at least 2: GRPO compares rollouts within a group, got {self.rollouts_per_group}"
            )
        if not 0.0 <= self.hint_share < 1.0:
            raise TrainingError(
                f"hint_share must be in [0, 1): a group needs a hint-free rollout, got {self.hint_share}"
            )
        if self.hint_share > 0 and self.hinted_per_group >= self.rollouts_per_group:
            raise TrainingError(
                f"hint_share {self.hint_share} hints all {self.rollouts_per_group} rollouts of a group; lower it"
            )
        if self.learning_rate <= 0 or self.temperature <= 0:
            raise TrainingError("learning_rate and temperature must be positive")
        if self.loss_type not in LOSS_TYPES:
            raise TrainingError(f"loss_type must be one of {', '.join(LOSS_TYPES)} (TRL's), got {self.loss_type!r}")
        check_placement(self.device, self.dtype)
        if self.micro_batch is not None and (self.micro_batch < 1 or self.rollouts_per_iteration % self.micro_batch):
            raise TrainingError(
                f"micro_batch must divide G x K = {self.rollouts_per_iteration}, got {self.micro_batch}"
            )
        if not self.calibrate and not self.train_anyway:
            raise TrainingError(
                "calibration is off: nothing says the policy can learn from these envs; "
                "turn it on, or pass --train-anyway"
            )
        if min(self.env_call_timeout_s, self.max_observation_chars, self.max_episode_s, self.max_iteration_s) <= 0:
            raise TrainingError(
                "env_call_timeout_s, max_observation_chars, max_episode_s and max_iteration_s must be positive"
            )
        if self.max_draws < 1:
            raise TrainingError(f"max_draws must be at least 1 (1: no dynamic sampling), got {self.max_draws}")
        if (
            len(self.reward_band) != 2
            or not all(isinstance(x, (int, float)) for x in self.reward_band)
            or not 0 <= self.reward_band[0] <= self.reward_band[1] <= 1
        ):
            raise TrainingError(f"reward_band must be [low, high] with 0 <= low <= high <= 1, got {self.reward_band}")
        if not 0 <= self.min_informative <= 1:
            raise TrainingError(f"min_informative must be in [0, 1], got {self.min_informative}")
        if self.level is not None and self.level < 0:
            raise TrainingError(f"level must be at least 0, got {self.level}")
        if self.calibration_groups is not None and self.calibration_groups < 1:
            raise TrainingError(f"calibration_groups must be at least 1, got {self.calibration_groups}")
        if self.max_steps is not None and self.max_steps < 1:
            raise TrainingError(f"max_steps must be at least 1, got {self.max_steps}")
        return self

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GRPOTrainingConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def resolved_dtype(self, flags: set[str] | None = None) -> str:
        """``dtype`` with ``auto`` decided for ``device``: ``bfloat16`` or ``float32``
        (``flags``: the CPU's feature flags; None reads this machine's)."""
        return resolve_dtype(self.dtype, self.device, flags)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.out) / "checkpoints"

    def to_grpo_args(self) -> Any:
        """TRL's ``GRPOConfig`` for this run: one generation of G x K rollouts and one
        optimizer step per iteration, checkpoints every ``save_every`` iterations."""
        from trl import GRPOConfig

        from .ranks import world_size

        micro = self.micro_batch or self.rollouts_per_group
        steps = self.rollouts_per_iteration // (micro * world_size())  # under a launcher, each rank its share
        cpu = self.device == "cpu"
        return GRPOConfig(
            output_dir=str(self.checkpoint_dir),
            max_steps=self.iterations,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=steps,
            steps_per_generation=steps,
            num_generations=self.rollouts_per_group,
            num_iterations=1,
            learning_rate=self.learning_rate,
            lr_scheduler_type="constant",
            optim="adamw_torch",
            beta=self.kl_beta,
            epsilon=self.clip_epsilon,
            loss_type=self.loss_type,
            scale_rewards="group",
            temperature=self.temperature,
            max_completion_length=self.max_new_tokens,
            **checkpointing(GRPOConfig, self.gradient_checkpointing),
            use_cpu=cpu,
            bf16=not cpu and self.resolved_dtype() == "bfloat16",
            fp16=False,
            use_vllm=self.use_vllm,
            seed=self.seed,
            data_seed=self.seed,
            logging_steps=1,
            save_strategy="steps",
            save_steps=self.save_every,
            save_total_limit=self.keep_checkpoints,
            report_to=[],
            disable_tqdm=True,
            remove_unused_columns=False,
            dataloader_num_workers=0,
            log_completions=False,
        )


@dataclass
class SFTTrainingConfig:
    """One LoRA warm start on demonstrations."""

    trajectories: list[str]
    """Trajectory files (JSONL, as ``trace-gym rollout`` writes them)."""
    out: str
    """Run folder: ``adapter/``, ``model/`` (merged), ``sft_log.jsonl``, ``run.json``."""
    model: str = "smollm2-135m-instruct"
    """The policy to warm-start: the embedded model's name or ``hf:<local folder>``."""
    min_reward: float = 1.0
    """Only episodes with at least this reward are learnt from (1.0: successes only)."""
    epochs: int = 4
    """Passes over the demonstrations (ours: what the shipped warm start used)."""
    learning_rate: float = 3e-4
    """AdamW learning rate, constant after a short warm-up (ours: a usual LoRA SFT rate, 30x GRPO's)."""
    batch_size: int = 8
    """Demonstrations per optimizer step."""
    micro_batch: int = 2
    """Demonstrations per forward/backward pass, all of one prompt (``SharedPromptSampler``); divides
    ``batch_size``. Ours: 2, what the shipped warm start used (its memory: its README)."""
    lora_rank: int = 16
    """LoRA rank of the warm start (ours: 16, on attention and MLP)."""
    lora_alpha: int = 32
    """LoRA scaling alpha (2 x rank)."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Modules that get an adapter: attention and MLP (a new output format is more than attention's job)."""
    prefix_gradient: bool = False
    """Back-propagate through the system prompt the demonstrations share. Off (ours): that prompt's
    keys and values are computed with the current weights but without gradients, a stop-gradient that
    makes a step cost its agent turns, not the 5k-token τ² prompt again with gradients."""
    context_gradient: bool = True
    """Back-propagate through the tokens the agent reads (tool results, user turns) as well as
    through its own. False: each demonstration runs turn by turn, its context without gradients
    and only the positions that predict an agent token with them (``detached_context_logps``),
    and each shared prompt once per optimizer step: the same forward, a stop-gradient on every
    context token like ``prefix_gradient``'s on the prompt, for about a forward pass a step."""
    max_tokens: int | None = None
    """Tokens per demonstration; a longer one is cut after its last agent turn that fits. None: the
    model's context size."""
    whole_only: bool = False
    """Only demonstrations that fit whole in ``max_tokens``. False: a longer one is cut after its last
    agent turn that fits, which teaches the reads it opens with and not the writes they lead to."""
    dtype: str = "auto"
    """Weights during training: ``auto`` (bfloat16 on CUDA and CPUs with bf16 instructions), ``float32``
    or ``bfloat16``; the LoRA and the merged model are float32 either way."""
    device: str = "cpu"
    """``cpu`` or ``cuda``."""
    seed: int = 0
    """Seeds the data order and the LoRA initialisation."""
    torch_threads: int | None = None
    """CPU threads of torch; None keeps torch's choice."""
    save_steps: int = 5
    """Optimizer steps between checkpoints (LoRA, optimizer and data position; the last one is
    kept): ``resume`` goes on from the newest."""
    resume: bool = False
    """Go on from the newest checkpoint in ``out`` (a run with the same config that stopped)."""

    def check(self) -> "SFTTrainingConfig":
        if not self.trajectories:
            raise TrainingError("sft needs at least one --trajectories file")
        for name in ("epochs", "batch_size", "micro_batch", "lora_rank", "save_steps"):
            if getattr(self, name) < 1:
                raise TrainingError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.batch_size % self.micro_batch:
            raise TrainingError(f"micro_batch ({self.micro_batch}) must divide batch_size ({self.batch_size})")
        if self.learning_rate <= 0:
            raise TrainingError("learning_rate must be positive")
        if self.prefix_gradient and not self.context_gradient:
            raise TrainingError("prefix_gradient needs context_gradient: without it no context token has gradients")
        check_placement(self.device, self.dtype)
        if self.max_tokens is not None and self.max_tokens < 16:
            raise TrainingError(f"max_tokens must be at least 16, got {self.max_tokens}")
        return self

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved_dtype(self) -> str:
        return resolve_dtype(self.dtype, self.device)


def checkpointing(config_class: type, on: bool) -> dict[str, Any]:
    """The arguments of a TRL config that turn activation checkpointing ``on`` or off,
    non-reentrant (the shared-prefix update needs it): transformers' current names
    where the installed version has them, its older ones (which 5.x warns about at
    every run) where it does not."""
    names = {f.name for f in dataclasses.fields(config_class)}
    prefix = "activation" if "activation_checkpointing" in names else "gradient"
    return {f"{prefix}_checkpointing": on, f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}}


def check_placement(device: str, dtype: str) -> None:
    """Refuses, in one line, a device or weights dtype a training run cannot use."""
    if device not in ("cpu", "cuda"):
        raise TrainingError(f"device must be cpu or cuda, got {device!r}")
    if dtype not in DTYPES:
        raise TrainingError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
