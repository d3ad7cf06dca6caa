"""The in-sandbox worker: runs one untrusted env.py and answers JSON lines.

Runs inside the jail (Docker or bubblewrap) as ``python -I -S worker.py``.
Order matters: read the init message, set rlimits, import the language layer
(``language.py``, beside this file) and the allowlisted modules, install the
seccomp allowlist (no sockets, no exec, no fork from here on), then run env.py
as the host compiled it with RestrictedPython (a marshalled code object: every
attribute access in it calls the guards) with the guards, restricted builtins
and module proxies. The env code's prints go to a capped
buffer; protocol lines go to a private copy of stdout, each prefixed with a
per-session token that only the sender's closure holds (env code cannot reach
frames, closures or globals of the worker: the language layer refuses every
way there), so a print cannot forge a reply. An exception of env code is
answered as data (type, message, the env.py lines of its traceback).

This file must not import anything outside the standard library and the
language layer beside it, and must never compile env source itself.
"""

import base64
import ctypes
import io
import json
import marshal
import os
import resource
import struct
import sys
import traceback

WORKER_DIR = os.path.dirname(os.path.abspath(__file__))
MAX_PRINT = 64 * 1024
MAX_TEXT = 2000


def main():
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)  # C-level writes to stdout vanish
    init = json.loads(sys.stdin.readline())
    send = make_sender(proto, init.pop("token"))
    del proto  # from here on only the sender's closure holds the channel and the token

    set_limits(init.get("limits", {}))
    sys.path.insert(0, WORKER_DIR)
    import language  # the guards, imported before seccomp

    modules = {name: __import__(name, fromlist=["_"]) for name in language.ALLOWED_MODULES}
    language.guard_stdlib(modules)  # the jail's own stdlib: enum's functional API checked
    # no lookup by name through sys.modules (inspect's signature parser does one) finds the worker's state
    sys.modules.pop("language", None)
    sys.modules.pop("__main__", None)
    seccomp_status = install_seccomp() if init.get("seccomp", True) else "off"
    printed = CappedText(MAX_PRINT)
    sys.stdout = printed

    try:
        if init.get("python") != list(sys.version_info[:2]):
            raise RuntimeError(
                "the host compiled env.py for Python %s; this jail runs %s" % (init.get("python"), sys.version_info[:2])
            )
        code = marshal.loads(base64.b64decode(init.pop("code")))  # RestrictedPython's output, from the host
        namespace = language.env_globals(modules, printed)
        exec(code, namespace)
        cls = namespace.get("Environment")
        if not isinstance(cls, type):
            raise TypeError("env.py defines no class Environment")
        env = cls()
        tools = namespace.get("TOOLS")
        max_steps = getattr(env, "max_steps", None)
        levels = namespace.get("LEVELS")
        info = {
            "ok": True,
            "tools": [str(t) for t in tools] if isinstance(tools, (list, tuple)) else None,
            "max_steps": max_steps if type(max_steps) is int else None,
            "levels": levels if type(levels) is int and 2 <= levels <= 10 else None,
            "has_oracle": callable(getattr(env, "oracle", None)),
            "seccomp": seccomp_status,
            "uid": os.getuid(),
            "proc_sys_writable": os.access("/proc/sys/kernel/core_pattern", os.W_OK),
        }
    except BaseException as exc:  # noqa: BLE001 - every failure of env code is reported, never fatal here
        send(failure(exc, "load", printed, language))
        return
    send(info)

    for line in sys.stdin:
        op = None
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "reset":
                if request.get("level") is None:
                    result = env.reset(int(request["seed"]), bool(request.get("hint", False)))
                else:  # only for an env that declares LEVELS (checked by the host)
                    result = env.reset(int(request["seed"]), bool(request.get("hint", False)), int(request["level"]))
            elif op == "step":
                result = env.step(request["action"])
            elif op == "reward":
                result = env.reward()
            elif op == "oracle":
                result = env.oracle()
            elif op == "ping":
                result = "pong"
            else:
                raise ValueError("unknown op " + repr(op))
            reply = {"ok": True, "result": to_json(result)}
        except BaseException as exc:  # noqa: BLE001
            reply = failure(exc, str(op), printed, language)
        try:
            send(reply)
        except BaseException as exc:  # noqa: BLE001 - a result the encoder refuses (too deep...)
            send(failure(exc, str(op), printed, language))


def make_sender(proto, token):
    """The only writer of protocol lines; the token and the channel live in this closure alone."""

    def send(payload):
        proto.write(token + " " + json.dumps(payload, allow_nan=True) + "\n")
        proto.flush()

    return send


def refused_by(exc, language):
    """The layer inside the jail whose refusal ``exc`` is, or None for env code's own
    exception. By exact type, never by reading the exception: no env code runs here."""
    kind = type(exc)
    if issubclass(kind, language.Refused):
        return "language"
    if issubclass(kind, language.ImportRefused):
        return "worker"
    if kind is PermissionError:  # EPERM: env code opens no file, so it is the filter's SECCOMP_RET_ERRNO
        return "seccomp"
    if kind is MemoryError:  # the address-space rlimit set above
        return "limits"
    return None


