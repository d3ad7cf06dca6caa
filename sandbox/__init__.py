"""Run untrusted environment code (installed as ``trace_gym.sandbox``).

Layers, each enough to stop most hostile code on its own (see README.md):
1. ``gate``: static checks before anything runs: RestrictedPython's compile
   plus what it does not cover (imports, dunder strings, introspection prefixes);
2. ``language``: the env compiled again by RestrictedPython inside the jail and
   run with guarded attribute access, guarded writes and module proxies;
3. ``worker``: rlimits and a seccomp allowlist, checked by the host;
4. a jail: Docker (``--network none``, read-only root, capped tmpfs, no IPC,
   cgroup limits, no capabilities, user 65534; settings read back and checked;
   gVisor where the engine has it) or bubblewrap (all namespaces unshared,
   read-only minimal root, minimal /dev, /proc/sys hidden, started as uid 65534
   when the host is root), chosen by ``select_backend``.
The host checks every reply (``host.check_reply``) before using it.

Synthesized env code never runs in the host process.
"""

from .backends import Backend, BwrapBackend, DockerBackend, Limits, SubprocessBackend, select_backend
from .errors import (
    Layer,
    SandboxCrashed,
    SandboxEnvError,
    SandboxError,
    SandboxFlood,
    SandboxProtocolError,
    SandboxTimeout,
    SandboxUnavailable,
    SandboxViolation,
)
from .gate import check_source, enforce
from .host import SandboxWorker

__all__ = [
    "Backend",
    "BwrapBackend",
    "DockerBackend",
    "Layer",
    "Limits",
    "SubprocessBackend",
    "select_backend",
    "SandboxCrashed",
    "SandboxEnvError",
    "SandboxError",
    "SandboxFlood",
    "SandboxProtocolError",
    "SandboxTimeout",
    "SandboxUnavailable",
    "SandboxViolation",
    "check_source",
    "enforce",
    "SandboxWorker",
]
