"""Which dtype a model's weights run in: the one rule training and the local engine share.

``auto`` is bfloat16 on CUDA and on a CPU that multiplies bf16 matrices in hardware
(AVX512-BF16 or AMX on x86, BF16 on Arm), float32 elsewhere, where bf16 products are
emulated and slower than float32. No torch import: a config check can use it.

The local engine (``LocalHF``) reads ``TRACE_GYM_DTYPE`` where it is given no dtype: a
CPU run in bfloat16 is about 1.4 times as fast as in float32 (docs/benchmarks.md), but
a row's tokens then depend on the rows batched with it; float32 keeps them equal."""

from __future__ import annotations

import os
from pathlib import Path

from .base import LLMError

DTYPES = ("auto", "float32", "bfloat16")
DTYPE_ENV = "TRACE_GYM_DTYPE"

BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 AVX512-BF16 and AMX; Arm's BF16 extension


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (``flags`` on
    x86, ``Features`` on Arm); empty where there is no such file."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return set()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def resolve_dtype(dtype: str, device: str, flags: set[str] | None = None) -> str:
    """``dtype`` with ``auto`` decided: bfloat16 on CUDA and on a CPU with bf16 matrix
    instructions (``flags``: its feature flags; None reads this machine's), else float32
    (another device, such as Apple's ``mps``, too)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device == "cuda" or (device == "cpu" and native_bf16(flags)) else "float32"


def native_bf16(flags: set[str] | None = None) -> bool:
    """True when the CPU multiplies bf16 matrices in hardware (``flags``: its
    feature flags; None reads this machine's)."""
    return bool(BF16_CPU_FLAGS & (cpu_flags() if flags is None else flags))


def recorded_dtype(dtype: str, device: str) -> str | None:
    """What a trajectory file records of a local model's dtype: nothing where it is what
    every version before the choice ran (bfloat16 on ``cuda``, float32 elsewhere, ``cuda:1`` too), so that
    their files still resume; else the dtype, so that no file mixes two."""
    return None if dtype == ("bfloat16" if device == "cuda" else "float32") else dtype


def engine_dtype(dtype: str | None, device: str) -> str:
    """The dtype a local model loaded on ``device`` runs in: ``dtype``, else
    ``TRACE_GYM_DTYPE``, else ``auto``, decided by :func:`resolve_dtype`."""
    given = dtype if dtype is not None else (os.environ.get(DTYPE_ENV, "").strip() or "auto")
    if given not in DTYPES:
        source = "dtype" if dtype is not None else DTYPE_ENV
        raise LLMError(f"{source} must be one of {', '.join(DTYPES)}, got {given!r}")
    return resolve_dtype(given, "cuda" if device.startswith("cuda") else device)


def local_device() -> str:
    """Where a local model loads when no device is named: the GPU if there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
