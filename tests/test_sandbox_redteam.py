"""The red-team findings of issue 9, one test each, and the layer that stops them.

Each attack is written as an attacker wrote it against the first sandbox; every
test failed there. The error each blocked attack raises names the layer that
stopped it: the static gate, the language layer (RestrictedPython and its
guards), the module proxies, the host's reply check, or the jail.
"""

import json
import os
import shutil
import textwrap

import pytest

from conftest import FIXTURE_ENVS
from test_sandbox_hostile import env_source as hostile_env_source
from test_sandbox_hostile import launder
from trace_gym.errors import TraceGymError
from trace_gym.sandbox import (
    Limits,
    SandboxEnvError,
    SandboxProtocolError,
    SandboxUnavailable,
    SandboxViolation,
    SandboxWorker,
)

FAST = Limits(call_timeout_s=5.0, start_timeout_s=20.0, memory_mb=256)
D = "_" * 2  # dunders are spelled at run time below, as an attacker would


def env_source(step_body: str, top: str = "") -> str:
    return hostile_env_source(launder(textwrap.dedent(step_body)), top="import functools\n" + top)


def step_once(backend, source: str) -> str:
    with SandboxWorker(source, backend=backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        return worker.call("step", action={"type": "message", "content": "hi"})["observation"]


# --- finding 3: gate holes (match patterns, dunder method definitions, runtime names) ------
MATCH_TO_GLOBALS = """
match random.shuffle:
    case object(__func__=object(__globals__=g)):
        out = sorted(g)
"""
DUNDER_SETATTR = """
STORE = []
class Box:
    def __setattr__(self, name, value):
        STORE.append(value)
box = Box()
functools.update_wrapper(box, random.shuffle, assigned=(D + 'func' + D,), updated=())
functools.update_wrapper(box, STORE[-1], assigned=(D + 'globals' + D,), updated=())
out = sorted(STORE[-1])
"""


def test_match_class_patterns_cannot_read_attributes(sandbox_backend):
    with pytest.raises(SandboxViolation, match="RestrictedPython") as caught:
        step_once(sandbox_backend, env_source(MATCH_TO_GLOBALS))
    assert "Match" in str(caught.value)


def test_dunder_methods_cannot_be_defined(sandbox_backend):
    with pytest.raises(SandboxViolation, match=r"RestrictedPython.*__setattr__"):
        step_once(sandbox_backend, env_source(DUNDER_SETATTR, top=f"D = {D!r}"))


def test_functools_helpers_refuse_runtime_built_names(sandbox_backend):
    body = """
    class Holder:
        pass
    h = Holder()
    functools.update_wrapper(h, random.shuffle, assigned=(D + 'func' + D,), updated=())
    out = 'copied'
    """
    with pytest.raises(SandboxEnvError, match="language layer"):
        step_once(sandbox_backend, env_source(body, top=f"D = {D!r}"))


def test_a_generator_frame_is_out_of_reach_whatever_the_spelling(sandbox_backend):
    body = """
    g = (i for i in [1])
    h = functools.partial(functools.update_wrapper, assigned=('gi' + '_frame',), updated=())
    class Holder:
        pass
    h(Holder(), g)
    """
    with pytest.raises(SandboxEnvError, match="language layer"):
        step_once(sandbox_backend, env_source(body))


# --- finding 4: module proxies hand out functions that reach the real modules ---------------
def test_functions_from_module_proxies_do_not_reach_real_modules(sandbox_backend):
    walk = "'{0.' + D + 'func' + D + '.' + D + 'globals' + D + '[_os]}'"
    with pytest.raises(SandboxEnvError, match="language layer") as caught:
        step_once(sandbox_backend, env_source(f"out = ({walk}).format(random.shuffle)", top=f"D = {D!r}"))
    assert "module 'os'" not in str(caught.value)


def test_module_proxy_wraps_functions_it_hands_out():
    """In-process check of the proxy object itself (the worker builds the same one)."""
    import random

    from trace_gym.sandbox.language import ModuleProxy

    shuffle = ModuleProxy(random, "random").shuffle
    for name in ("__func__", "__self__", "__globals__", "__closure__", "__wrapped__", "__code__"):
        assert not hasattr(shuffle, name), name
    items = [1, 2, 3]
    shuffle(items)
    assert sorted(items) == [1, 2, 3]


# --- finding 5: the session token and the channel reachable from a traceback ---------------
STEAL_SENDER = """
try:
    1 / 0
except Exception as e:
    match e:
        case object(__traceback__=object(tb_frame=object(f_back=object(f_locals=loc)))):
            loc['send']({'ok': True, 'result': {'observation': 'forged', 'done': True}})
            out = 'sent'
"""


def test_env_code_cannot_reach_the_sender_or_the_token(sandbox_backend):
    with pytest.raises(SandboxViolation, match="RestrictedPython"):
        step_once(sandbox_backend, env_source(STEAL_SENDER))


# --- finding 6: the host must survive any reply ------------------------------------------------
HOSTILE_WORKER = r"""
import json, sys
init = json.loads(sys.stdin.readline())
token = init["token"]
replies = REPLIES
def out(body):
    sys.stdout.write(token + " " + body + "\n")
    sys.stdout.flush()
out(replies.get("load", json.dumps({"ok": True, "tools": ["get_order_details"], "max_steps": 5, "has_oracle": True, "seccomp": "on"})))
for line in sys.stdin:
    request = json.loads(line)
    key = request["op"] + (":hint" if request.get("hint") else "")
    out(replies.get(key) or replies.get(request["op"]) or json.dumps({"ok": True, "result": None}))
"""


class HostileWorkerBackend:
    """A real jail running a program that forges replies with the right token:
    what a worker that env code had taken over could send."""

    def __init__(self, base, replies: dict[str, str]):
        self.base, self.replies = base, replies
        self.name, self.isolated, self.require_seccomp = base.name, True, True

    def spawn(self, limits, python_args=None):
        code = HOSTILE_WORKER.replace("REPLIES", "{" + ",".join(f"{k!r}: {v}" for k, v in self.replies.items()) + "}")
        return self.base.spawn(limits, ("-I", "-S", "-c", code))


def ok(result: str) -> str:
    return "json.dumps({'ok': True, 'result': " + result + "})"


RESET_OK = ok("{'system_prompt': 's', 'user_message': 'u'}")
HOSTILE_REPLIES = {
    "reward of 10**400": {"reward": "'{\"ok\": true, \"result\": {\"reward\": 1' + '0' * 400 + '}}'"},
    "reward nested 1000 deep": {
        "reward": "'{\"ok\": true, \"result\": {\"reward\": ' + '[' * 1000 + '0' + ']' * 1000 + '}}'"
    },
    "100000 nested [": {"reward": "'[' * 100000"},
    "ok is not a bool": {"reward": "json.dumps({'ok': 'yes', 'result': 1})"},
    "error is not text": {"reward": "json.dumps({'ok': False, 'error': [1, 2]})"},
    "huge error text": {"reward": "json.dumps({'ok': False, 'error': 'x' * 3000000})"},
    "a reply that is a list": {"reward": "json.dumps([1, 2])"},
}


@pytest.mark.parametrize("name", sorted(HOSTILE_REPLIES))
def test_the_host_survives_a_hostile_reply(sandbox_backend, name):
    backend = HostileWorkerBackend(sandbox_backend, {"reset": RESET_OK, **HOSTILE_REPLIES[name]})
    worker = SandboxWorker(env_source(""), backend=backend, limits=FAST)
    worker.call("reset", seed=0, hint=False)
    with pytest.raises(TraceGymError) as caught:
        from trace_gym.sandbox.env import parse_reward

        parse_reward(worker.call("reward"))
    assert len(str(caught.value)) < 3000
    assert any(layer in str(caught.value) for layer in ("host reply check", "reward()", "env code raised in reward"))
    worker.close()


def test_wrong_load_reply_types_are_refused(sandbox_backend):
    load = "json.dumps({'ok': True, 'tools': 'get_order_details', 'max_steps': 10**30, 'has_oracle': 'yes', 'seccomp': 'on'})"
    with pytest.raises(SandboxProtocolError, match="host reply check"):
        SandboxWorker(env_source(""), backend=HostileWorkerBackend(sandbox_backend, {"load": load}), limits=FAST)


@pytest.mark.slow
def test_validation_reports_a_hostile_worker_and_never_raises(sandbox_backend, tmp_path):
    from trace_gym.validation import ValidationConfig, validate

    folder = tmp_path / "hostile"
    shutil.copytree(FIXTURE_ENVS / "order-lookup", folder)
    replies = {
        "reset": RESET_OK,
        "reset:hint": ok("['a', 'list']"),
        "step": ok("{'observation': 'x', 'done': True}"),
        "oracle": ok("[]"),
        "reward": "'{\"ok\": true, \"result\": {\"reward\": 1' + '0' * 400 + '}}'",
    }
    config = ValidationConfig(seeds=4, floor_seeds=2, determinism_seeds=1, seed=0)
    report = validate(folder, backend=HostileWorkerBackend(sandbox_backend, replies), config=config, write=False)
    assert not report.passed
    assert [c.name for c in report.checks if c.passed is False]
    assert "Traceback" not in report.table()


# --- finding 7: control characters in evidence ---------------------------------------------------
def test_evidence_is_printed_without_control_characters():
    from trace_gym.validation import CheckResult, ValidationReport

    evil = "boom\r\x1b[2K\x1b[1A  PASS  solvable  oracle solves 100/100\x07\u202e"
    report = ValidationReport(
        "trace/x", "/x", "h", "bwrap", False, [CheckResult("robustness", False, evil)], 0.1, "now", {}
    )
    text = report.table()
    assert not any(ch in text for ch in "\r\x1b\x07\u202e")
    assert "FAIL  robustness" in text


# --- findings 1 and 2: the jail itself (raw Python, no gate, no worker) ----------------------------
JAIL_PROBE = r"""
import json, os
result = {}
def probe(name, fn):
    try:
        result[name] = "ALLOWED: " + str(fn())[:100]
    except BaseException as exc:
        result[name] = "refused: " + type(exc).__name__
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger",
             "/proc/sys/kernel/modprobe", "/proc/sys/fs/binfmt_misc/register", "/proc/kcore"):
    probe("write " + path, lambda p=path: open(p, "w").close())
try:
    result["uid_map"] = [[int(x) for x in l.split()] for l in open("/proc/self/uid_map").read().splitlines()]
except OSError as exc:
    result["uid_map"] = None
result["uid"], result["gid"] = os.getuid(), os.getgid()
result["status"] = [l for l in open("/proc/self/status").read().splitlines() if l.startswith(("Uid", "Gid", "CapEff", "CapBnd", "NoNewPrivs"))]
writable = {}
chunk = b"x" * (1 << 20)
skip = ("/proc", "/sys")
for folder, dirs, _ in os.walk("/"):
    if folder.startswith(skip):
        dirs[:] = []
        continue
    target = os.path.join(folder, ".probe")
    try:
        fh = open(target, "wb")
    except OSError:
        continue
    written = 0
    try:
        while written < (WRITE_MB << 20):
            fh.write(chunk)
            fh.flush()
            written += len(chunk)
    except OSError:
        pass
    finally:
        try:
            fh.close()
        except OSError:
            pass
        os.unlink(target)
    writable[folder] = written >> 20
result["writable_mb"] = writable
result["dev"] = sorted(os.listdir("/dev"))
print(json.dumps(result))
"""
WRITE_MB = 48


def run_probe(backend) -> dict:
    channel = backend.spawn(FAST, ("-I", "-S", "-c", JAIL_PROBE.replace("WRITE_MB", str(WRITE_MB))))
    try:
        return json.loads(channel.recv_line(60))
    finally:
        channel.close()


def assert_jail_holds(r: dict, tmpfs_mb: int) -> None:
    opened = {k: v for k, v in r.items() if k.startswith("write ") and v.startswith("ALLOWED")}
    assert not opened, f"jail: writable kernel files {opened}"
    outer = r["uid"]  # no map (or the identity map: Docker without a user namespace): the same uid outside
    for inside, outside, count in r["uid_map"] or []:  # inside uid, outer uid, count
        if inside <= r["uid"] < inside + count:
            outer = outside + r["uid"] - inside
    assert outer != 0, f"jail: the sandbox uid maps to outer root ({r['uid_map']})"
    assert r["uid"] != 0 and r["gid"] != 0
    too_big = {k: v for k, v in r["writable_mb"].items() if v > tmpfs_mb}
    assert not too_big, f"jail: writable past the {tmpfs_mb} MiB cap: {too_big}"
    assert set(r["dev"]) <= {
        "null",
        "zero",
        "urandom",
        "random",
        "full",
        "shm",
        "pts",
        "ptmx",
        "fd",
        "stdin",
        "stdout",
        "stderr",
        "tty",
        "console",
        "core",
        "mqueue",
    }, r["dev"]


@pytest.mark.slow
def test_the_jail_holds_for_raw_code(sandbox_backend):
    assert_jail_holds(run_probe(sandbox_backend), FAST.tmpfs_mb)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="this process is already a normal user: the other bwrap test covers it")
