"""Sandbox backends: Docker, bubblewrap, and (only when named) a plain subprocess.

``select_backend("auto")`` picks Docker if an engine answers, else bubblewrap
if it can create namespaces here, else refuses and says how to get either.
Both real backends run the same worker in the same root filesystem
(``rootfs.py``), as user 65534, with no network, a clean environment, a
read-only root and a small tmpfs /tmp; the worker adds rlimits and seccomp.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import warnings
from dataclasses import dataclass

from .channel import Channel, DockerChannel, PipeChannel
from .errors import SandboxUnavailable
from .rootfs import SANDBOX_UID, WORKER_IN_ROOTFS, WORKER_SOURCE, ensure_rootfs, interpreter, rootfs_key, rootfs_tarball

IMAGE_REPOSITORY = "trace-gym-sandbox"
WORKER_ARGS = ("-I", "-S", "-B", WORKER_IN_ROOTFS)


@dataclass(frozen=True)
class Limits:
    """Resource limits of one worker. Defaults suit a text env; raise them per env if needed."""

    call_timeout_s: float = 10.0
    """Wall-clock limit of one call (reset, step, reward...); the worker is killed past it."""
    start_timeout_s: float = 30.0
    """Wall-clock limit for the worker to load env.py and answer."""
    memory_mb: int = 512
    """Address space (bwrap, rlimit) and memory (docker, cgroup) of the worker."""
    cpu_seconds: int = 120
    """CPU seconds over the worker's whole life (rlimit), a backstop to the call timeout."""
    max_message_bytes: int = 4 * 1024 * 1024
    """Largest reply accepted; a longer one is a flood and the worker is killed."""
    tmpfs_mb: int = 16
    """Size of the writable /tmp."""
    file_size_mb: int = 8
    """Largest file the worker may write (rlimit)."""
    open_files: int = 64
    """Open file descriptors (rlimit)."""
    pids: int = 16
    """Processes and threads (docker pids limit, rlimit)."""
    cpus: float = 1.0
    """CPU share of a docker worker."""

    def rlimits(self) -> dict[str, int]:
        return {
            "address_space": self.memory_mb * 1024 * 1024,
            "cpu_seconds": self.cpu_seconds,
            "file_size": self.file_size_mb * 1024 * 1024,
            "open_files": self.open_files,
            "processes": self.pids,
        }


class Backend:
    name = "abstract"
    isolated = True

    def spawn(self, limits: Limits, python_args: tuple[str, ...] = WORKER_ARGS) -> Channel:
        """Start the jailed interpreter (the worker, unless tests ask for other args)."""
        raise NotImplementedError


class BwrapBackend(Backend):
    name = "bwrap"

    def __init__(self):
        self.rootfs = ensure_rootfs()

    def argv(self, limits: Limits, python_args: tuple[str, ...] = WORKER_ARGS) -> list[str]:
        return [
            shutil.which("bwrap") or "bwrap",
            "--ro-bind", str(self.rootfs), "/",
            "--proc", "/proc",
            "--dev", "/dev",
            "--size", str(limits.tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp",
            "--unshare-all",  # user, ipc, pid, net, uts, cgroup namespaces: no network at all
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
            "--chdir", "/tmp",
            str(interpreter()), *python_args,
        ]

    def spawn(self, limits: Limits, python_args: tuple[str, ...] = WORKER_ARGS) -> Channel:
        return PipeChannel(self.argv(limits, python_args), limits.max_message_bytes + 1024, env={})


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, client=None, image: str | None = None):
        self.client = client or docker_client()
        # An image built from sandbox/Dockerfile runs its own python3; the imported one keeps host paths.
        self.image = image or os.environ.get("TRACE_GYM_SANDBOX_IMAGE") or ensure_image(self.client)
        self.python = "python3" if image or os.environ.get("TRACE_GYM_SANDBOX_IMAGE") else str(interpreter())

    def spawn(self, limits: Limits, python_args: tuple[str, ...] = WORKER_ARGS) -> Channel:
        container = self.client.containers.create(
            self.image,
            command=[self.python, *python_args],
            stdin_open=True,
            tty=False,
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"size={limits.tmpfs_mb}m,mode=1777,noexec,nosuid,nodev"},
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            security_opt=["no-new-privileges"],
            cap_drop=["ALL"],
            user=f"{SANDBOX_UID}:{SANDBOX_UID}",
            working_dir="/tmp",
            environment={},
            labels={"trace-gym": "sandbox"},
        )
        sock = self.client.api.attach_socket(
            container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        )
        raw = getattr(sock, "_sock", sock)
        container.start()
        return DockerChannel(container, raw, limits.max_message_bytes + 1024)


