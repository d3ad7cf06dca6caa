"""Training under a launcher: ``torchrun`` or ``accelerate launch`` (plain DDP).

Each process (rank) holds a copy of the policy and plays its share of an
iteration's G groups; TRL's sampler hands each rank whole groups, the
gradients are averaged across ranks, and one optimizer step follows, as in one
process. What this module adds is what a run must do once and not once per
rank: the training log (the ranks' episodes gathered into one line per
iteration), ``run.json``, ``calibration.json`` and the adapter are written by
rank 0; calibration's episodes are spread over the ranks like training's.

The launcher's own variables say where a process stands (``WORLD_SIZE``,
``RANK``); without one there is one rank and every function here is a no-op.
"""

from __future__ import annotations

import os
from typing import Any

from .config import TrainingError

SHARDED = {
    "ACCELERATE_USE_FSDP": "FSDP",
    "ACCELERATE_USE_DEEPSPEED": "DeepSpeed",
}


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def is_main() -> bool:
    return rank() == 0


def check_launcher(groups: int, rollouts_per_group: int, micro_batch: int) -> None:
    """Refuse, in one line, what cannot train under this launcher: sharded
    training, and G groups that do not split evenly across the ranks."""
    for variable, name in SHARDED.items():
        if os.environ.get(variable, "").lower() in ("1", "true", "yes"):
            raise TrainingError(
                f"trace-gym train does not run under {name}: its ranks play episodes of different lengths, so they "
                "make different numbers of forward passes, which sharded parameters cannot follow; launch plain "
                "DDP (torchrun, or accelerate launch without FSDP or DeepSpeed)"
            )
    size = world_size()
    if size > 1 and groups % size:
        raise TrainingError(
            f"{size} ranks cannot share G = {groups} groups evenly: set --groups to a multiple of {size} "
            "(each rank plays whole groups)"
        )
    if (groups // size * rollouts_per_group) % micro_batch:
        raise TrainingError(
            f"--micro-batch {micro_batch} does not divide a rank's {groups // size} x {rollouts_per_group} episodes"
        )


def start(device: str) -> None:
    """Join the launcher's process group (gloo on CPU) before anything collective;
    TRL's trainer later finds it joined."""
    if world_size() > 1:
        from accelerate import PartialState

        PartialState(cpu=device == "cpu")


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    if world_size() == 1:
        return [value]
    import torch.distributed as dist

    values: list[Any] = [None] * world_size()
    dist.all_gather_object(values, value)
    return values


def share(items: list[Any]) -> list[Any]:
    """This rank's share of ``items``: a contiguous slice, the first ranks one longer."""
    size, me = world_size(), rank()
    per, extra = divmod(len(items), size)
    begin = me * per + min(me, extra)
    return items[begin : begin + per + (me < extra)]


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()
