"""Sandbox backends: Docker, bubblewrap, and (only when named) a plain subprocess.

``select_backend("auto")`` picks Docker if an engine answers, else bubblewrap
if it can create namespaces here, else refuses and says how to get either.
Both real backends run the same worker in the same root filesystem
(``rootfs.py``), as user 65534 *outside* the jail as well as inside (when the
host is root, bubblewrap itself is started as 65534, so the jail's user
namespace maps to an unprivileged outer uid), with no network, a clean
environment, a read-only root, a minimal /dev, /proc/sys read-only or hidden
and a small tmpfs /tmp; the worker adds rlimits and a seccomp allowlist, and
the host refuses a worker that reports seccomp inactive unless a weaker
backend (``bwrap-no-seccomp``, ``docker-no-seccomp``) is named explicitly.
Docker's settings are read back from the created container and checked, and
gVisor (``runsc``) is used where the engine has it.
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
from .rootfs import DEVICES, SANDBOX_UID, WORKER_IN_ROOTFS, ensure_rootfs, interpreter, rootfs_key, rootfs_tarball

SECCOMP_OPTIONAL = "-no-seccomp"
RUNTIME_ENV = "TRACE_GYM_DOCKER_RUNTIME"

IMAGE_REPOSITORY = "trace-gym-sandbox"
# -s -P rather than -I: the jail's environment is cleared and holds only WORKER_ENV, which
# must be honoured (-I would ignore PYTHONHASHSEED); no user site, no script folder on sys.path.
WORKER_ARGS = ("-s", "-P", "-S", "-B", WORKER_IN_ROOTFS)
# One string-hash seed for every worker: an env that iterates a set of strings must replay
# identically in two workers (the determinism check, and GRPO's K rollouts of one seed).
WORKER_ENV = {"PYTHONHASHSEED": "0"}


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
    require_seccomp = True
    """Refuse a worker whose seccomp filter is not active (the ``-no-seccomp`` names turn it off)."""

    def describe(self) -> str:
        return self.name

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
            "--ro-bind",
            str(self.rootfs),
            "/",
            *bwrap_proc_and_dev(),
            "--size",
            str(limits.tmpfs_mb * 1024 * 1024),
            "--tmpfs",
            "/tmp",
            "--unshare-all",  # user, ipc, pid, net, uts, cgroup namespaces: no network at all
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
            *[arg for key, value in WORKER_ENV.items() for arg in ("--setenv", key, value)],
            "--chdir",
            "/tmp",
            str(interpreter()),
            *python_args,
        ]

    def spawn(self, limits: Limits, python_args: tuple[str, ...] = WORKER_ARGS) -> Channel:
        return PipeChannel(self.argv(limits, python_args), limits.max_message_bytes + 1024, env={}, user=outer_user())


# /proc parts that reach the kernel: hidden under an empty read-only tmpfs (folders)
# or /dev/null (files). bubblewrap already binds some read-only; this is checked by
# the jail probe, not assumed.
PROC_HIDDEN_DIRS = ("sys", "irq", "bus", "fs", "sysvipc", "tty", "driver", "acpi", "scsi")
PROC_HIDDEN_FILES = (
    "sysrq-trigger",
    "kcore",
    "keys",
    "key-users",
    "kallsyms",
    "timer_list",
    "latency_stats",
    "sched_debug",
    "kmsg",
)


def bwrap_proc_and_dev() -> list[str]:
    """A fresh /proc with the kernel-facing parts hidden read-only, and a /dev of
    four device nodes bound over placeholders in the read-only root (no tmpfs)."""
    args = ["--proc", "/proc"]
    for name in PROC_HIDDEN_DIRS:
        if os.path.isdir(f"/proc/{name}"):
            args += ["--perms", "0555", "--size", "4096", "--tmpfs", f"/proc/{name}", "--remount-ro", f"/proc/{name}"]
    for name in PROC_HIDDEN_FILES:
        if os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    for device in DEVICES:
        args += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
    return args


def outer_user() -> int | None:
    """The uid bubblewrap runs as: never root. A root host drops to the sandbox user
    first, so the jail's user namespace maps to an unprivileged outer uid."""
    return SANDBOX_UID if os.geteuid() == 0 else None


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, client=None, image: str | None = None):
        self.client = client or docker_client()
        # An image built from sandbox/Dockerfile runs its own python3; the imported one keeps host paths.
        self.image = image or os.environ.get("TRACE_GYM_SANDBOX_IMAGE") or ensure_image(self.client)
        self.python = "python3" if image or os.environ.get("TRACE_GYM_SANDBOX_IMAGE") else str(interpreter())
        self.runtime = gvisor_runtime(self.client)

    def describe(self) -> str:
        return f"{self.name} (runtime {self.runtime or 'runc'})"

    def spawn(self, limits: Limits, python_args: tuple[str, ...] = WORKER_ARGS) -> Channel:
        from docker.errors import DockerException

        container = None
        try:
            container = self._create(limits, python_args)
            check_container(container.attrs, limits)
            sock = self.client.api.attach_socket(
                container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            raw = getattr(sock, "_sock", sock)
            container.start()
        except (DockerException, SandboxUnavailable) as exc:
            if container is not None:
                try:
                    container.remove(force=True)
                except DockerException:
                    pass
            if isinstance(exc, SandboxUnavailable):
                raise
            hint = f"; the engine's gVisor runtime failed: set {RUNTIME_ENV}=runc to use runc" if self.runtime else ""
            raise SandboxUnavailable(
                f"the Docker engine could not start a sandbox container ({str(exc).splitlines()[0][:300]}){hint}"
            ) from None
        return DockerChannel(container, raw, limits.max_message_bytes + 1024, holders=[sock])

    def _create(self, limits: Limits, python_args: tuple[str, ...]):
        extra = {"runtime": self.runtime} if self.runtime else {}
        return self.client.containers.create(
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
            environment=dict(WORKER_ENV),
            labels={"trace-gym": "sandbox"},
            ipc_mode="none",  # no /dev/shm: the capped /tmp is the only writable place
            **extra,
        )


def check_container(attrs: dict, limits: Limits) -> None:
    """Read the created container's settings back: what Docker was asked is what it does."""
    host = attrs.get("HostConfig", {}) or {}
    config = attrs.get("Config", {}) or {}
    user = str(config.get("User", ""))
    tmpfs = host.get("Tmpfs") or {}
    problems = []
    if not user or user.split(":")[0] in ("", "0", "root"):
        problems.append(f"user is {user or 'unset (root)'}")
    if not host.get("ReadonlyRootfs"):
        problems.append("the root filesystem is writable")
    if host.get("Privileged"):
        problems.append("the container is privileged")
    if host.get("NetworkMode") != "none":
        problems.append(f"network mode {host.get('NetworkMode')}")
    if "ALL" not in (host.get("CapDrop") or []) or host.get("CapAdd"):
        problems.append("capabilities are not all dropped")
    if not any(str(o).startswith("no-new-privileges") for o in host.get("SecurityOpt") or []):
        problems.append("no-new-privileges is off")
    if set(tmpfs) != {"/tmp"} or f"size={limits.tmpfs_mb}m" not in tmpfs.get("/tmp", ""):
        problems.append(f"tmpfs mounts are not capped as asked ({tmpfs})")
    if host.get("IpcMode") != "none":
        problems.append(f"IPC mode {host.get('IpcMode')} (a writable /dev/shm)")
    if not {"/proc/sys", "/proc/sysrq-trigger"} <= set(host.get("ReadonlyPaths") or []):
        problems.append("/proc/sys is not read-only")
    if "/proc/kcore" not in (host.get("MaskedPaths") or []):
        problems.append("/proc/kcore is not masked")
    if problems:
        raise SandboxUnavailable("the Docker engine did not apply the sandbox settings: " + "; ".join(problems))


def gvisor_runtime(client) -> str | None:
    """'runsc' when the engine has gVisor's runtime (Debian package ``runsc``), else None;
    ``$TRACE_GYM_DOCKER_RUNTIME`` (runsc or runc) overrides the choice."""
    chosen = os.environ.get(RUNTIME_ENV, "auto")
    if chosen == "runc":
        return None
    try:
        runtimes = client.info().get("Runtimes") or {}
    except Exception:  # an engine that cannot say: plain runc
        return None
    if chosen == "runsc" and "runsc" not in runtimes:
        raise SandboxUnavailable(
            f"{RUNTIME_ENV}=runsc, but the Docker engine has no runsc runtime (dockerd --add-runtime runsc=/usr/bin/runsc)"
        )
    return "runsc" if "runsc" in runtimes else None


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
        # The worker and its language layer as the jail has them (RestrictedPython beside them).
        worker = str(ensure_rootfs()) + WORKER_IN_ROOTFS
        args = tuple(worker if a == WORKER_IN_ROOTFS else a for a in python_args)
        return PipeChannel([str(interpreter()), *args], limits.max_message_bytes + 1024, env=dict(WORKER_ENV))


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
    user = outer_user()
    probe = subprocess.run(
        [exe, "--ro-bind", "/", "/", "--unshare-all", "--uid", str(SANDBOX_UID), "--die-with-parent", "true"],
        capture_output=True,
        text=True,
        env={},
        **({"user": user, "group": user, "extra_groups": []} if user is not None else {}),
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()[:200]}"
    return None


def select_backend(name: str = "auto") -> Backend:
    """A backend by name: auto, docker, bwrap, or subprocess (unsafe, explicit only).

    ``docker-no-seccomp`` and ``bwrap-no-seccomp`` are the same jails that accept
    a worker whose seccomp filter is not active (a platform without it); they are
    weaker, so only an explicit name gives them, with a warning each time."""
    name = name or os.environ.get("TRACE_GYM_SANDBOX", "auto")
    if name.endswith(SECCOMP_OPTIONAL) and name != SECCOMP_OPTIONAL:
        backend = select_backend(name.removesuffix(SECCOMP_OPTIONAL))
        warnings.warn(
            f"trace-gym sandbox backend '{name}' accepts workers without seccomp (a weaker sandbox)", stacklevel=2
        )
        backend.require_seccomp = False
        backend.name = name
        return backend
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
        raise SandboxUnavailable(
            f"unknown sandbox backend '{name}'; choose auto, docker, bwrap, subprocess, docker-no-seccomp or bwrap-no-seccomp"
        )
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