def failure(exc, where, printed, language):
    """An exception of env code as plain data: type, message, which layer refused it
    (``refused_by``), the env.py lines of its traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "env.py"]
    line = " (env.py line %d)" % frames[-1].lineno if frames else ""
    try:
        message = str(exc)[:MAX_TEXT]
    except BaseException:  # noqa: BLE001 - an exception whose text itself fails
        message = "(unprintable)"
    kind = type(exc).__name__
    trace = "".join(traceback.format_list(frames[-20:]))[-4 * MAX_TEXT :]
    return {
        "ok": False,
        "error": "%s: %s%s" % (kind, message, line),
        "where": where,
        "printed": printed.tail(),
        "exception": {"type": kind, "message": message, "layer": refused_by(exc, language)},
        "traceback": trace,
    }


def to_json(value):
    """Only plain JSON data crosses the boundary."""
    return json.loads(json.dumps(value, allow_nan=True, default=lambda o: repr(o)[:200]))


class CappedText(io.TextIOBase):
    def __init__(self, cap):
        self.cap, self.parts, self.size = cap, [], 0

    def write(self, text):
        if self.size < self.cap:
            self.parts.append(text[: self.cap - self.size])
            self.size += len(self.parts[-1])
        return len(text)

    def tail(self):
        return "".join(self.parts)[-MAX_TEXT:]


def set_limits(limits):
    pairs = {
        "address_space": resource.RLIMIT_AS,
        "cpu_seconds": resource.RLIMIT_CPU,
        "file_size": resource.RLIMIT_FSIZE,
        "open_files": resource.RLIMIT_NOFILE,
        "processes": resource.RLIMIT_NPROC,
    }
    for key, which in pairs.items():
        if limits.get(key) is not None:
            value = int(limits[key])
            resource.setrlimit(which, (value, value))


# --- seccomp: an allowlist of what a running interpreter needs ------------------------
AUDIT_ARCH_X86_64 = 0xC000003E
ALLOW_X86_64 = {
    0: "read",
    1: "write",
    2: "open",
    3: "close",
    4: "stat",
    5: "fstat",
    6: "lstat",
    7: "poll",
    8: "lseek",
    9: "mmap",
    10: "mprotect",
    11: "munmap",
    12: "brk",
    13: "rt_sigaction",
    14: "rt_sigprocmask",
    15: "rt_sigreturn",
    16: "ioctl",
    17: "pread64",
    19: "readv",
    20: "writev",
    21: "access",
    23: "select",
    24: "sched_yield",
    25: "mremap",
    28: "madvise",
    32: "dup",
    33: "dup2",
    35: "nanosleep",
    39: "getpid",
    60: "exit",
    63: "uname",
    72: "fcntl",
    78: "getdents",
    79: "getcwd",
    89: "readlink",
    96: "gettimeofday",
    97: "getrlimit",
    98: "getrusage",
    99: "sysinfo",
    100: "times",
    102: "getuid",
    104: "getgid",
    107: "geteuid",
    108: "getegid",
    110: "getppid",
    111: "getpgrp",
    115: "getgroups",
    131: "sigaltstack",
    158: "arch_prctl",
    186: "gettid",
    202: "futex",
    204: "sched_getaffinity",
    217: "getdents64",
    218: "set_tid_address",
    219: "restart_syscall",
    228: "clock_gettime",
    229: "clock_getres",
    230: "clock_nanosleep",
    231: "exit_group",
    257: "openat",
    262: "newfstatat",
    267: "readlinkat",
    269: "faccessat",
    270: "pselect6",
    271: "ppoll",
    273: "set_robust_list",
    292: "dup3",
    302: "prlimit64",
    318: "getrandom",
    332: "statx",
    334: "rseq",
    439: "faccessat2",
}
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
EPERM = 1


def install_seccomp():
    """A classic-BPF allowlist, assembled here to avoid a dependency on libseccomp:
    every system call not listed fails with EPERM (sockets, exec, fork, mount,
    ptrace, kill, links, chmod... all of them), another architecture is killed."""
    if os.uname().machine != "x86_64":
        return "unsupported-arch"
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    insns = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, AUDIT_ARCH_X86_64),
        (ret, 0, 0, SECCOMP_RET_KILL_PROCESS),
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jge, 0, 1, 0x40000000),  # the x32 ABI: refuse all of it
        (ret, 0, 0, SECCOMP_RET_ERRNO | EPERM),
    ]
    numbers = sorted(ALLOW_X86_64)
    for i, nr in enumerate(numbers):
        remaining = len(numbers) - i - 1
        insns.append((jeq, remaining + 1, 0, nr))  # to the ALLOW return below the ERRNO
    insns.append((ret, 0, 0, SECCOMP_RET_ERRNO | EPERM))
    insns.append((ret, 0, 0, SECCOMP_RET_ALLOW))
    program = b"".join(struct.pack("HBBI", *insn) for insn in insns)
    buf = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(insns), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
    return "on"


if __name__ == "__main__":
    main()
