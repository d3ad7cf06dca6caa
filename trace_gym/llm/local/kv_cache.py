"""The key/value cache of a local model: entries (the keys and values of a run of
token ids for one adapter, extending a shared prefix entry or not), a store bounded
in bytes (least recently used out first), and how a row's entry is laid into a
batch's decode cache."""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..base import LLMError

DEFAULT_CACHE_BYTES = 4 * 2**30  # on a CPU, where the cache shares memory with everything else
CACHE_ENV = "TRACE_GYM_KV_CACHE_GIB"
GPU_CACHE_SHARE = 0.5  # of the memory a GPU has free once the weights are on it


def cache_budget(device: str, free_bytes: int | None = None) -> int:
    """The cap on a local model's cached keys and values: ``TRACE_GYM_KV_CACHE_GIB`` when
    set; on a GPU whose free memory is given (``free_bytes``, once the weights are loaded:
    a model that plays alone, for rollouts, evaluation or serving), half of it, the rest
    for a batch's decode caches and activations, and at least the CPU's figure; else
    ``DEFAULT_CACHE_BYTES`` (a model being trained shares its device with the optimizer
    and the update, which have not yet taken their memory when rollouts begin). At
    Llama-8B's shapes (128 KiB a token) 4 GiB holds 32k tokens, so evaluation on a GPU
    would re-prefill whole histories."""
    given = os.environ.get(CACHE_ENV, "").strip()
    if given:
        try:
            gib = float(given)
        except ValueError:
            gib = -1.0
        if not (gib > 0 and math.isfinite(gib)):
            raise LLMError(f"{CACHE_ENV} must be a positive number of GiB, got {given!r}")
        return int(gib * 2**30)
    if device.startswith("cuda") and free_bytes is not None:
        return max(DEFAULT_CACHE_BYTES, int(free_bytes * GPU_CACHE_SHARE))
    return DEFAULT_CACHE_BYTES


def own_segments(entry: "KVEntry", in_place: bool, layer: int) -> list[tuple[Any, Any]]:
    """The keys and values of ``entry`` that a row's batch cache holds: with its
    shared prefix attended to in place, only the tokens after it (none for the
    prefix entry itself); otherwise all of them."""
    if not in_place:
        return entry.segments(layer)
    return [] if entry.shared else [entry.layers[layer]]


def write_right_aligned(keys: Any, values: Any, row: int, segments: list[tuple[Any, Any]], end: int) -> None:
    """Copy a row's segments into slots ``..end`` of a batch cache layer (left padding before them)."""
    at = end - sum(k.shape[2] for k, _ in segments)
    for k, v in segments:
        keys[row, :, at : at + k.shape[2]] = k[0]
        values[row, :, at : at + k.shape[2]] = v[0]
        at += k.shape[2]


def in_place_groups(bases: list["KVEntry | None"]) -> dict[str, Any]:
    """The forward's ``shared_prefix`` keyword for rows whose prefix (``bases[i]``,
    None: the row holds all its tokens) is attended to in place, one group per
    prefix; empty when no row has one."""
    if all(base is None for base in bases):
        return {}
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, base in enumerate(bases):
        groups.setdefault(id(base), (base.layers if base is not None else None, []))[1].append(i)
    return {"shared_prefix": [(layers, None if len(groups) == 1 else rows) for layers, rows in groups.values()]}


@dataclass
class KVEntry:
    """Keys and values of ``ids`` for one adapter. ``base`` is a shared prefix
    entry whose tensors hold ``ids[:len(base.ids)]``; ``layers`` hold the rest."""

    ids: list[int]
    adapter: str | None
    layers: list[tuple[Any, Any]]  # per layer (keys, values), each [1, heads, tokens, head_dim]
    base: "KVEntry | None" = None
    shared: bool = False  # a prefix entry that episodes extend
    nbytes: int = field(default=0)

    def __post_init__(self) -> None:
        self.nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def segments(self, layer: int) -> list[tuple[Any, Any]]:
        return [*(self.base.segments(layer) if self.base is not None else []), self.layers[layer]]

    def full(self, layer: int) -> tuple[Any, Any]:
        import torch

        k, v = self.layers[layer]
        if self.base is None:
            return k, v
        bk, bv = self.base.full(layer)
        return torch.cat([bk, k], dim=2), torch.cat([bv, v], dim=2)


class KVStore:
    """Cached keys and values, bounded in bytes; least recently used out first."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple, KVEntry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def get(self, key: tuple) -> KVEntry | None:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key: tuple, entry: KVEntry) -> None:
        self.entries.pop(key, None)
        self.entries[key] = entry
        total = self.nbytes
        while total > self.max_bytes and len(self.entries) > 1:
            _, evicted = self.entries.popitem(last=False)
            total -= evicted.nbytes

    def drop(self, key: tuple) -> None:
        self.entries.pop(key, None)

    def clear(self) -> None:
        self.entries.clear()