def test_the_bwrap_jail_holds_when_started_by_a_normal_user():
    """The same probe, with bubblewrap started by another unprivileged user (uid 1000)
    rather than by the sandbox user a root host drops to."""
    from trace_gym.sandbox import BwrapBackend
    from trace_gym.sandbox.backends import bwrap_works
    from trace_gym.sandbox.channel import PipeChannel

    if bwrap_works():
        pytest.skip(f"SANDBOX BACKEND bwrap NOT TESTED HERE: {bwrap_works()}")
    argv = BwrapBackend().argv(FAST, ("-I", "-S", "-c", JAIL_PROBE.replace("WRITE_MB", str(WRITE_MB))))
    channel = PipeChannel(argv, FAST.max_message_bytes, env={}, user=1000)
    try:
        r = json.loads(channel.recv_line(60))
    finally:
        channel.close()
    assert r["uid"] == 65534
    assert_jail_holds(r, FAST.tmpfs_mb)


# --- seccomp: an allowlist, checked by the host -------------------------------------------------
SECCOMP_PROBE = r"""
import json, os, sys
sys.path.insert(0, "/opt/trace-gym")
import worker
status = worker.install_seccomp()
result = {"seccomp": status}
def probe(name, fn):
    try:
        fn()
        result[name] = "ALLOWED"
    except BaseException as exc:
        result[name] = "refused: " + type(exc).__name__
probe("symlink", lambda: os.symlink("/tmp/a", "/tmp/b"))
probe("mkdir", lambda: os.mkdir("/tmp/d"))
probe("chmod", lambda: os.chmod("/tmp", 0o777))
probe("setsid", lambda: os.setsid())
probe("kill", lambda: os.kill(1, 0))
probe("read", lambda: open("/opt/trace-gym/worker.py").read(10))
probe("write_tmp", lambda: open("/tmp/ok", "w").write("x"))
print(json.dumps(result))
"""


