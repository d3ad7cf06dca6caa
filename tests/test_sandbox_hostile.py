"""Layers 2 and 3: hostile code that the gate lets through, and raw code in the jail.

Every case runs on both real backends (bubblewrap and Docker). Each must be
contained with a typed error that says what happened, and the host (this
test process) carries on with the next case.
"""

import json
import re

import pytest

from trace_gym.sandbox import (
    Layer,
    Limits,
    SandboxEnvError,
    SandboxError,
    SandboxFlood,
    SandboxTimeout,
    SandboxWorker,
)

FAST = Limits(call_timeout_s=3.0, start_timeout_s=20.0, memory_mb=256)


def env_source(step_body: str, top: str = "") -> str:
    """A minimal env whose step() runs ``step_body`` and returns its ``out``."""
    body = "\n".join("        " + line for line in step_body.strip().splitlines())
    return (
        f"import json\nimport random\nimport string\nimport datetime\nimport typing\n{top}\n"
        "TOOLS = ['get_order_details']\n\n"
        "class Environment:\n"
        "    def reset(self, seed, hint=False):\n"
        "        return {'system_prompt': 's', 'user_message': 'u'}\n\n"
        "    def step(self, action):\n"
        "        out = 'nothing'\n"
        f"{body}\n"
        "        return {'observation': str(out), 'done': False}\n\n"
        "    def reward(self):\n"
        "        return {'reward': 0.0, 'components': {}, 'reason': ''}\n"
    )


MODULE_USE = re.compile(r"\b(json|random|string|datetime|typing|functools|enum|copy|dataclasses|collections)\.")


def launder(body: str) -> str:
    """``body`` with each module reached through a plain variable (``L_json = [json][0]``),
    so that the static gate cannot tell which module's attribute is read: the
    language layer's proxies must refuse it alone (each layer is tested on its own)."""
    used = sorted(set(MODULE_USE.findall(body)))
    return "".join(f"L_{m} = [{m}][0]\n" for m in used) + MODULE_USE.sub(lambda m: f"L_{m.group(1)}.", body)


def step_once(backend, source: str, limits: Limits = FAST) -> str:
    with SandboxWorker(source, backend=backend, limits=limits) as worker:
        worker.call("reset", seed=0, hint=False)
        return worker.call("step", action={"type": "message", "content": "hi"})["observation"]


RUNTIME_CASES = {
    # name: (step body, expected error, fragment of its message)
    "module attribute to sys": (
        "out = datetime.sys.modules",
        SandboxEnvError,
        "datetime.sys is not on the sandbox's allowlist",
    ),
    "json.decoder.re chain": (
        "out = json.decoder.re",
        SandboxEnvError,
        "json.decoder is not on the sandbox's allowlist",
    ),
    "string.Formatter field walk": (
        "out = string.Formatter().get_field('0', [1], {})",
        SandboxEnvError,
        "string.Formatter is not on",
    ),
    "typing eval of annotations": (
        "out = typing.get_type_hints(self.step)",
        SandboxEnvError,
        "typing.get_type_hints is not on",
    ),
    "module chain to codecs": (
        "out = json.codecs.open",
        SandboxEnvError,
        "json.codecs is not on the sandbox's allowlist",
    ),
    "cpu loop": ("while True:\n    pass", SandboxTimeout, "no answer within 3s"),
    "hang in a long computation": ("out = sum(range(10**12))", SandboxTimeout, "killed"),
    "memory bomb": ("x = [0] * (10**10)", SandboxEnvError, "MemoryError"),
    "string memory bomb": ("x = 'x' * (2**33)", SandboxEnvError, "MemoryError"),
    "recursion": ("def f(n):\n    return f(n + 1)\nout = f(0)", SandboxEnvError, "RecursionError"),
    "reply flood": ("out = 'x' * (6 * 1024 * 1024)", SandboxFlood, "more than"),
    "exit the worker": ("raise SystemExit(0)", SandboxEnvError, "SystemExit"),
}


# the layer each case's typed error names; None: env code's own exception, no layer stopped it
OWN = {"recursion": None, "exit the worker": None}
LAYERS = {"cpu loop": Layer.TIME, "hang in a long computation": Layer.TIME, "reply flood": Layer.HOST}
LAYERS |= {"memory bomb": Layer.JAIL, "string memory bomb": Layer.JAIL}


@pytest.mark.parametrize("name", sorted(RUNTIME_CASES))
def test_runtime_escape_is_contained(sandbox_backend, name):
    """Run with module names laundered: the gate cannot see them, the run time must stop them."""
    body, error, fragment = RUNTIME_CASES[name]
    with pytest.raises(error, match=fragment) as caught:
        step_once(sandbox_backend, env_source(launder(body)))
    assert caught.value.layer == {**OWN, **LAYERS}.get(name, Layer.LANGUAGE)


@pytest.mark.parametrize(
    "name", [n for n, case in RUNTIME_CASES.items() if "allowlist" in case[2] or "is not on" in case[2]]
)
def test_module_escapes_as_written_are_refused_by_the_static_gate(name):
    from trace_gym.sandbox import SandboxViolation
    from trace_gym.sandbox.gate import enforce

    with pytest.raises(SandboxViolation, match="static gate: .*is not on the sandbox's allowlist"):
        enforce(env_source(RUNTIME_CASES[name][0]))


def test_print_flood_and_fake_protocol_lines_do_not_reach_the_host(sandbox_backend):
    body = (
        "for i in range(20000):\n"
        '    print(\'{"ok": true, "result": {"observation": "forged", "done": true}}\')\n'
        '    print(\'0\' * 32 + \' {"ok": true, "result": "forged"}\')\n'
        "out = 'real'"
    )
    assert step_once(sandbox_backend, env_source(body)) == "real"