class SubprocessBackend(Backend):
    """The worker as a plain child process: the static gate, restricted builtins
    and seccomp still apply, but no namespaces: it can read what the user can."""

    name = "subprocess"
    isolated = False

    def __init__(self):
        warnings.warn(
            "trace-gym sandbox backend 'subprocess' runs env code without an OS jail "
            "(no namespaces, the host's files are readable); use it only for code you trust",
            stacklevel=3,
        )

    def spawn(self, limits: Limits, python_args: tuple[str, ...] = WORKER_ARGS) -> Channel:
        args = tuple(str(WORKER_SOURCE) if a == WORKER_IN_ROOTFS else a for a in python_args)
        return PipeChannel([str(interpreter()), *args], limits.max_message_bytes + 1024, env={})


def docker_client():
    try:
        import docker
    except ImportError:
        raise SandboxUnavailable("the docker backend needs the docker SDK: pip install 'trace-gym[sandbox]'") from None
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:  # the SDK raises several types for "no engine"
        raise SandboxUnavailable(f"no Docker engine answers ({str(exc).splitlines()[0][:200]})") from None
    return client


def ensure_image(client) -> str:
    """The sandbox image, imported from the local root filesystem if missing.

    Where a registry is reachable, ``sandbox/Dockerfile`` builds an equivalent
    image; here nothing can be pulled, so the image is ``docker import``ed
    from the same tree bubblewrap uses.
    """
    tag = rootfs_key()
    name = f"{IMAGE_REPOSITORY}:{tag}"
    try:
        client.images.get(name)
        return name
    except Exception:
        pass
    data = rootfs_tarball(ensure_rootfs())
    client.api.import_image_from_data(data, repository=IMAGE_REPOSITORY, tag=tag)
    return name


@functools.lru_cache(maxsize=1)
def bwrap_works() -> str | None:
    """None if bubblewrap can build a jail here, else why not."""
    exe = shutil.which("bwrap")
    if not exe:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = subprocess.run(
        [exe, "--ro-bind", "/", "/", "--unshare-all", "--uid", str(SANDBOX_UID), "--die-with-parent", "true"],
        capture_output=True, text=True, env={},
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()[:200]}"
    return None


def select_backend(name: str = "auto") -> Backend:
    """A backend by name: auto, docker, bwrap, or subprocess (unsafe, explicit only)."""
    name = name or os.environ.get("TRACE_GYM_SANDBOX", "auto")
    if name == "docker":
        return DockerBackend()
    if name == "bwrap":
        problem = bwrap_works()
        if problem:
            raise SandboxUnavailable(problem)
        return BwrapBackend()
    if name == "subprocess":
        return SubprocessBackend()
    if name != "auto":
        raise SandboxUnavailable(f"unknown sandbox backend '{name}'; choose auto, docker, bwrap or subprocess")
    reasons = []
    try:
        return DockerBackend()
    except SandboxUnavailable as exc:
        reasons.append(f"docker: {exc}")
    problem = bwrap_works()
    if problem is None:
        return BwrapBackend()
    reasons.append(f"bwrap: {problem}")
    raise SandboxUnavailable(
        "no sandbox can run untrusted env code here ("
        + "; ".join(reasons)
        + "). Start a Docker engine or install bubblewrap; or, for code you trust, pass backend='subprocess'."
    )