def test_seccomp_is_an_allowlist(sandbox_backend):
    channel = sandbox_backend.spawn(FAST, ("-I", "-S", "-c", SECCOMP_PROBE))
    try:
        r = json.loads(channel.recv_line(30))
    finally:
        channel.close()
    assert r["seccomp"] == "on"
    assert r["read"] == r["write_tmp"] == "ALLOWED"
    refused = {k: v for k, v in r.items() if k not in ("seccomp", "read", "write_tmp") and v == "ALLOWED"}
    assert not refused, f"seccomp lets through calls no worker needs: {refused}"


def test_a_worker_without_seccomp_is_refused_unless_named(sandbox_backend):
    source = env_source("")
    with pytest.raises(SandboxUnavailable, match="seccomp"):
        SandboxWorker(source, backend=sandbox_backend, limits=FAST, worker_options={"seccomp": False})
    from trace_gym.sandbox import select_backend

    with pytest.warns(UserWarning, match="without seccomp"):
        weaker = select_backend(f"{sandbox_backend.name}-no-seccomp")
    with SandboxWorker(source, backend=weaker, limits=FAST, worker_options={"seccomp": False}) as worker:
        assert worker.info["seccomp"] == "off"


# --- Docker: what the engine applied is read back and checked ------------------------------------
GOOD_CONTAINER = {
    "Config": {"User": "65534:65534"},
    "HostConfig": {
        "ReadonlyRootfs": True,
        "Privileged": False,
        "NetworkMode": "none",
        "CapDrop": ["ALL"],
        "CapAdd": None,
        "SecurityOpt": ["no-new-privileges"],
        "Tmpfs": {"/tmp": "size=16m,mode=1777,noexec,nosuid,nodev"},
        "IpcMode": "none",
        "ReadonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        "MaskedPaths": ["/proc/kcore", "/proc/keys"],
    },
}
BAD_SETTINGS = {
    "root user": ("Config", "User", "0:0", "user is 0:0"),
    "writable root": ("HostConfig", "ReadonlyRootfs", False, "root filesystem is writable"),
    "uncapped tmpfs": ("HostConfig", "Tmpfs", {"/tmp": "mode=1777"}, "not capped"),
    "a second tmpfs": ("HostConfig", "Tmpfs", {"/tmp": "size=16m", "/run": "size=1g"}, "not capped"),
    "shared IPC": ("HostConfig", "IpcMode", "private", "/dev/shm"),
    "writable /proc/sys": ("HostConfig", "ReadonlyPaths", [], "/proc/sys is not read-only"),
    "privileged": ("HostConfig", "Privileged", True, "privileged"),
    "a network": ("HostConfig", "NetworkMode", "bridge", "network mode bridge"),
}