def test_host_secrets_are_invisible_even_through_format_string_walks(sandbox_backend, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret-123")
    dunder = "_" * 2
    walk = "'{0.' + D + 'func' + D + '.' + D + 'globals' + D + '[_os].environ}'"
    body = f"D = {dunder!r}\nout = ({walk}).format(random.shuffle)"
    with pytest.raises(SandboxEnvError, match="refused by the language layer") as caught:
        step_once(sandbox_backend, env_source(body))
    assert "sk-host-secret" not in str(caught.value) and "environ(" not in str(caught.value)
    assert caught.value.layer is Layer.LANGUAGE


def test_a_broken_worker_leaves_the_host_and_other_workers_running(sandbox_backend):
    good = SandboxWorker(env_source("out = 'alive'"), backend=sandbox_backend, limits=FAST)
    with pytest.raises(SandboxTimeout):
        step_once(sandbox_backend, env_source("while True:\n    pass"))
    good.call("reset", seed=1, hint=False)
    assert good.call("step", action={"type": "message", "content": "x"})["observation"] == "alive"
    good.close()


def test_a_dead_worker_says_so(sandbox_backend):
    worker = SandboxWorker(env_source("while True:\n    pass"), backend=sandbox_backend, limits=FAST)
    with pytest.raises(SandboxTimeout):
        worker.call("step", action={"type": "message", "content": "x"})
    with pytest.raises(SandboxError, match="no longer running"):
        worker.call("ping")


def test_actions_are_data_never_code(sandbox_backend):
    """What the agent writes reaches the env as strings inside JSON; it cannot
    run code, break the line framing, or set the reward."""
    source = env_source("out = json.dumps(action)")
    sneaky = '__import__(\'os\').system(\'id\')\n0000 {"ok": true, "result": {"reward": 1.0}}\nreward = 1.0'
    with SandboxWorker(source, backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        echoed = json.loads(worker.call("step", action={"type": "message", "content": sneaky})["observation"])
        assert echoed == {"type": "message", "content": sneaky}
        assert worker.call("reward")["reward"] == 0.0


# --- Layer 3: the jail alone, with raw Python (no gate, no restricted builtins) ------------
JAIL_PROBE = r"""
import json, os, sys, socket
sys.path.insert(0, "/opt/trace-gym")
import worker
worker.set_limits({"address_space": 256 * 1024 * 1024, "processes": 16})
result = {"seccomp": worker.install_seccomp()}
def probe(name, fn):
    try:
        result[name] = "ALLOWED: " + str(fn())[:100]
    except BaseException as exc:
        result[name] = "refused: " + type(exc).__name__
probe("read_shadow", lambda: open("/etc/shadow").read())
probe("read_project", lambda: open(PROJECT_FILE).read())
probe("read_host_home", lambda: open("/root/.bashrc").read())
probe("write_root", lambda: open("/opt/evil", "w").write("x"))
probe("write_tmp", lambda: open("/tmp/ok", "w").write("x"))
probe("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
probe("dns", lambda: socket.getaddrinfo("example.com", 80))
probe("fork", lambda: os.fork())
def system():
    status = os.system("echo pwned > /tmp/pwned")
    if os.path.exists("/tmp/pwned"):
        return "a command ran (status %d)" % status
    raise PermissionError("nothing ran (status %d)" % status)
probe("system", system)
probe("exec", lambda: os.execv("/bin/sh", ["sh"]))
probe("exec_python", lambda: os.execv(sys.executable, [sys.executable, "-c", "print(1)"]))
probe("memory", lambda: bytearray(1024 * 1024 * 1024))
result["uid"] = os.getuid()
result["env"] = sorted(os.environ)
result["root_listing"] = sorted(os.listdir("/"))
print(json.dumps(result))
"""


def jail_run(backend, code: str) -> dict:
    from conftest import REPO

    channel = backend.spawn(FAST, ("-I", "-S", "-c", code.replace("PROJECT_FILE", repr(str(REPO / "README.md")))))
    try:
        return json.loads(channel.recv_line(30))
    finally:
        channel.close()


def test_the_jail_contains_raw_code(sandbox_backend, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret-123")
    r = jail_run(sandbox_backend, JAIL_PROBE)
    allowed = {k: v for k, v in r.items() if isinstance(v, str) and v.startswith("ALLOWED")}
    assert set(allowed) == {"write_tmp"}, allowed
    assert r["seccomp"] == "on"
    assert r["read_shadow"] == r["read_project"] == r["read_host_home"] == "refused: FileNotFoundError"
    assert r["write_root"] == "refused: OSError"  # read-only file system
    assert r["socket"] == r["fork"] == r["exec_python"] == r["system"] == "refused: PermissionError"
    assert r["exec"] in ("refused: PermissionError", "refused: FileNotFoundError")  # no /bin/sh at all
    assert r["memory"] == "refused: MemoryError"
    assert r["uid"] == 65534
    assert "OPENAI_API_KEY" not in r["env"]
    # The minimal root: the interpreter keeps its host path (under /root/.pyenv here), nothing else.
    assert set(r["root_listing"]) - {".dockerenv"} <= {
        "dev",
        "etc",
        "lib",
        "lib64",
        "opt",
        "proc",
        "root",
        "sys",
        "tmp",
        "usr",
    }
    assert "work" not in r["root_listing"] and "home" not in r["root_listing"]
