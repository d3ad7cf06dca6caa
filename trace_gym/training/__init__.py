"""Stage 3 of TRACE: one LoRA adapter per capability, trained with GRPO (TRL +
peft) on registry envs; the same command trains the GRPO-on-target and the
merged-adapter baselines at equal rollout budget.

    from trace_gym.training import GRPOTrainingConfig, train
    result = train(GRPOTrainingConfig(env_ids=["trace/tool-precision-v0"], out="runs/tp"))

Needs the ``train`` extra (TRL, datasets, matplotlib) and the ``models`` extra.
Importing this package imports neither, nor the trainer's own modules until
one of its names is asked for: the CLI reads its configs (``training.config``)
to build ``--help``, and starts no faster than its imports.
"""

from typing import TYPE_CHECKING, Any

from .config import GRPOTrainingConfig, SFTTrainingConfig, TrainingError

if TYPE_CHECKING:  # what a type checker sees; at run time, __getattr__ below
    from .trainer import TrainingResult, build_trainer, run_trainer, train

_TRAINER = ("TrainingResult", "build_trainer", "run_trainer", "train")


def __getattr__(name: str) -> Any:
    if name in _TRAINER:
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TRAINER))


__all__ = [
    "GRPOTrainingConfig",
    "SFTTrainingConfig",
    "TrainingError",
    "TrainingResult",
    "build_trainer",
    "run_trainer",
    "train",
]
