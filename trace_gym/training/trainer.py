"""GRPO training of one LoRA adapter on registry envs with TRL, paired with ``config.py``.

``train(config)`` builds TRL's ``GRPOTrainer`` with a peft ``LoraConfig`` (the
KL reference is then the base model with the adapter disabled), feeds it the
env's episodes through ``EnvRolloutFunc`` (``rollouts.py``) and the env's
reward through ``env_reward``, and writes into ``config.out``:

- ``adapter/``: the trained LoRA in PEFT format (``LocalHF(adapters=...)`` loads it);
- ``train_log.jsonl``: one line per iteration (mean reward, share of
  constant-reward groups, KL, loss, rollouts so far, wall time, reward
  components, failed episodes);
- ``reward_curve.png``: mean reward against rollouts;
- ``checkpoints/checkpoint-N``: TRL/transformers checkpoints (adapter,
  optimizer, scheduler, RNG, sampler position); ``resume=True`` continues from
  the last complete one and cuts the log back to it, so no iteration is
  logged twice;
- ``run.json``: the config, checked on resume, and the envs' code hashes (``env_code``).

One iteration = G groups x K rollouts played, one optimizer step. Every
rollout is counted (``rollouts`` in the log), so a run on a target (the
GRPO-on-target baseline), on one capability env, or on a mixture (the merged
baseline) compare at equal budget. What this module must not do: play
episodes itself (``rollouts.py`` and the model layer do) or score them (the env does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trace_gym.errors import UnknownEnvError
from trace_gym.hashing import code_hash, interface_hash
from trace_gym.llm import LLMError
from trace_gym.llm.local import LocalHF
from trace_gym.llm.local.strict_calls import STRICT_ENV, STRICT_VALUES, strict_from_env
from trace_gym.llm.local.lora import without_checkpointing_deprecations
from trace_gym.llm.precision import native_bf16
from trace_gym.llm.registry import is_server, load_local, local_folder, split_spec
from trace_gym.registry import EnvKind, ValidationStatus, get_entry, make, make_train
from trace_gym.sandbox.backends import Limits

from . import ranks
from .calibration import calibrate_env, check_trainable, load_calibrations, save_calibrations
from .config import GRPOTrainingConfig, TrainingError
from .log import TrainLog, plot_reward_curve
from .pool import EnvPool
from .rollouts import EnvRolloutFunc, IterationRecord, env_reward, plan_groups
from .shared_update import trainer_class


# Settings a resumed run must share with the run it continues (iterations may grow).
RESUME_FIXED = (
    "env_ids",
    "model",
    "groups",
    "rollouts_per_group",
    "lora_rank",
    "lora_alpha",
    "lora_target_modules",
    "learning_rate",
    "kl_beta",
    "clip_epsilon",
    "loss_type",
    "hint_share",
    "seed",
    "temperature",
    "max_new_tokens",
)


@dataclass
class TrainingResult:
    out: Path
    adapter: Path
    iterations: int
    rollouts: int
    resumed_from: int
    log: Path
    reward_curve: Path | None
    wall_s: float
    final_mean_reward: float | None


def resolve_model(spec: str) -> tuple[str, str | None]:
    """(local folder, chat template to set) of a policy spec: the embedded name,
    ``hf:<folder>`` or a folder. Training never reaches a hub or a remote server."""
    try:
        return local_folder(spec)
    except LLMError as exc:
        reason = "training updates local weights; " if is_server(spec) else ""
        raise TrainingError(f"cannot train {spec}: {reason}{exc}") from None


def load_policy(spec: str, dtype: str, device: str = "cpu") -> tuple[Any, Any, str]:
    """(model, tokenizer, local folder) of a policy to train, its weights in
    ``dtype``; the tokenizer gets the chat template the policy plays under (the
    spec's choice, ``llm.registry.split_spec``) and a pad token. Training appends
    turn by turn, so a template that re-renders earlier turns is refused."""
    import torch

    path, chat_template = resolve_model(spec)
    try:
        model, tokenizer = load_local(
            path, dtype=getattr(torch, dtype), device=device, chat_template=chat_template, appending=split_spec(spec)[1]
        )
    except LLMError as exc:
        raise TrainingError(f"cannot train {spec}: {exc}") from None
    return model, tokenizer, path


def last_checkpoint(folder: Path) -> Path | None:
    """The newest checkpoint whose trainer state was written (it is written last)."""
    best, best_step = None, -1
    for path in folder.glob("checkpoint-*"):
        try:
            step = int(path.name.split("-", 1)[1])
            state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        except (ValueError, OSError, json.JSONDecodeError):
            continue
        if state.get("global_step") == step and step > best_step and (path / "adapter_model.safetensors").exists():
            best, best_step = path, step
    return best


def _check_run_folder(config: GRPOTrainingConfig, resume: bool) -> str:
    """Refuse a fresh run over an old one, and a resume with other settings;
    returns the dtype the run trains in: what ``auto`` resolves to here, or on
    resume the one ``run.json`` records (``auto`` continues in it whatever this
    machine would pick; another explicit dtype is refused)."""
    out = Path(config.out)
    run_file = out / "run.json"
    if not resume:
        if run_file.exists() or (out / "train_log.jsonl").exists():
            raise TrainingError(
                f"{out} already holds a training run; pass --resume to continue it, or choose another --out"
            )
        return config.resolved_dtype()
    if not run_file.exists():
        raise TrainingError(f"nothing to resume in {out} (no run.json); start the run without --resume")
    before = json.loads(run_file.read_text(encoding="utf-8"))
    now = config.as_dict()
    changed = [k for k in RESUME_FIXED if before.get(k) != now.get(k)]
    if changed:
        raise TrainingError(
            f"--resume with other settings than the run in {out}: {', '.join(changed)} differ "
            f"(was {', '.join(f'{k}={before.get(k)!r}' for k in changed)})"
        )
    saved, strict = before.get("strict_tools") or False, strict_from_env()
    if saved != strict:
        how = {False: "without strict tool calls", True: "with strict tool calls", "ids": "with grounded ids"}
        raise TrainingError(
            f"--resume with other settings than the run in {out}: its rollouts were decoded "
            f"{how.get(saved, repr(saved))}; set {STRICT_ENV}={STRICT_VALUES.get(saved, saved)} to continue it"
        )
    # (a run.json written before runs recorded their dtype: float32 on CPU, bf16 on CUDA)
    dtype = before.get("dtype") or ("bfloat16" if before.get("device") == "cuda" else "float32")
    if config.dtype not in ("auto", dtype):
        raise TrainingError(
            f"--resume with other settings than the run in {out}: dtype differs (was {dtype!r}); "
            "drop --dtype to continue in it"
        )
    return dtype


def env_code(env_ids: list[str]) -> dict[str, str]:
    """Each env's code as its validation report hashes it: its folder's files and,
    for a synthesized env, its target's frozen interface and the world kit it imports."""
    hashes = {}
    for env_id in env_ids:
        entry = get_entry(env_id)
        digest = code_hash(entry.path)
        if entry.kind != EnvKind.TARGET:
            with contextlib.suppress(UnknownEnvError):
                digest += "+" + interface_hash(get_entry(entry.target).path, entry.path)
        hashes[env_id] = digest
    return hashes


def _env_code_history(config: GRPOTrainingConfig, out: Path, start: int, resume: bool) -> list[dict[str, Any]]:
    """``run.json``'s ``env_code``: the envs' code hashes from the first iteration on,
    and from each resumed iteration where they changed. A resume over changed env code
    goes on (a fix may be why it was stopped) and says so in one line: the iterations
    after it measure other code."""
    now = env_code(config.env_ids)
    history = json.loads((out / "run.json").read_text(encoding="utf-8")).get("env_code", []) if resume else []
    if not history:  # (a run.json written before runs recorded their envs' code: from here on)
        return [{"from_iteration": start + 1, "hashes": now}]
    changed = [env_id for env_id in now if history[-1]["hashes"].get(env_id) != now[env_id]]
    if changed:
        print(
            f"trace-gym: --resume: the code of {', '.join(changed)} changed since iteration "
            f"{history[-1]['from_iteration']}; iterations from {start + 1} train on the new code (run.json records it)",
            file=sys.stderr,
            flush=True,
        )
        history.append({"from_iteration": start + 1, "hashes": now})
    return history


def _check_machine(config: GRPOTrainingConfig) -> None:
    for module, extra in (("trl", "train"), ("peft", "models"), ("datasets", "train")):
        if importlib.util.find_spec(module) is None:
            raise TrainingError(f"training needs {module}: pip install 'trace-gym[{extra}]'")
    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise TrainingError(
                "--device cuda: no CUDA device is available here (this torch build or machine has none); use --device cpu"
            )
    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        raise TrainingError(
            "--use-vllm: vllm is not installed here (pip install vllm on a CUDA machine); drop --use-vllm"
        )
    if config.device == "cpu" and config.dtype == "bfloat16" and not native_bf16():
        print(
            "trace-gym: --dtype bfloat16 on a CPU without bf16 matrix instructions (AVX512-BF16, AMX, Arm BF16): "
            "its products are emulated, slower than float32; --dtype auto picks float32 here",
            file=sys.stderr,
            flush=True,
        )


def _env_plan(
    config: GRPOTrainingConfig,
) -> tuple[dict[str, list[str] | None], dict[str, dict[str, Any]], dict[str, int | None]]:
    """Per env id: its task list (targets) or None (seeded envs), its make() kwargs
    and its number of difficulty levels (None: it has none)."""
    tasks: dict[str, list[str] | None] = {}
    kwargs: dict[str, dict[str, Any]] = {}
    levels: dict[str, int | None] = {}
    for env_id in dict.fromkeys(config.env_ids):
        entry = get_entry(env_id)  # an unknown id is a one-line error here, before any model loads
        if entry.kind == EnvKind.TARGET:
            kwargs[env_id] = {"max_steps": config.max_steps} if config.max_steps else {}
            # training, its calibration and its redraws play the train split, never the held-out one
            env, split = make_train(env_id, **kwargs[env_id])
            if split is not None:
                kwargs[env_id]["split"] = split
            try:
                tasks[env_id] = list(getattr(env.unwrapped, "task_ids", None) or [])
            finally:
                env.close()
            levels[env_id] = None
        else:
            status = entry.validation_status()
            if status != ValidationStatus.PASSED and env_id not in config.train_unvalidated:
                raise TrainingError(
                    f"{env_id} has no passing, current validation report ({status}): run trace-gym "
                    f"validate {entry.path} first, or name it with --train-unvalidated {env_id}"
                )
            kwargs[env_id] = {
                "backend": config.sandbox_backend,
                "max_observation_chars": config.max_observation_chars,
                "limits": Limits(cpu_seconds=config.sandbox_cpu_seconds, call_timeout_s=config.env_call_timeout_s),
            }
            if config.max_steps:
                kwargs[env_id]["max_steps"] = config.max_steps
            tasks[env_id] = None
            env = make(env_id, **kwargs[env_id])
            try:
                levels[env_id] = getattr(env.unwrapped, "levels", None)
            finally:
                env.close()
        if config.level is not None and not levels[env_id]:
            raise TrainingError(f"{env_id} declares no difficulty levels; drop --level")
        if config.level is not None and config.level >= levels[env_id]:
            raise TrainingError(f"{env_id} has levels 0..{levels[env_id] - 1}; --level {config.level} does not exist")
    return tasks, kwargs, levels


def _calibrate(
    config: GRPOTrainingConfig,
    out: Path,
    model: Any,
    tokenizer: Any,
    tasks: dict[str, list[str] | None],
    env_kwargs: dict[str, dict[str, Any]],
    levels: dict[str, int | None],
    resume: bool,
) -> list[Any]:
    """Each env calibrated for the policy (``calibration.py``), or the calibration a
    resumed run made; sets each env's level in ``env_kwargs``; refuses, in one line,
    an env that is untrainable (or uncalibrated) for this policy unless ``train_anyway``."""
    path = out / "calibration.json"
    if not config.calibrate:  # (refused in config.check() unless train_anyway)
        for env_id in env_kwargs:
            if config.level is not None and levels.get(env_id):
                env_kwargs[env_id]["level"] = config.level
        return []
    done = load_calibrations(path) if resume and path.exists() else {}
    backend = None
    calibrations = []
    for env_id in env_kwargs:
        calibration = done.get(env_id)
        if calibration is None:
            backend = backend or LocalHF.from_model(model, tokenizer, max_batch=config.rollouts_per_iteration)

            def play(level: int | None, keys: list[str], env_id: str = env_id) -> list[list[float | None]]:
                kwargs = {**env_kwargs[env_id], **({} if level is None else {"level": level})}
                pool = EnvPool(
                    lambda e: make(e, **kwargs), recycle_after=config.recycle_after, max_episode_s=config.max_episode_s
                )
                try:
                    func = EnvRolloutFunc(
                        dataclasses.replace(config, max_draws=1), pool, tokenizer, tasks, adapter=None
                    )
                    mine = ranks.share(keys)  # under a launcher each rank plays its share, every rank gets all
                    func.play(mine, backend)
                    return [group for part in ranks.gather(func.records[-1].groups) for group in part]
                finally:
                    pool.close()

            calibration = calibrate_env(
                config,
                env_id,
                tasks[env_id],
                levels[env_id],
                play,
                say=lambda m: ranks.is_main() and print(f"trace-gym: {m}", file=sys.stderr, flush=True),
            )
        calibrations.append(calibration)
        if ranks.is_main():
            save_calibrations(path, calibrations)
        check_trainable(calibration, config)
        if calibration.level is not None:
            env_kwargs[env_id]["level"] = calibration.level
    return calibrations


class _IterationLog:
    """TRL callback: one ``train_log.jsonl`` line per optimizer step (= iteration), a progress bar."""

    def __init__(
        self,
        config: GRPOTrainingConfig,
        rollout: EnvRolloutFunc,
        log: TrainLog,
        start: int,
        previous: list[dict[str, Any]],
        progress: bool | None,
        calibration_episodes: int = 0,
        levels: dict[str, int | None] | None = None,
    ):
        from tqdm.auto import tqdm

        self.calibration_episodes = calibration_episodes
        self.levels = levels or {}
        self.config = config
        self.rollout = rollout
        self.log = log
        self.episodes_played = previous[-1].get("episodes_played", 0) if previous else 0  # a running total
        self.elapsed = previous[-1]["elapsed_s"] if previous else 0.0
        self.t_last = time.perf_counter()
        self.bar = tqdm(
            total=config.iterations,
            initial=start,
            desc=f"GRPO {','.join(config.env_ids)}",
            unit="it",
            disable=(None if progress is None else not progress) or not ranks.is_main(),
        )

    def callback(self) -> Any:
        from transformers import TrainerCallback

        outer = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                outer.t_last = time.perf_counter()

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    outer.write(state.global_step, logs)

        return Callback()

    def write(self, iteration: int, logs: dict[str, Any]) -> None:
        now = time.perf_counter()
        wall = now - self.t_last
        self.t_last = now
        self.elapsed += wall
        mine = self.rollout.records[-1] if self.rollout.records else IterationRecord()
        parts = ranks.gather((mine, vars(self.rollout.pool.stats)))  # one line for all ranks' episodes
        if not ranks.is_main():
            return
        summary = IterationRecord.merged([record for record, _ in parts]).summary() if self.rollout.records else {}
        pool = {k: sum(stats[k] for _, stats in parts) for k in parts[0][1] if k != "failures"}
        self.episodes_played += summary.get("episodes_played", 0)
        row = {
            "iteration": iteration,
            "mean_reward": summary.get("mean_reward"),
            "constant_reward_groups": summary.get("constant_reward_groups"),
            "kl": logs.get("kl"),
            "loss": logs.get("loss"),
            "grad_norm": logs.get("grad_norm"),
            "rollouts": iteration * self.config.rollouts_per_iteration,
            "episodes_played": self.episodes_played,
            "calibration_episodes": self.calibration_episodes,
            "levels": self.levels,
            "pool": pool,
            "dtype": self.config.dtype,
            "wall_s": round(wall, 3),
            "elapsed_s": round(self.elapsed, 3),
            **{
                k: v
                for k, v in summary.items()
                if k not in ("mean_reward", "constant_reward_groups", "episodes_played")
            },
        }
        self.log.append(row)
        self.bar.update(1)
        if row["mean_reward"] is not None:
            self.bar.set_postfix(reward=f"{row['mean_reward']:.3f}")


def build_trainer(
    config: GRPOTrainingConfig, *, resume: bool = False, progress: bool | None = None
) -> tuple[Any, dict[str, Any]]:
    """TRL's ``GRPOTrainer`` for ``config`` and what ``run_trainer`` needs (pool,
    rollout function, log, checkpoint). Checks everything a user can get wrong
    before loading the model."""
    config.check()
    config = dataclasses.replace(config, dtype=_check_run_folder(config, resume))  # `auto` decided once, here
    _check_machine(config)
    ranks.check_launcher(config.groups, config.rollouts_per_group, config.micro_batch or config.rollouts_per_group)
    tasks, env_kwargs, levels = _env_plan(config)
    resolve_model(config.model)  # a bad model spec is one line here, before the run folder is written

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL; we pin its version
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = last_checkpoint(config.checkpoint_dir) if resume else None
    start = int(checkpoint.name.split("-", 1)[1]) if checkpoint else 0
    log = TrainLog(out / "train_log.jsonl")
    if config.iterations <= start:
        raise TrainingError(
            f"the run in {out} already finished {start} iterations; raise --iterations to train further"
        )
    ranks.start(config.device)
    if ranks.is_main():
        previous = log.truncate_to(start) if resume else []
        record = {**config.as_dict(), "env_code": _env_code_history(config, out, start, resume)}
        if strict_from_env():  # (the policy's LocalHF reads it: strict_calls.py)
            record["strict_tools"] = strict_from_env()
        (out / "run.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    ranks.barrier()
    if not ranks.is_main():
        previous = log.read()

    model, tokenizer, _ = load_policy(config.model, config.dtype)
    calibrations = _calibrate(config, out, model, tokenizer, tasks, env_kwargs, levels, resume)

    pool = EnvPool(
        lambda env_id: make(env_id, **env_kwargs[env_id]),
        recycle_after=config.recycle_after,
        max_episode_s=config.max_episode_s,
    )
    rollout = EnvRolloutFunc(config, pool, tokenizer, tasks)
    iteration_log = _IterationLog(
        config,
        rollout,
        log,
        start,
        previous,
        progress,
        calibration_episodes=sum(c.episodes for c in calibrations),
        levels={e: kw.get("level") for e, kw in env_kwargs.items()},
    )
    dataset = Dataset.from_list([{"prompt": key} for key in plan_groups(config, tasks)])
    args = config.to_grpo_args()
    with without_checkpointing_deprecations():  # (peft enables checkpointing as it wraps the model)
        trainer = trainer_class()(
            model=model,
            reward_funcs=[env_reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=rollout,
            peft_config=LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=list(config.lora_target_modules),
                task_type="CAUSAL_LM",
            ),
            callbacks=[iteration_log.callback()],
        )
    trainer.shared_prefix_update = config.shared_prefix_update
    if config.use_vllm:
        print(
            "trace-gym: --use-vllm: TRL keeps vLLM's weights in sync, but multi-turn episodes are still played by "
            "trace-gym's LocalHF runner on the training weights (vLLM multi-turn generation is not wired in)",
            file=sys.stderr,
            flush=True,
        )
    return trainer, {
        "pool": pool,
        "rollout": rollout,
        "log": log,
        "checkpoint": checkpoint,
        "start": start,
        "iteration_log": iteration_log,
    }


def run_trainer(config: GRPOTrainingConfig, trainer: Any, parts: dict[str, Any]) -> TrainingResult:
    """Train (from the checkpoint, if any), save the adapter and the reward curve."""
    t0 = time.perf_counter()
    out = Path(config.out)
    try:
        checkpoint = parts["checkpoint"]
        with without_checkpointing_deprecations():
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        adapter = out / "adapter"
        if ranks.is_main():
            trainer.model.save_pretrained(str(adapter))
        ranks.barrier()  # every rank returns what rank 0 wrote
    finally:
        parts["pool"].close()
        parts["iteration_log"].bar.close()
    rows = parts["log"].read()
    title = f"{config.model} on {', '.join(config.env_ids)}"
    curve = plot_reward_curve(rows, out / "reward_curve.png", title=title) if ranks.is_main() else None
    last = rows[-1] if rows else {}
    return TrainingResult(
        out=out,
        adapter=adapter,
        iterations=last.get("iteration", 0),
        rollouts=last.get("rollouts", 0),
        resumed_from=parts["start"],
        log=parts["log"].path,
        reward_curve=curve,
        wall_s=time.perf_counter() - t0,
        final_mean_reward=last.get("mean_reward"),
    )


def train(
    config: GRPOTrainingConfig,
    *,
    resume: bool = False,
    progress: bool | None = None,
    on_trainer: Callable[[Any], None] | None = None,
) -> TrainingResult:
    """Train one LoRA adapter with GRPO on ``config.env_ids``; see the module docstring.
    ``on_trainer`` sees the TRL trainer before training starts. The policy's memory is
    given back before it returns, so that the next job of a pipeline starts on a clean
    device (the trainer's parts refer to each other: only a collection frees them)."""
    trainer, parts = build_trainer(config, resume=resume, progress=progress)
    try:
        if on_trainer is not None:
            on_trainer(trainer)
        return run_trainer(config, trainer, parts)
    finally:
        del trainer, parts
        release_memory()


def release_memory() -> None:
    """Collect what no one refers to any more and return the GPU's cached blocks."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
