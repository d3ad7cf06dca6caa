"""Typed sandbox errors. Each says what happened and leaves the host running."""

from trace_gym.errors import TraceGymError

from .gate import SandboxViolation  # noqa: F401  (re-exported: the static gate's error)


class SandboxError(TraceGymError):
    """The sandboxed env could not answer; the worker is dead unless said otherwise."""


class SandboxUnavailable(SandboxError):
    """No sandbox backend can run here."""


class SandboxTimeout(SandboxError):
    """A call took longer than its time limit (a loop, a sleep); the worker was killed."""


class SandboxCrashed(SandboxError):
    """The worker died (memory limit, a killed process, a refused system call)."""


class SandboxFlood(SandboxError):
    """The worker sent more than the message size cap; it was killed."""


class SandboxProtocolError(SandboxError):
    """The worker sent something that is not a valid reply (a forged or malformed line)."""


class SandboxEnvError(SandboxError):
    """The env code raised an exception; the worker is still alive.

    ``where`` is the call it raised in (load, reset, step...), ``exception_type``
    and ``message`` what it raised, ``traceback`` the env.py lines of its traceback."""

    def __init__(self, text: str, reply: dict | None = None):
        super().__init__(text)
        reply = reply or {}
        exception = reply.get("exception") or {}
        self.where = reply.get("where")
        self.exception_type = exception.get("type", "")
        self.message = exception.get("message", "")
        self.traceback = reply.get("traceback") or ""
