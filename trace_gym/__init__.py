"""trace-gym: TRACE's capability-targeted training environments for tool-using agents.

Importing this package registers every environment of the registry with
Gymnasium (string entry points only: no tau2, litellm or torch is imported
until an env is made)::

    import gymnasium as gym
    import trace_gym
    env = gym.make("trace/tau2-retail-v0")

Without the import, ``gym.make("trace_gym:trace/tau2-retail-v0")`` works too.
"""

from __future__ import annotations

from .registry import register_all as _register_all

__version__ = "0.1.0"
__all__ = ["__version__", "make"]

_register_all()


def make(env_id: str, **kwargs):
    """``gymnasium.make`` with a one-line error for an unknown id."""
    from .registry import make as _make

    return _make(env_id, **kwargs)
