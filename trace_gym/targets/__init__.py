"""Targets: trusted adapters over real benchmarks, presented as trace-gym text envs."""

from __future__ import annotations

from enum import StrEnum


class UserKind(StrEnum):
    """Who plays a target's user: the benchmark's scripted turns or an LLM simulator."""

    SCRIPTED = "scripted"
    LLM = "llm"


def user_kind(user: str) -> UserKind:
    """``user`` as a ``UserKind``; a ValueError names the choices."""
    try:
        return UserKind(user)
    except ValueError:
        raise ValueError(f"user must be one of {', '.join(map(repr, map(str, UserKind)))}, got {user!r}") from None
