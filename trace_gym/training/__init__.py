"""Stage 3 of TRACE: one LoRA adapter per capability, trained with GRPO (TRL +
peft) on registry envs; the same command trains the GRPO-on-target and the
merged-adapter baselines at equal rollout budget.

    from trace_gym.training import GRPOTrainingConfig, train
    result = train(GRPOTrainingConfig(env_ids=["trace/tool-precision-v0"], out="runs/tp"))

Needs the ``train`` extra (TRL, datasets, matplotlib) and the ``models`` extra.
Importing this package imports neither.
"""

from .config import GRPOTrainingConfig, TrainingError
from .trainer import TrainingResult, build_trainer, run_trainer, train

__all__ = ["GRPOTrainingConfig", "TrainingError", "TrainingResult", "build_trainer", "run_trainer", "train"]
