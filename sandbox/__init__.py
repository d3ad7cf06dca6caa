"""Run untrusted environment code (installed as ``trace_gym.sandbox``).

Three layers, each enough to stop most hostile code on its own:
1. ``gate``: static AST checks before anything runs (imports, dunders, eval...);
2. ``worker``: restricted builtins, module proxies, rlimits, a seccomp filter;
3. a jail: Docker (``--network none``, read-only root, tmpfs, cgroup limits,
   no capabilities, user 65534) or bubblewrap (all namespaces unshared,
   read-only minimal root, user 65534), chosen by ``select_backend``.

Synthesized env code never runs in the host process.
"""

from .backends import Backend, BwrapBackend, DockerBackend, Limits, SubprocessBackend, select_backend
from .errors import (
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
    "Backend", "BwrapBackend", "DockerBackend", "Limits", "SubprocessBackend", "select_backend",
    "SandboxCrashed", "SandboxEnvError", "SandboxError", "SandboxFlood", "SandboxProtocolError",
    "SandboxTimeout", "SandboxUnavailable", "SandboxViolation", "check_source", "enforce", "SandboxWorker",
]
