"""The third red team's breaks of the language layer (issue 29, finding 1), run in the real jails.

Each attack used a stdlib helper that turns data into code or writes into a module
chosen by data: a ``typing.TypedDict`` whose field names are any strings, copied
onto an env class by ``functools.update_wrapper``'s default names, then exec'd by
``dataclasses``; the Enum functional API's ``module=`` with ``enum.global_enum``,
writing members into a loaded module's globals. On the denylist layer each step
ran. The layer is now an allowlist (``language.MODULES``): each attack is refused
as written by the static gate, and with its module names laundered (the gate
cannot see which module's attribute is read) by the language layer's proxies;
each error names its layer. Names passed as data are checked as plain
identifiers (never private, never a dunder).
"""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from test_sandbox_hostile import env_source as hostile_env_source
from test_sandbox_hostile import launder
from trace_gym.sandbox import Limits, SandboxEnvError, SandboxViolation, SandboxWorker

FAST = Limits(call_timeout_s=5.0, start_timeout_s=20.0, memory_mb=256)
TOP = "import dataclasses\nimport enum\nimport functools\nimport collections\nU = '_' * 2\n"


def stopped(backend, src: str, layer: str | None = "language layer") -> str:
    """The error that stopped ``src``'s first step in the jail (the test fails, with what
    the env got, if nothing stopped it)."""
    with pytest.raises(SandboxEnvError, match=layer) as caught:
        with SandboxWorker(src, backend=backend, limits=FAST) as worker:
            worker.call("reset", seed=0, hint=False)
            out = worker.call("step", action={"type": "message", "content": "hi"})["observation"]
            pytest.fail(f"not stopped; the env got: {out[:300]}")
    return str(caught.value)


TYPED_DICT_TO_DATACLASS_EXEC = """
TD = typing.TypedDict("TD", {"a": int, "b=print(1) or 2, c": int})
class E:
    pass
functools.update_wrapper(E, TD, updated=())
dataclasses.dataclass(E)
out = "exec'd"
"""
UPDATE_WRAPPER_DEFAULTS = """
class Holder:
    pass
h = Holder()
functools.update_wrapper(h, random.Random)
out = str(h)
"""
ENUM_INTO_A_MODULE = """
E = enum.Enum("E", "ALLOWED_MODULES MODULES", module="language")
enum.global_enum(E)
out = "written"
"""
GLOBAL_ENUM_ON_A_CLASS = """
class E(enum.Enum):
    MODULES = 1
enum.global_enum(E)
out = "written"
"""
ATTACKS = {
    "TypedDict names exec'd by dataclasses": (TYPED_DICT_TO_DATACLASS_EXEC, "typing.TypedDict"),
    "update_wrapper's default names": (UPDATE_WRAPPER_DEFAULTS, "functools.update_wrapper"),
    "Enum's functional API into a module": (ENUM_INTO_A_MODULE, "enum's functional API"),
    "global_enum on a class statement": (GLOBAL_ENUM_ON_A_CLASS, "enum.global_enum"),
}


def source(body: str, laundered: bool) -> str:
    body = textwrap.dedent(body)
    return hostile_env_source(launder(body) if laundered else body, top=TOP)


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_attack_as_written_is_refused_by_the_static_gate(name):
    from trace_gym.sandbox.gate import enforce

    body, _ = ATTACKS[name]
    with pytest.raises(SandboxViolation, match="static gate: .*not on the sandbox's allowlist"):
        enforce(source(body, laundered=False))


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_attack_laundered_past_the_gate_is_refused_by_the_language_layer(sandbox_backend, name):
    body, fragment = ATTACKS[name]
    error = stopped(sandbox_backend, source(body, laundered=True))
    assert fragment in error
    assert "token=" not in error


