"""The train stage's jobs (one LoRA adapter each, independent of one another): one after
another in this process, or, where several GPUs are visible, one process per GPU at
once. Each such process sees only its GPU (``CUDA_VISIBLE_DEVICES``, set before torch
loads) and trains its share of the jobs in turn; the jobs' folders hold their results,
as a job trained here would leave them, so a killed stage resumes either way."""

from __future__ import annotations

import multiprocessing
import os
import queue as queues
from dataclasses import dataclass
from typing import Any, Callable

from trace_gym.registry import add_registry_dir
from .config import GRPOTrainingConfig, TrainingError


@dataclass
class Job:
    name: str
    run: GRPOTrainingConfig
    resume: bool


@dataclass
class Outcome:
    name: str
    not_trained: str | None = None
    """Why the job left no adapter (untrainable for this policy, an env that turned);
    None: trained."""
    device: str | None = None
    """The GPU it trained on, as ``CUDA_VISIBLE_DEVICES`` names it (None: this process's)."""
    failed: str | None = None
    """An error no run goes on after: the stage stops with it."""


def visible_gpus() -> list[str]:
    """The GPUs this process may use, by the names ``CUDA_VISIBLE_DEVICES`` gives them."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return (listed or [str(i) for i in range(count)])[:count]


def train_jobs(
    jobs: list[Job], devices: list[str], say: Callable[[str], None], registry: list[str] | None = None
) -> dict[str, Outcome]:
    """Train ``jobs``; with two devices or more (and two jobs or more), one process per
    device, job i on device i mod n. ``registry``: folders the processes add to their
    registry (this process's additions are its own). Raises ``TrainingError`` for a job
    that failed, after every process has stopped."""
    if len(devices) < 2 or len(jobs) < 2:
        return {job.name: _train(job, None) for job in jobs}

    context = multiprocessing.get_context("spawn")  # (a forked CUDA runtime cannot be used)
    results: Any = context.Queue()
    shares = {device: jobs[i :: len(devices)] for i, device in enumerate(devices[: len(jobs)])}
    workers = [
        context.Process(
            target=_worker, args=(device, share, registry or [], results)
        )  # (not daemonic: a job may start processes)
        for device, share in shares.items()
    ]
    say(
        "training on "
        + "; ".join(f"GPU {device}: {', '.join(job.name for job in share)}" for device, share in shares.items())
    )
    for worker in workers:
        worker.start()
    outcomes: dict[str, Outcome] = {}
    try:
        while len(outcomes) < len(jobs):
            try:
                outcome = results.get(timeout=5)
            except queues.Empty:
                if any(worker.is_alive() for worker in workers) or not results.empty():
                    continue
                if any(o.failed for o in outcomes.values()):
                    break  # (a process stops at its first failure: its later jobs never ran)
                lost = sorted({job.name for job in jobs} - set(outcomes))
                raise TrainingError(
                    f"the training processes ended without a word on {', '.join(lost)} (killed, e.g. for "
                    "memory?); rerun the stage to resume them"
                ) from None
            outcomes[outcome.name] = outcome
            say(f"{outcome.name}: " + ("trained" if not (outcome.not_trained or outcome.failed) else "not trained"))
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
    failed = [o for o in outcomes.values() if o.failed]
    if failed:
        raise TrainingError(f"{failed[0].name} (GPU {failed[0].device}): {failed[0].failed}")
    return outcomes


def _worker(device: str, jobs: list[Job], registry: list[str], results: Any) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = device  # before torch is imported in this process

    for folder in registry:
        add_registry_dir(folder)
    for job in jobs:
        try:
            results.put(_train(job, os.environ["CUDA_VISIBLE_DEVICES"]))  # (what the process sees)
        except Exception as exc:  # noqa: BLE001 (reported to the stage, which stops with it in one line)
            results.put(Outcome(job.name, device=device, failed=f"{type(exc).__name__}: {exc}"))
            return


def _train(job: Job, device: str | None) -> Outcome:
    # Imported here, not at the top: a spawned worker imports this module before
    # _worker sets CUDA_VISIBLE_DEVICES, so nothing it loads first may load torch.
    from .calibration import UntrainableEnvError
    from .rollouts import EnvTurnedError
    from .trainer import train

    try:
        train(job.run, resume=job.resume)
    except (UntrainableEnvError, EnvTurnedError) as exc:  # the run goes on without this adapter; the report says why
        return Outcome(job.name, not_trained=str(exc), device=device)
    return Outcome(job.name, device=device)
