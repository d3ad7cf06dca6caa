"""Build the sandbox's root filesystem from local files (nothing is pulled).

One tree serves both backends, so Docker and bubblewrap show env code the
same world: this interpreter's binary, its standard library (without tests,
GUI, package installers or site-packages), the shared libraries ``ldd``
names, an ``/etc/passwd`` with an unprivileged ``sandbox`` user, the
worker and its language layer's guards (``language.py``; env code arrives
compiled by RestrictedPython on the host, so the jail needs no package beyond
the standard library). ``/dev`` holds empty
placeholders for the few device nodes bubblewrap binds over them (null, zero,
urandom, random), so the jail needs no writable ``/dev``. No host file beyond
those, no secrets, no network configuration. Paths keep their host values so
the interpreter finds its prefix unchanged.

The tree is cached under ``$TRACE_GYM_CACHE`` (default ``~/.cache/trace-gym``)
by a hash of the interpreter, the worker and its guards, built in a
temporary folder and renamed into place so concurrent builders cannot see half
a tree. When the host runs as root the tree lives in ``/var/cache/trace-gym``
(root-owned, world-readable) instead, because bubblewrap is then started as
the unprivileged sandbox user, who must be able to read it (``$TRACE_GYM_CACHE``
does not move it then).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

WORKER_SOURCE = Path(__file__).with_name("worker.py")
LANGUAGE_SOURCE = Path(__file__).with_name("language.py")
WORLD_SOURCE = Path(__file__).with_name("world.py")
WORKER_DIR = "/opt/trace-gym"
WORKER_IN_ROOTFS = f"{WORKER_DIR}/worker.py"
SANDBOX_UID = 65534
DEVICES = ("null", "zero", "urandom", "random")
ROOT_CACHE = Path("/var/cache/trace-gym")
BUILDER_VERSION = "3"
SKIP_STDLIB = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "distutils",
    "pydoc_data",
    "site-packages",
    "venv",
    "unittest",
    "sqlite3",
    "dbm",
    "curses",
    "xmlrpc",
    "wsgiref",
    "http",
    "urllib",
    "email",
    "xml",
    "multiprocessing",
    "asyncio",
    "concurrent",
    "tomllib",
}
SKIP_DYNLOAD = re.compile(r"^_?(tkinter|curses|curses_panel|readline|sqlite3|dbm|gdbm|nis|ssl|hashlib|uuid|lzma|bz2)\b")


def cache_root() -> Path:
    return Path(os.environ.get("TRACE_GYM_CACHE", Path.home() / ".cache" / "trace-gym"))


def sandbox_cache() -> Path:
    """Where root filesystems are kept: readable by the sandbox user when the host is root."""
    if os.geteuid() == 0:
        return ROOT_CACHE / "sandbox"
    return cache_root() / "sandbox"


def interpreter() -> Path:
    """The real binary of the base interpreter (not a venv's shim or symlink)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(sys.base_prefix) / "bin" / version, Path(sys._base_executable)):
        if candidate.exists():
            return candidate.resolve()
    return Path(sys.executable).resolve()


def rootfs_key() -> str:
    digest = hashlib.sha256()
    for part in (
        BUILDER_VERSION,
        sys.version,
        str(interpreter()),
        WORKER_SOURCE.read_text(),
        LANGUAGE_SOURCE.read_text(),
        WORLD_SOURCE.read_text(),
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def ensure_rootfs() -> Path:
    """The cached root filesystem, built on first use (a few seconds)."""
    target = sandbox_cache() / f"rootfs-{rootfs_key()}"
    if target.is_dir():  # only ever appears whole: built aside, then renamed
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        for folder in (target.parent, target.parent.parent):
            folder.chmod(0o755)  # the sandbox user starts bwrap and must reach the tree
    staging = Path(tempfile.mkdtemp(prefix="rootfs-", dir=target.parent))
    try:
        _build(staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            if not target.is_dir():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _build(root: Path) -> None:
    python = interpreter()
    stdlib = Path(sysconfig.get_paths(vars={"installed_base": sys.base_prefix, "base": sys.base_prefix})["stdlib"])
    dynload = stdlib / "lib-dynload"
    _copy_file(python, root)
    for item in sorted(stdlib.iterdir()):
        if item.name in SKIP_STDLIB or item.name == "lib-dynload" or item.name.startswith("config-"):
            continue
        if item.is_file() and item.suffix == ".py":
            _copy_file(item, root)
        elif item.is_dir() and item.name == "__pycache__":
            for pyc in item.glob(f"*.{sys.implementation.cache_tag}.pyc"):
                _copy_file(pyc, root)
        elif item.is_dir() and (item / "__init__.py").exists():
            _copy_tree(item, root)
    libraries = set(_shared_libraries(python))
    for module in sorted(dynload.glob("*.so")):
        if SKIP_DYNLOAD.match(module.name):
            continue
        _copy_file(module, root)
        libraries.update(_shared_libraries(module))
    for lib in sorted(libraries):
        _copy_file(Path(lib), root, follow=True)
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "passwd").write_text(
        f"root:x:0:0::/:/nonexistent\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp:/nonexistent\n"
    )
    (etc / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\n")
    for folder in ("tmp", "proc", "dev", "sys"):
        (root / folder).mkdir(exist_ok=True)
    for device in DEVICES:  # mount points for the devices bubblewrap binds; Docker brings its own /dev
        (root / "dev" / device).touch()
    _copy_file(WORKER_SOURCE, root, dest=WORKER_IN_ROOTFS)
    _copy_file(LANGUAGE_SOURCE, root, dest=f"{WORKER_DIR}/language.py")
    _copy_file(WORLD_SOURCE, root, dest=f"{WORKER_DIR}/world.py")
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    (root / "tmp").chmod(0o1777)  # Docker gives its tmpfs the image's mode, whatever the mount options say


def _shared_libraries(binary: Path) -> list[str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        match = re.search(r"(/\S+)\s+\(0x", line)
        if match:
            libs.append(match.group(1))
    return libs


def _copy_file(src: Path, root: Path, dest: str | None = None, follow: bool = True) -> None:
    target = root / (dest or str(src)).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, target, follow_symlinks=follow)


def _copy_tree(src: Path, root: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        keep_pyc = f".{sys.implementation.cache_tag}.pyc"
        return {
            n for n in names if n in ("test", "tests", "idle_test") or (n.endswith(".pyc") and not n.endswith(keep_pyc))
        }

    shutil.copytree(src, root / str(src).lstrip("/"), ignore=ignore, dirs_exist_ok=True)


def rootfs_tarball(root: Path) -> bytes:
    """The tree as an uncompressed tar owned by root, for ``docker import``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buffer.getvalue()