def test_legitimate_enums_namedtuples_and_dataclasses_still_run(sandbox_backend):
    body = """
    class Color(enum.Enum):
        RED = 1
        BLUE = 2
    P = collections.namedtuple("P", "x y", defaults=(0,))
    @dataclasses.dataclass
    class Item:
        name: str
        tags: list = dataclasses.field(default_factory=list)
    out = repr((Color(2).name, Color["RED"].value, P(1), dataclasses.asdict(Item("a"))))
    """
    with SandboxWorker(source(body, laundered=False), backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        out = worker.call("step", action={"type": "message", "content": "hi"})["observation"]
    assert out == "('BLUE', 1, P(x=1, y=0), {'name': 'a', 'tags': []})"


@pytest.mark.parametrize("name", ["b=print(1) or 2, c", "_private", "__init__", "class", "tb_frame x", 7])
def test_field_names_taken_as_data_are_plain_identifiers_only(name):
    """In process, the checks the proxies apply: a dataclass's fields (from annotations
    that did not come from a class statement) and a namedtuple's."""
    from trace_gym.sandbox.language import CHECKED_CALLS, ENV_CLASSES, Refused, plain_identifier

    assert not plain_identifier(name)
    cls = type("Made", (), {"__annotations__": {name: int}})
    ENV_CLASSES.add(cls)  # as a class statement of env code's would be
    with pytest.raises(Refused, match="plain identifiers only"):
        CHECKED_CALLS["dataclasses", "dataclass"](dataclasses.dataclass)(cls)
    import collections

    with pytest.raises(Refused, match="plain identifiers only"):
        CHECKED_CALLS["collections", "namedtuple"](collections.namedtuple)("P", ["x", name])


def test_namedtuple_cannot_name_a_module():
    import collections

    from trace_gym.sandbox.language import CHECKED_CALLS, Refused

    with pytest.raises(Refused, match="module="):
        CHECKED_CALLS["collections", "namedtuple"](collections.namedtuple)("P", "x", module="language")


def test_the_gate_and_the_proxies_read_one_policy():
    from trace_gym.sandbox import gate, language

    assert gate.ALLOWED_IMPORTS == frozenset(language.MODULES)
    assert gate.INTROSPECTION_NAMES is language.INTROSPECTION_NAMES
    assert gate.INTROSPECTION_PREFIXES is language.INTROSPECTION_PREFIXES
    assert "update_wrapper" not in language.MODULES["functools"] and "TypedDict" not in language.MODULES["typing"]


def test_env_code_reads_a_fixed_clock(sandbox_backend):
    """Finding 6: the wall clock told env code when it ran (validated today, hostile next
    week). Every way to the clock reads one fixed instant, in validation and training alike."""
    body = """
    out = repr([str(datetime.date.today()), str(datetime.datetime.now()), str(datetime.datetime.utcnow()),
                str(datetime.datetime.today()), str(datetime.datetime.min.now()), str(datetime.date.max.today()),
                str(datetime.datetime.now(datetime.timezone.utc)), repr(datetime.date(2024, 1, 1) + datetime.timedelta(days=1))])
    """
    with SandboxWorker(hostile_env_source(textwrap.dedent(body)), backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        out = worker.call("step", action={"type": "message", "content": "hi"})["observation"]
    assert out == repr(
        [
            "2025-01-06",
            "2025-01-06 12:00:00",
            "2025-01-06 12:00:00",
            "2025-01-06 12:00:00",
            "2025-01-06 12:00:00",
            "2025-01-06",
            "2025-01-06 12:00:00+00:00",
            "datetime.date(2024, 1, 2)",
        ]
    )


# --- the independent red team's review of this round (each reproduced, then stopped) --------
# The full chain: copy.deepcopy of a module proxy reduces it with object.__reduce_ex__, which
# reads its slots (the real module) as data; deepcopy keeps that state in the caller's memo
# even when the copy is refused; the real typing.get_type_hints evaluates an annotation with
# eval(), which puts the real builtins into a dict env code holds; exec, frames, the token.
DEEPCOPY_MEMO_ESCAPE = """
import copy
import typing

TOOLS = ['get_order_details']
U = "_" * 2


class Memo(dict):
    def get(self, key, default=None):
        self.seen.append(key)
        if key in self.skip:
            return 0
        return dict.get(self, key, default)


def memo(seen, skip):
    m = Memo()
    m.seen, m.skip = seen, skip
    return m


def real_module(proxy):
    seen, skip = [], []
    try:
        copy.deepcopy(proxy, memo(seen, skip))
    except Exception:
        pass
    skip.append(seen[-1])
    m = memo([], skip)
    try:
        copy.deepcopy(proxy, m)
    except Exception:
        pass
    for kept in m[id(m)]:
        if isinstance(kept, dict) and "_module" in kept:
            return kept["_module"]


class Environment:
    def reset(self, seed, hint=False):
        return {'system_prompt': 's', 'user_message': 'u'}

    def step(self, action):
        class C:
            x: "int"
        g = {}
        real_module(typing).get_type_hints(C, g)
        B = g[U + "builtins" + U]
        box = []
        B["exec"]("box.append(open('/etc/passwd').read()[:60])", {U + "builtins" + U: B, "box": box})
        return {'observation': repr(box), 'done': False}

    def reward(self):
        return {'reward': 0.0, 'components': {}, 'reason': ''}
"""
REVIEW = {
    "deepcopy with a memo of env code's": ("out = repr(copy.deepcopy(json.dumps, {}))", "copy.deepcopy with a memo"),
    "the real clock through super()": (
        "out = repr(super(datetime.datetime, datetime.datetime).now())",
        "super(datetime.datetime, ...), past a class env code did not define",
    ),
    "a typing alias writing into the ABC registry": (
        "class E:\n    pass\ntyping.Mapping.register(E)\nout = 'registered'",
        "attribute 'register' of a typing alias",
    ),
}


@pytest.mark.parametrize("name", list(REVIEW))
def test_the_reviews_attacks_are_refused_by_the_language_layer(sandbox_backend, name):
    body, fragment = REVIEW[name]
    src = hostile_env_source(body, top="import copy\n")
    from trace_gym.sandbox.gate import check_source

    assert check_source(src) == []  # the gate sees nothing wrong: the run time must stop it
    error = stopped(sandbox_backend, src)
    assert fragment in error


def test_the_fixed_clock_hands_out_no_real_date(sandbox_backend):
    body = "d = datetime.datetime.now().date()\nout = repr((str(d), str(d.today())))"
    with SandboxWorker(hostile_env_source(body), backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        out = worker.call("step", action={"type": "message", "content": "hi"})["observation"]
    assert out == repr(("2025-01-06", "2025-01-06"))


# --- the second review of this round: reductions that call a callable named by data ------
# A: type() handed out typing's _GenericAlias; an alias built with name='__builtins__'
# reduces (copy.copy) to operator.getitem(typing's globals['__builtins__'], 'exec').
# B: type() handed out types.MethodType; a method bound to a NamedTuple class named
# '__globals__' reduces to getattr(obj, '__globals__'). Both reached exec, the token and
# the real clock. Now: type() is an allowlist, copy never reduces, NamedTuple's names
# are plain identifiers, and str.format hands out no raw function.
SECOND_REVIEW_A = "import copy\nimport typing\n\nTOOLS = ['get_order_details']\nU = \"_\" * 2\n\n\nclass Environment:\n    def reset(self, seed, hint=False):\n        return {'system_prompt': 's', 'user_message': 'u'}\n\n    def step(self, action):\n        alias = type(typing.List[int])(list, (\"exec\",), name=U + \"builtins\" + U)\n        real_exec = copy.copy(alias)  # _GenericAlias.__reduce__: operator.getitem(typing.__dict__[_name], args)\n        box = {}\n        real_exec(\"import sys, time\\nf = sys._getframe()\\nwhile f.f_code.co_name != 'main':\\n    f = f.f_back\\n\"\n                  \"box['token'] = [c.cell_contents for c in getattr(f.f_locals['send'], U + 'closure' + U)][1]\\n\"\n                  \"box['clock'] = time.time()\\nbox['passwd'] = open('/etc/passwd').read()[:27]\",\n                  {\"box\": box, \"U\": U})\n        return {'observation': repr(box), 'done': False}\n\n    def reward(self):\n        return {'reward': 0.0, 'components': {}, 'reason': ''}\n"
SECOND_REVIEW_B = "import copy\nimport random\nimport typing\n\nTOOLS = ['get_order_details']\nU = \"_\" * 2\n\n\nclass C:\n    def f(self):\n        return 1\n\n\nclass Environment:\n    def reset(self, seed, hint=False):\n        return {'system_prompt': 's', 'user_message': 'u'}\n\n    def step(self, action):\n        method = type(C().f)                                   # types.MethodType, handed out by type()\n        named = typing.NamedTuple(U + \"globals\" + U, [])       # a callable whose __name__ is '__globals__'\n        g = copy.copy(method(named, random.Random.seed))       # method.__reduce__: getattr(self, func.__name__)\n        B = g[U + \"builtins\" + U]                              # random's real globals -> real builtins dict\n        box = {}\n        B[\"exec\"](\"import time, os\\nbox['clock'] = time.time()\\nbox['uid'] = os.getuid()\\n\"\n                  \"box['passwd'] = open('/etc/passwd').read()[:27]\", {\"box\": box, U + \"builtins\" + U: B})\n        lang = copy.copy(method(named, '{0}'.format.func))     # the worker's language.py globals\n        box['language_globals'] = sorted(k for k in lang if k.isupper())[:6]\n        return {'observation': repr(box), 'done': False}\n\n    def reward(self):\n        return {'reward': 0.0, 'components': {}, 'reason': ''}\n"
SECOND_REVIEW = {
    "typing alias class from type()": ("out = repr(type(typing.List[int]))", "type() of a _GenericAlias"),
    "MethodType from type()": (
        "class C:\n    def f(self):\n        return 1\nout = repr(type(C().f))",
        "type() of a method",
    ),
    "copy of a typing alias": ("out = repr(copy.copy(typing.List[int]))", "copy of a _GenericAlias"),
    "NamedTuple named by a dunder": (
        "out = repr(typing.NamedTuple('_' * 2 + 'globals' + '_' * 2, []))",
        "typing.NamedTuple of a field named '__globals__'",
    ),
    "the raw function behind str.format": ("out = repr('{0}'.format.func)", "attribute 'func' of str.format"),
}


@pytest.mark.parametrize("src", [SECOND_REVIEW_A, SECOND_REVIEW_B], ids=["alias-getitem", "method-getattr"])
def test_the_second_reviews_escapes_are_refused(sandbox_backend, src):
    from trace_gym.sandbox.gate import check_source

    assert check_source(src) == []
    error = stopped(sandbox_backend, src)
    assert "type() of a" in error


@pytest.mark.parametrize("name", list(SECOND_REVIEW))
def test_each_step_of_the_second_review_is_refused_on_its_own(sandbox_backend, name):
    body, fragment = SECOND_REVIEW[name]
    error = stopped(sandbox_backend, hostile_env_source(body, top="import copy\n"))
    assert fragment in error


def test_env_code_still_copies_its_own_state(sandbox_backend):
    body = """
    class P(typing.NamedTuple):
        x: int
        y: int = 0
    Q = typing.NamedTuple("Q", [("a", int)])
    class Item:
        def __init__(self, name):
            self.name = name
            self.tags = ["t"]
    rng = random.Random(3)
    state = {"items": [Item("a")], "counts": collections.Counter("aab"), "by": collections.defaultdict(list),
             "p": P(1), "q": Q(2), "when": datetime.date(2024, 1, 1), "rng": rng, "pair": (1, [2])}
    state["self"] = state
    deep = copy.deepcopy(state)
    deep["items"][0].tags.append("u")
    deep["by"]["k"].append(1)
    shallow = copy.copy(state["items"])
    same = deep["rng"].random() == rng.random()
    out = repr((state["items"][0].tags, deep["items"][0].tags, deep["self"] is deep, dict(deep["counts"]),
                deep["p"], deep["q"].a, str(deep["when"]), same, shallow[0] is state["items"][0]))
    """
    src = hostile_env_source(textwrap.dedent(body), top="import copy\nimport collections\n")
    with SandboxWorker(src, backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        out = worker.call("step", action={"type": "message", "content": "hi"})["observation"]
    assert out == "(['t'], ['t', 'u'], True, {'a': 2, 'b': 1}, P(x=1, y=0), 2, '2024-01-01', True, True)"


def test_a_copied_proxy_is_the_same_proxy_and_a_reduction_of_one_is_refused(sandbox_backend):
    """copy shares functions and modules as the stdlib shares functions: no state comes
    out. Should anything else reduce a proxy, the proxy refuses (in process)."""
    body = (
        "f = json.dumps\nout = repr((copy.deepcopy(f) is f, copy.copy(json) is json, copy.deepcopy([json])[0] is json))"
    )
    with SandboxWorker(hostile_env_source(body, top="import copy\n"), backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        assert worker.call("step", action={"type": "message", "content": "hi"})["observation"] == "(True, True, True)"
    import copy
    import json

    from trace_gym.sandbox.language import FunctionProxy, ModuleProxy, Refused

    with pytest.raises(Refused, match="copying or pickling a ModuleProxy"):
        ModuleProxy(json, "json").__reduce_ex__(4)
    with pytest.raises(Refused, match="copying a FunctionProxy"):
        copy.deepcopy(FunctionProxy(json.dumps, "json.dumps"))


# --- the third review: stdlib internals that eval text or hand back the worker's objects ----
# dataclass() of a docstring-less class ran inspect.signature, which parsed a base class's
# docstring as a signature and eval'd its dotted names against sys.modules (the worker's
# 'language' module); the AttributeError it raised carried the worker's ENV_CLASSES as .obj;
# asdict() deep-copied field values with the real copy module, so a reduction ran.
THIRD_REVIEW = "import json\nimport random\nimport string\nimport datetime\nimport typing\nimport dataclasses\n\nTOOLS = ['get_order_details']\n\nclass Environment:\n    def reset(self, seed, hint=False):\n        return {'system_prompt': 's', 'user_message': 'u'}\n\n    def step(self, action):\n        out = 'nothing'\n        U = \"_\" * 2\n        class B:\n            \"B(a=language.ENV_CLASSES.nope)\\n--\\n\\n\"\n        class C(B):\n            pass\n        try:\n            dataclasses.dataclass(init=False)(C)\n            raise ValueError(\"no error\")\n        except AttributeError as e:\n            env_classes = e.obj                     # the worker's language.ENV_CLASSES WeakSet\n        env_classes.add(object)                     # now type() hands out any class\n        Alias = type(typing.List[int])              # typing._GenericAlias\n        @dataclasses.dataclass\n        class Box:\n            v: object\n        def real_builtin(name):\n            # _GenericAlias.__reduce__ -> operator.getitem(typing.__dict__['__builtins__'], name), run by the real copy.deepcopy\n            return dataclasses.asdict(Box(Alias(list, (name,), name=U + \"builtins\" + U)))[\"v\"]\n        real_exec = real_builtin(\"exec\")\n        real_import = real_builtin(U + \"import\" + U)\n        box = {}\n        real_exec(\"import os, time, sys\\nbox['uid'] = os.getuid()\\nbox['clock'] = time.time()\\n\"\n                  \"box['passwd'] = open('/etc/passwd').read()[:40]\\n\"\n                  \"f = sys._getframe()\\nwhile f.f_code.co_name != 'main':\\n    f = f.f_back\\n\"\n                  \"box['token'] = [c.cell_contents for c in getattr(f.f_locals['send'], '_' * 2 + 'closure' + '_' * 2)][1]\\n\"\n                  \"box['seccomp_uid'] = (os.getuid(), open('/proc/self/status').read().count('Seccomp:\\t2'))\",\n                  {\"box\": box, U + \"builtins\" + U: real_import(\"builtins\")})\n        out = repr((real_exec, box))\n        return {'observation': str(out), 'done': False}\n\n    def reward(self):\n        return {'reward': 0.0, 'components': {}, 'reason': ''}\n"
THIRD_REVIEW_STEPS = {
    "a docstring read as a signature": (
        'class B:\n    "B(a=language.ENV_CLASSES.nope)\\n--\\n\\n"\nclass C(B):\n    pass\n'
        'dataclasses.dataclass(init=False)(C)\nout = repr("made")',
        None,
    ),
    "an exception's obj": (
        "try:\n    [].nope\nexcept AttributeError as e:\n    out = repr(e.obj)",
        "attribute 'obj' of an exception",
    ),
    "asdict's deepcopy of a field": (
        "@dataclasses.dataclass\nclass Box:\n    v: object\nout = repr(dataclasses.asdict(Box(typing.List[int])))",
        "copy of a _GenericAlias",
    ),
    "a str subclass as a name": (
        "class S(str):\n    def startswith(self, p):\n        return False\n"
        "out = repr(collections.namedtuple(S('_' * 2 + 'globals' + '_' * 2), ['a']))",
        "class S overriding str.startswith",
    ),
}


@pytest.mark.parametrize("src", [DEEPCOPY_MEMO_ESCAPE, THIRD_REVIEW], ids=["first-review", "third-review"])
def test_each_reviews_full_chain_reaches_nothing(sandbox_backend, src):
    """Each chain as its reviewer wrote it (the first one's try/except swallows each
    refusal): it ends in an error, with no host file, builtin or token in it."""
    from trace_gym.sandbox.gate import check_source

    assert check_source(src) == []
    error = stopped(sandbox_backend, src, layer=None)  # any error: the chain swallows the layer's own
    assert "token" not in error and "root:" not in error


@pytest.mark.parametrize("name", list(THIRD_REVIEW_STEPS))
def test_each_step_of_the_third_review_is_stopped(sandbox_backend, name):
    body, fragment = THIRD_REVIEW_STEPS[name]
    src = hostile_env_source(body, top="import dataclasses\nimport collections\n")
    if fragment is None:  # the docstring is never parsed: the class gets its own before dataclass() runs
        with SandboxWorker(src, backend=sandbox_backend, limits=FAST) as worker:
            worker.call("reset", seed=0, hint=False)
            assert worker.call("step", action={"type": "message", "content": "hi"})["observation"] == "'made'"
        return
    assert fragment in stopped(sandbox_backend, src)


# --- the fourth review: no escape, four writes into state env code did not define ----------
FOURTH_REVIEW = {
    "dataclass() of a stdlib class": (
        "dataclasses.dataclass(random.Random)\nout = 'rewritten'",
        "dataclasses.dataclass of Random, which env code did not define",
    ),
    "dataclass() of the fixed clock's class": (
        "dataclasses.dataclass(datetime.datetime)\nout = 'rewritten'",
        "which env code did not define",
    ),
    "an object of env code's among a class's bases": (
        "class Spy:\n    def __eq__(self, other):\n        return False\nclass C(Spy(), typing.Mapping):\n    pass\nout = 'x'",
        "class C with a base that is not a class (a Spy)",
    ),
    "register() through an env subclass of an ABC": (
        "class M(typing.Mapping):\n    pass\nM.register(str)\nout = 'x'",
        "register() of an abstract base class",
    ),
    "a str subclass hooking translate": (
        "class S(str):\n    def translate(self, table):\n        return 'x'\nout = 'x'",
        "class S overriding str.translate",
    ),
}


@pytest.mark.parametrize("name", list(FOURTH_REVIEW))
def test_each_write_of_the_fourth_review_is_refused(sandbox_backend, name):
    body, fragment = FOURTH_REVIEW[name]
    src = hostile_env_source(body, top="import dataclasses\n")
    error = stopped(sandbox_backend, src)
    assert fragment in error


def test_str_enums_and_typing_bases_still_build(sandbox_backend):
    body = (
        "class Color(str, enum.Enum):\n    RED = 'red'\nclass P(typing.NamedTuple):\n    x: int\n"
        "class M(typing.Mapping):\n    pass\nout = repr((Color.RED.value, Color('red').name, P(3).x, 'M'))"
    )
    with SandboxWorker(hostile_env_source(body, top="import enum\n"), backend=sandbox_backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        out = worker.call("step", action={"type": "message", "content": "hi"})["observation"]
    assert out == "('red', 'RED', 3, 'M')"
