"""The second red team's breaks of the language layer, one test each, run in the real jails.

Each attack failed to be stopped before the fix (the env reached the worker's
frames and its session token, built classes from a dict, or changed stdlib
state); each is now refused by the language layer, which its error names.
The way in: stdlib code that reads or writes attributes by names taken from
data (a dataclass ``Field``'s name, a class's annotations, copyreg's reductor
state) never passes through the guards, and a metaclass (``type(int)``) builds
classes whose namespace EnvMeta never sees.
"""

import textwrap

import pytest

from test_sandbox_hostile import env_source as hostile_env_source
from test_sandbox_hostile import launder
from trace_gym.sandbox import Limits, SandboxEnvError, SandboxWorker

FAST = Limits(call_timeout_s=5.0, start_timeout_s=20.0, memory_mb=256)
D = "_" * 2
TOP = "import dataclasses\nimport enum\nimport copy\nimport collections\nU = '_' * 2\n"


def step_once(backend, body: str) -> str:
    source = hostile_env_source(launder(textwrap.dedent(body)), top=TOP)
    with SandboxWorker(source, backend=backend, limits=FAST) as worker:
        worker.call("reset", seed=0, hint=False)
        return worker.call("step", action={"type": "message", "content": "hi"})["observation"]


def refused(backend, body: str, fragment: str) -> None:
    with pytest.raises(SandboxEnvError, match="language layer") as caught:
        out = step_once(backend, body)
        pytest.fail(f"not stopped; the env read: {out[:300]}")
    assert fragment in str(caught.value)
    assert "token=" not in str(caught.value)


# The full chain: a dataclass metaclass whose field is renamed to a dunder makes
# dataclasses.asdict an unguarded getattr (object.__getattribute__), then a
# traceback leads to the worker's frame, its globals (the real os) and the sender's token.
FIELD_NAME_TO_WORKER_FRAMES = """
T = type(int)
@dataclasses.dataclass(init=False, repr=False, eq=False)
class Meta(T):
    x: int = 0
C = Meta("C", (), {})
f = dataclasses.fields(Meta)[0]
f.name = U + "getattribute" + U
got = []
def grab(pairs):
    got.append(pairs)
    return {}
dataclasses.asdict(C, dict_factory=grab)
og = got[0][0][1]
try:
    1 / 0
except ZeroDivisionError as e:
    tb = og(e, U + "traceback" + U)
outer = og(og(tb, "tb_frame"), "f_back")
cells = og(og(outer, "f_locals")["send"], U + "closure" + U)
out = "token=" + str([og(c, "cell_contents") for c in cells]) + " os=" + repr(og(outer, "f_globals")["os"])
"""


def test_dataclass_fields_and_a_metaclass_do_not_reach_worker_frames(sandbox_backend):
    refused(sandbox_backend, FIELD_NAME_TO_WORKER_FRAMES, "metaclass")


def test_type_of_a_class_is_not_a_three_argument_type(sandbox_backend):
    body = """
    X = type(int)("X", (), {U + "exit" + U: 1, U + "slots" + U: ()})
    out = str(X)
    """
    refused(sandbox_backend, body, "type() of a class")


def test_a_metaclass_returned_by_a_module_function_is_refused(sandbox_backend):
    body = """
    X = typing.get_origin(typing.Type[int])("X", (), {U + "exit" + U: 1})
    out = str(X)
    """
    refused(sandbox_backend, body, "typing.get_origin is not on the sandbox's allowlist")
    # and should an allowed function ever return a metaclass, the proxy refuses to hand it out
    from trace_gym.sandbox.language import Refused, wrap

    with pytest.raises(Refused, match="is a metaclass"):
        wrap(type, "typing.get_origin()")


def test_a_metaclass_handed_out_by_a_module_is_refused(sandbox_backend):
    body = """
    class M(enum.EnumType):
        pass
    out = str(M)
    """
    refused(sandbox_backend, body, "enum.EnumType is not on the sandbox's allowlist")


def test_a_dataclass_field_cannot_be_renamed_to_a_dunder(sandbox_backend):
    body = """
    @dataclasses.dataclass
    class D:
        x: int = 0
    dataclasses.fields(D)[0].name = U + "init" + U
    got = []
    dataclasses.asdict(D(), dict_factory=got.append)
    out = repr(got)
    """
    refused(sandbox_backend, body, "changing attribute 'name' of a Field")


# Enum's functional API builds a class from a dict (no class statement, no EnvMeta):
# members named __copy__/__reduce_ex__ make copy.copy set attributes with an unguarded
# setattr, which empties the typing proxy's deny list (a slot replaced on its class), and
# typing.get_type_hints then evaluates an annotation chosen at run time with the real builtins.
ENUM_TO_REAL_BUILTINS = """
def reduce(self, protocol):
    return (lambda: type(typing), (), (None, {"_denied": frozenset()}))
E = enum.Enum("E", [(U + "copy" + U, None), (U + "reduce_ex" + U, reduce), ("a", 1)])
copy.copy(E.a)
code = "sink.value.append(" + U + "import" + U + "('os').listdir('/')) or 'int'"
H = enum.Enum("H", [(U + "annotations" + U, {"x": code}), ("sink", [])])
typing.get_type_hints(H)
out = "real os: " + repr(H.sink.value)
"""


