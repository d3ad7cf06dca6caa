"""The language layer (RestrictedPython's compile on the host, guards in the worker):
legitimate env code keeps working, and each guard refuses what it must."""

import json
import sys
from pathlib import Path

import pytest

from trace_gym.sandbox import Layer, SandboxEnvError, SandboxWorker, check_source
from trace_gym.sandbox import language
from trace_gym.sandbox.gate import compile_env

LEGITIMATE = Path(__file__).parent / "fixtures" / "sandbox" / "legitimate_env.py"


def test_legitimate_env_code_runs_in_the_jail(sandbox_backend):
    source = LEGITIMATE.read_text()
    assert check_source(source) == []
    with SandboxWorker(source, backend=sandbox_backend) as worker:
        out = json.loads(worker.call("reset", seed=1, hint=False)["system_prompt"])
    assert out[0] == 4.0 and out[1] == ["a=1", "b=3"] and out[7] == "Order #W1 is RED"
    assert out[18] == "base!" and out[23] == 2 and out[24] == {"name": "x", "price": 1.5, "tags": []}
    assert out[-1] == "BLUE"


def run(source: str) -> dict:
    """Trusted test snippets only: compiled by the gate's compiler, run with the worker's guards."""
    code, errors = compile_env(source)
    assert not errors, errors
    # in the jail the world kit sits beside the worker; here it is the package's module
    modules = {
        name: __import__("trace_gym.sandbox.world" if name == "world" else name, fromlist=["_"])
        for name in language.ALLOWED_MODULES
    }
    namespace = language.env_globals(modules, sys.stdout)
    exec(code, namespace)
    return namespace


REFUSED_AT_RUN_TIME = {
    "private attribute of a stdlib object": "import random\nr = random.Random(1)\nclass H:\n    def get(self, o):\n        return o._randbelow",
    "private attribute inherited from a stdlib class": "import random\nclass R(random.Random):\n    def get(self):\n        return self._randbelow\nR(1).get()",
    "str.format attribute walk": "x = '{0.real}'.format(1)",
    "str.format item walk": "x = '{0[a]}'.format({'a': 1})",
    "format_map": "x = '{a}'.format_map({'a': 1})",
    "str.format reached through super": "class S(str):\n    pass\ng = (i for i in [1])\nx = super(S, S('{0.gi' + '_frame}')).format(g)",
    "str.format_map reached through super": "class S(str):\n    pass\nx = super(S, S('{a}')).format_map({'a': 1})",
    "three-argument type": "T = type('T', (), {})",
    "changing a stdlib class": "import random\nrandom.Random.seed = 1",
    "changing a module": "import json\njson.dumps = 1",
    "update_wrapper with a private name": "import functools, random\nclass H:\n    pass\nfunctools.update_wrapper(H(), random.Random(1), assigned=('_randbelow',), updated=())",
    "wraps with a generator frame": "import functools\ng = (i for i in [1])\nfunctools.wraps(g, assigned=('gi' + '_frame',))",
    "singledispatch (evaluates annotation strings)": "import functools\nf = functools.singledispatch",
    "make_dataclass (dunder methods from a dict)": "import dataclasses\nf = dataclasses.make_dataclass",
    "typing.ForwardRef (evaluates strings)": "import typing\nf = typing.ForwardRef",
    "submodule outside the allowlist": "import json\nd = json.decoder",
}


@pytest.mark.parametrize("name", sorted(REFUSED_AT_RUN_TIME))
def test_guards_refuse_at_run_time(name):
    source = REFUSED_AT_RUN_TIME[name]
    code = source if "class H" not in source or "update_wrapper" in source else source + "\nH().get(r)"
    with pytest.raises(language.Refused, match="refused by the language layer"):
        run(code)


def test_private_names_work_on_env_code_own_objects():
    ns = run(
        "class A:\n    _kind = 'k'\n    def __init__(self):\n        self._n = 1\n    def _inc(self):\n        self._n += 1\n"
        "        return self._n\nclass B(A):\n    def _inc(self):\n        return super()._inc() * 10\n"
        "a = A()\nout = (a._inc(), a._kind, A._kind, B()._inc())\n"
    )
    assert ns["out"] == (2, "k", "k", 20)


