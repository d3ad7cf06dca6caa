"""Typed errors of trace-gym.

Every error a user can cause by a mistake (a bad id, a bad path, an unreachable
endpoint) is a ``TraceGymError``: the CLI prints its message on one line and
exits with status 2, never a traceback. A message says what was wrong and what
to do about it. Bugs in trace-gym itself stay ordinary exceptions.
"""

from __future__ import annotations


class TraceGymError(Exception):
    """Base class for errors caused by input the user can fix."""


class UnknownEnvError(TraceGymError, KeyError):
    """An environment id that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownTaskError(TraceGymError, KeyError):
    """A task id that the target does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ManifestError(TraceGymError):
    """An env_registry manifest.toml that is missing, unparsable or incomplete."""


class TargetUnavailableError(TraceGymError):
    """A target whose benchmark package is not installed."""


class UserSimulatorError(TraceGymError):
    """The user simulator could not answer (unreachable endpoint, bad key, ...)."""


class TrajectoryStoreError(TraceGymError):
    """A trajectory file that cannot be written, or that is not ours to append to."""


class OtherRunError(TrajectoryStoreError):
    """A trajectory file made by a run with other settings, resumed as if it were this one's."""


class AgentGaveUp(TraceGymError):
    """An agent that cannot go on (its model's output never parsed as an action, or its
    prompt would pass the model's context): the episode ends there, truncated, and the
    env scores what was done (``TextEnv.end``); not a crash of the run."""


class EpisodeStateError(TraceGymError):
    """An env used out of order (step before reset)."""


class EnvContractError(TraceGymError):
    """A synthesized env broke the contract (a reward out of range, a tool the target lacks, ...)."""


class TargetContractError(TraceGymError):
    """A target of the user's own broke the contract of docs/targets.md (a reward outside
    [0, 1], no tool schemas in ``info``, an observation that is not text): the run stops."""
