"""The in-sandbox worker: runs one untrusted env.py and answers JSON lines.

Runs inside the jail (Docker or bubblewrap) as ``python -I -S worker.py``,
standard library only. Order matters: read the init message, set rlimits,
import the allowlisted modules, install the seccomp filter (no sockets, no
exec, no fork from here on), then run the env code with restricted builtins
and module proxies. The env code's prints go to a capped buffer; protocol
lines go to a private copy of stdout, each prefixed with a per-session token
the env code never sees, so a print cannot forge a reply.

This file must not import anything outside the standard library.
"""

import ctypes
import io
import json
import math
import os
import resource
import struct
import sys
import traceback

ALLOWED_MODULES = (
    "random", "math", "json", "re", "datetime", "dataclasses", "collections", "itertools",
    "functools", "string", "typing", "enum", "copy", "collections.abc",
)
# Attributes that hand out an attribute getter or code evaluation even though
# their names look harmless.
DENIED_MODULE_ATTRS = {"string": {"Formatter"}, "typing": {"get_type_hints"}, "dataclasses": {"_create_fn"}}
SAFE_BUILTINS = (
    "abs all any ascii bin bool bytearray bytes callable chr classmethod complex dict divmod enumerate "
    "filter float format frozenset hash hex id int isinstance issubclass iter len list map max min next "
    "object oct ord pow property range repr reversed round set slice sorted staticmethod str sum super "
    "tuple type zip hasattr ArithmeticError AssertionError AttributeError BaseException Exception IndexError "
    "KeyError LookupError NameError NotImplementedError OverflowError RecursionError RuntimeError "
    "StopIteration TypeError ValueError ZeroDivisionError NotImplemented Ellipsis True False None "
    "__build_class__"
).split()
MAX_PRINT = 64 * 1024


def main():
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)  # C-level writes to stdout vanish
    init = json.loads(sys.stdin.readline())
    send = make_sender(proto, init.pop("token"))

    set_limits(init.get("limits", {}))
    modules = {name: __import__(name, fromlist=["_"]) for name in ALLOWED_MODULES}
    seccomp_status = install_seccomp() if init.get("seccomp", True) else "off"
    printed = CappedText(MAX_PRINT)
    sys.stdout = printed

    namespace = {"__builtins__": restricted_builtins(modules, printed), "__name__": "env"}
    try:
        exec(compile(init["source"], "env.py", "exec"), namespace)
        cls = namespace.get("Environment")
        if not isinstance(cls, type):
            raise TypeError("env.py defines no class Environment")
        env = cls()
        tools = namespace.get("TOOLS")
        info = {
            "ok": True,
            "tools": list(tools) if isinstance(tools, (list, tuple)) else tools,
            "max_steps": getattr(env, "max_steps", None),
            "has_oracle": callable(getattr(env, "oracle", None)),
            "seccomp": seccomp_status,
        }
    except BaseException as exc:  # noqa: BLE001 - every failure of env code is reported, never fatal here
        send({"ok": False, "error": describe(exc), "where": "load"})
        return
    send(info)

    for line in sys.stdin:
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "reset":
                result = env.reset(int(request["seed"]), bool(request.get("hint", False)))
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
            send({"ok": True, "result": to_json(result)})
        except BaseException as exc:  # noqa: BLE001
            send({"ok": False, "error": describe(exc), "where": str(request.get("op")), "printed": printed.tail()})


def make_sender(proto, token):
    """The only writer of protocol lines; the token lives in this closure alone."""

    def send(payload):
        proto.write(token + " " + json.dumps(payload, allow_nan=True) + "\n")
        proto.flush()

    return send


def describe(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "env.py"]
    where = " (env.py line %d)" % frames[-1].lineno if frames else ""
    return "%s: %s%s" % (type(exc).__name__, str(exc)[:2000], where)


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
        return "".join(self.parts)[-2000:]


class ModuleProxy:
    """Public, non-module attributes of an allowed module; nothing else."""

    __slots__ = ("_module", "_name", "_denied")

    def __init__(self, module, name):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_denied", DENIED_MODULE_ATTRS.get(name, set()))

    def __getattr__(self, attr):
        name = object.__getattribute__(self, "_name")
        if attr.startswith("_") or attr in object.__getattribute__(self, "_denied"):
            raise AttributeError("%s.%s is not available in the sandbox" % (name, attr))
        value = getattr(object.__getattribute__(self, "_module"), attr)
        if type(value) is type(sys):
            sub = name + "." + attr
            if sub in ALLOWED_MODULES:
                return ModuleProxy(value, sub)
            raise AttributeError("%s is not an allowed module" % sub)
        return value

    def __setattr__(self, attr, value):
        raise AttributeError("modules are read-only in the sandbox")

    def __repr__(self):
        return "<module %s>" % object.__getattribute__(self, "_name")


def restricted_builtins(modules, printed):
    import builtins

    table = {name: getattr(builtins, name) for name in SAFE_BUILTINS if hasattr(builtins, name)}
    proxies = {name: ModuleProxy(mod, name) for name, mod in modules.items()}

    def safe_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in proxies:
            raise ImportError("import of %r is not allowed in the sandbox" % name)
        if "." in name and not fromlist:
            return proxies[name.split(".")[0]]
        return proxies[name]

    def safe_print(*args, sep=" ", end="\n", **_):
        printed.write(sep.join(str(a) for a in args) + end)

    table["__import__"] = safe_import
    table["print"] = safe_print
    return table


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


# --- seccomp: deny sockets, exec, fork and kernel-facing calls ------------------
AUDIT_ARCH_X86_64 = 0xC000003E
DENY_X86_64 = {
    41: "socket", 42: "connect", 43: "accept", 44: "sendto", 49: "bind", 50: "listen", 53: "socketpair",
    288: "accept4", 56: "clone", 57: "fork", 58: "vfork", 59: "execve", 322: "execveat", 435: "clone3",
    101: "ptrace", 165: "mount", 166: "umount2", 272: "unshare", 308: "setns", 161: "chroot",
    155: "pivot_root", 321: "bpf", 298: "perf_event_open", 248: "add_key", 249: "request_key",
    250: "keyctl", 425: "io_uring_setup", 323: "userfaultfd", 310: "process_vm_readv",
    311: "process_vm_writev", 304: "open_by_handle_at", 175: "init_module", 313: "finit_module",
    246: "kexec_load", 169: "reboot", 135: "personality",
}
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_KILL_PROCESS = 0x80000000
EPERM = 1


def install_seccomp():
    """A classic-BPF filter, assembled here to avoid a dependency on libseccomp."""
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
    numbers = sorted(DENY_X86_64)
    for i, nr in enumerate(numbers):
        remaining = len(numbers) - i - 1
        insns.append((jeq, remaining + 1, 0, nr))  # to the ERRNO return below the ALLOW
    insns.append((ret, 0, 0, SECCOMP_RET_ALLOW))
    insns.append((ret, 0, 0, SECCOMP_RET_ERRNO | EPERM))
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