def test_hasattr_and_format_stay_usable_but_guarded():
    ns = run("g = (i for i in [1])\nout = (hasattr(g, 'gi' + '_frame'), hasattr(g, 'send'), '{} {x}'.format(1, x=2))")
    assert ns["out"] == (False, True, "1 2")


def test_module_proxies_wrap_the_functions_they_hand_out():
    ns = run("import random, json\nf = random.choice\nd = json.dumps\nr = random.Random")
    assert isinstance(ns["f"], language.FunctionProxy) and isinstance(ns["d"], language.FunctionProxy)
    assert isinstance(ns["r"], type)  # classes stay classes (subclassing, isinstance); their dunders are guarded
    with pytest.raises(AttributeError):
        ns["f"].__func__


def test_class_namespaces_refuse_dunders_beyond_the_allowed():
    meta = language.EnvMeta()
    with pytest.raises(language.Refused, match="__getattr__"):
        meta("X", (), {"__module__": "env", "__getattr__": lambda self, name: name})


def test_compile_refusals_name_restricted_python():
    for source in (
        "match x:\n    case object(a=b):\n        pass",
        "class A:\n    def __setattr__(self, k, v):\n        pass",
        "x = y.__class__",
        "async def f():\n    pass",
    ):
        findings = check_source("x = 1\ny = 2\n" + source)
        assert any("RestrictedPython" in f.message for f in findings), (source, findings)


def test_env_code_raising_names_the_language_layer(sandbox_backend):
    source = LEGITIMATE.read_text().replace(
        "        return {'observation': 'ok', 'done': True}",
        "        if action['type'] == 'tool_call':\n            int('not a number')\n"
        "        return {'observation': '{0.real}'.format(1), 'done': True}",
    )
    with SandboxWorker(source, backend=sandbox_backend) as worker:
        worker.call("reset", seed=0, hint=False)
        with pytest.raises(SandboxEnvError, match="refused by the language layer") as caught:
            worker.call("step", action={"type": "message", "content": "x"})
        assert caught.value.layer is Layer.LANGUAGE
        with pytest.raises(SandboxEnvError, match="ValueError") as caught:  # env code's own bug: no layer
            worker.call("step", action={"type": "tool_call", "name": "get_order_details", "arguments": {}})
        assert caught.value.layer is None


def test_the_worker_names_a_refusing_layer_by_the_exception_type_alone():
    from trace_gym.sandbox import worker

    importer = language.env_globals({}, print)["__builtins__"]["__import__"]
    with pytest.raises(language.ImportRefused) as caught:
        importer("os")
    assert worker.refused_by(caught.value, language) == "worker"
    assert worker.refused_by(language.Refused("x"), language) == "language"
    assert worker.refused_by(PermissionError(1, "Operation not permitted"), language) == "seccomp"
    assert worker.refused_by(MemoryError(), language) == "limits"
    assert worker.refused_by(ValueError("the env's own"), language) is None

    class Looking(ValueError):  # a subclass that pretends in its text: the type decides
        def __str__(self):
            return "refused by the language layer"

    assert worker.refused_by(Looking(), language) is None


def test_the_host_keeps_only_a_known_layer_from_a_reply():
    from trace_gym.sandbox.host import check_reply

    def layer(value):
        reply = {"ok": False, "error": "E: m", "exception": {"type": "E", "message": "m", "layer": value}}
        return check_reply(json.dumps(reply).encode(), "call")["exception"]["layer"]

    assert layer("language") == "language" and layer("seccomp") == "seccomp"
    assert layer("sandbox time limit") is None and layer(["language"]) is None and layer(None) is None
    assert SandboxEnvError("x", {"exception": {"layer": "worker"}}).layer is Layer.WORKER
    assert SandboxEnvError("x", {"exception": {"layer": "made up"}}).layer is None
