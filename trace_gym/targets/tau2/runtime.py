"""tau2 as a library in this process: importing it quietly and offline, and pausing
Python's cyclic collector while it builds or scores a domain database."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

from ...errors import TargetUnavailableError


class _CollectorPause:
    """Who is inside ``collector_paused`` now: the collector is process-wide, so
    episodes played in threads share one pause, and the last one out restores it."""

    lock = threading.Lock()
    depth = 0
    resume = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while tau2 builds or scores against
    a domain database. Each build validates one from JSON (~10^5 pydantic objects,
    once per reset and twice per score) and the collections that allocation burst
    sets off more than doubled a retail episode's wall time
    (``benchmarks/tau2_env_cost.py``). Reference counting frees the objects as
    before; a cycle made meanwhile waits for the collector to resume. Threads share
    the pause: it ends when the last of them leaves, with the setting found by the first."""
    with _CollectorPause.lock:
        if _CollectorPause.depth == 0:
            _CollectorPause.resume = gc.isenabled()
            gc.disable()
        _CollectorPause.depth += 1
    try:
        yield
    finally:
        with _CollectorPause.lock:
            _CollectorPause.depth -= 1
            if _CollectorPause.depth == 0 and _CollectorPause.resume:
                gc.enable()


def import_tau2():
    """Import tau2 quietly and offline, or say how to install it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        from loguru import logger

        logger.disable("tau2")  # tau2 logs every tool call at DEBUG to stderr
        import tau2.registry  # noqa: F401
    except ImportError as exc:
        raise TargetUnavailableError(
            f"the τ²-bench targets need the tau2 package ({exc}); install it with: pip install 'trace-gym[tau2]'"
        ) from None
    import tau2

    return tau2