def test_enum_functional_api_defines_no_dunders(sandbox_backend):
    refused(sandbox_backend, ENUM_TO_REAL_BUILTINS, "enum's functional API")


def test_dataclass_refuses_dunder_annotations_however_the_class_was_made():
    """In-process: a class built from a dict (enum's functional API did it) with a dunder
    annotation; dataclass() would read object.__getattribute__ as that field's default."""
    import dataclasses

    from trace_gym.sandbox.language import ENV_CLASSES, Refused, _checked_dataclasses

    made = type("Made", (), {D + "annotations" + D: {D + "getattribute" + D: int}})
    ENV_CLASSES.add(made)  # as env code's own (dataclass() of any other class is refused before this check)
    with pytest.raises(Refused, match="field named '__getattribute__'"):
        _checked_dataclasses(dataclasses.dataclass)(made)
    with pytest.raises(Refused, match="field named '__getattribute__'"):
        _checked_dataclasses(dataclasses.dataclass)(eq=False)(made)


def test_copyreg_reductors_cannot_set_attributes_of_stdlib_classes(sandbox_backend):
    """copy's dispatch_table (copyreg's): a reductor's state is applied with setattr, unguarded."""
    body = """
    class Box:
        pass
    copy.dispatch_table[Box] = lambda box: (lambda: string.Template, (), (None, {"safe_substitute": lambda self: "changed"}))
    copy.copy(Box())
    out = string.Template("unchanged").safe_substitute()
    """
    refused(sandbox_backend, body, "copy.dispatch_table is not on the sandbox's allowlist")


def test_legitimate_dataclasses_enums_and_containers_still_run(sandbox_backend):
    body = """
    @dataclasses.dataclass(frozen=True)
    class P:
        a: int
        b: str = "x"
        c: list = dataclasses.field(default_factory=list)
    @dataclasses.dataclass
    class Q:
        n: int = 0
    class Color(enum.Enum):
        RED = 1
    class R(random.Random):
        pass
    p, q, r = P(1), Q(), R(3)
    q.n += 1
    r.extra = 2
    counts = collections.Counter()
    counts["k"] += 1
    table = collections.defaultdict(list)
    table["a"].append(1)
    del table["a"]
    out = repr((dataclasses.asdict(p), dataclasses.astuple(p), dataclasses.replace(p, a=2).a,
                [f.name for f in dataclasses.fields(P)], q.n, r.extra, counts["k"], dict(table), Color.RED.value))
    """
    out = step_once(sandbox_backend, body)
    assert out == "({'a': 1, 'b': 'x', 'c': []}, (1, 'x', []), 2, ['a', 'b', 'c'], 1, 2, 1, {}, 1)"


def test_attributes_of_stdlib_objects_are_not_writable_but_their_items_are():
    """In-process check of the write guard itself (the worker runs the same one)."""
    import collections

    from trace_gym.sandbox.language import Refused, guarded_write

    counts = collections.Counter()
    guarded_write(counts)["k"] = 1
    assert counts == {"k": 1}
    with pytest.raises(Refused, match="changing attribute"):
        guarded_write(counts).most_common = len


def test_super_does_not_reach_a_stdlib_base_private_attribute(sandbox_backend):
    """``E`` defines ``_randbelow`` too; ``super(E, e)._randbelow`` resolves past it to
    random.Random's own (a method of an object env code did not define)."""
    body = """
    class R(random.Random):
        _randbelow = 1
    self = super(R, R(1))
    out = repr(self._randbelow)
    """
    refused(sandbox_backend, body, "private attribute '_randbelow'")


def test_env_private_helpers_still_reach_through_super(sandbox_backend):
    body = """
    class A:
        def _helper(self):
            return "a"
    class B(A):
        def _helper(self):
            self = super(B, self)
            return "b" + self._helper()
        def run(self):
            self._order = 3
            return self._helper() + str(self._order)
    out = B().run()
    """
    assert step_once(sandbox_backend, body) == "ba3"


def test_type_of_a_proxy_is_not_the_worker_class():
    """In-process: ``type(random)`` handed env code the worker's ModuleProxy class,
    whose slots an unguarded setattr could replace (break 6 emptied its deny list so)."""
    import random

    from trace_gym.sandbox.language import ModuleProxy, Refused, guarded_type

    proxy = ModuleProxy(random, "random")
    for handed_out in (proxy, proxy.shuffle):
        with pytest.raises(Refused, match="proxy"):
            guarded_type(handed_out)
    assert guarded_type(1) is int
