"""Typed sandbox errors. Each says what happened, which layer stopped the env
code (``layer``, ``None`` for the env's own exception) and leaves the host running."""

from enum import StrEnum

from trace_gym.errors import TraceGymError

from .gate import SandboxViolation  # noqa: F401  (re-exported: the static gate's error)


class Layer(StrEnum):
    """The sandbox layers that can stop env code once it has passed the static gate."""

    LANGUAGE = "sandbox language layer (RestrictedPython guards)"
    WORKER = "sandbox worker (restricted builtins and module proxies)"
    SECCOMP = "sandbox seccomp filter"
    JAIL = "sandbox jail and limits (the worker was killed)"
    TIME = "sandbox time limit"
    HOST = "sandbox host (a malformed, forged or oversized reply)"


# what the worker reports for a refusal inside the jail (worker.refused_by); anything else is dropped
IN_JAIL_LAYERS = {"language": Layer.LANGUAGE, "worker": Layer.WORKER, "seccomp": Layer.SECCOMP, "limits": Layer.JAIL}


class SandboxError(TraceGymError):
    """The sandboxed env could not answer; the worker is dead unless said otherwise."""

    layer: Layer | None = None


class SandboxUnavailable(SandboxError):
    """No sandbox backend can run here."""


class SandboxTimeout(SandboxError):
    """A call took longer than its time limit (a loop, a sleep); the worker was killed."""

    layer = Layer.TIME


class SandboxCrashed(SandboxError):
    """The worker died (memory limit, a killed process, a refused system call)."""

    layer = Layer.JAIL


class SandboxFlood(SandboxError):
    """The worker sent more than the message size cap; it was killed."""

    layer = Layer.HOST


class SandboxProtocolError(SandboxError):
    """The worker sent something that is not a valid reply (a forged or malformed line)."""

    layer = Layer.HOST


class SandboxEnvError(SandboxError):
    """The env code raised an exception; the worker is still alive.

    ``where`` is the call it raised in (load, reset, step...), ``exception_type``
    and ``message`` what it raised, ``traceback`` the env.py lines of its traceback;
    ``layer`` the layer whose refusal it was, ``None`` for the env's own bug."""

    def __init__(self, text: str, reply: dict | None = None):
        super().__init__(text)
        reply = reply or {}
        exception = reply.get("exception") or {}
        self.where = reply.get("where")
        self.exception_type = exception.get("type", "")
        self.message = exception.get("message", "")
        self.traceback = reply.get("traceback") or ""
        self.layer = IN_JAIL_LAYERS.get(exception.get("layer"))