@pytest.mark.parametrize("name", sorted(BAD_SETTINGS))
def test_docker_settings_are_checked_not_assumed(name):
    import copy

    from trace_gym.sandbox import Limits
    from trace_gym.sandbox.backends import check_container

    check_container(GOOD_CONTAINER, Limits())
    section, key, value, fragment = BAD_SETTINGS[name]
    attrs = copy.deepcopy(GOOD_CONTAINER)
    attrs[section][key] = value
    with pytest.raises(SandboxUnavailable, match=fragment):
        check_container(attrs, Limits())


def test_wrong_result_types_are_contract_errors(sandbox_backend):
    from trace_gym.errors import EnvContractError
    from trace_gym.sandbox.env import SandboxedEnv

    replies = {
        "reset": ok("['a', 'list']"),
        "oracle": ok("[{'type': 'tool_call', 'name': 'x', 'arguments': [1, 2]}]"),
        "step": ok("{'observation': 5, 'done': 'yes'}"),
    }
    env = SandboxedEnv(FIXTURE_ENVS / "order-lookup", backend=HostileWorkerBackend(sandbox_backend, replies))
    with pytest.raises(EnvContractError, match="reset"):
        env.reset(seed=0)
    with pytest.raises(EnvContractError, match="oracle action"):
        env.oracle_actions()
    with pytest.raises(EnvContractError, match="step"):
        env._step({"type": "message", "content": "x"})
    env.close()
