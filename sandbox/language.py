"""The language layer's run time: the guards that compiled env code calls.

What it is for: the second of the layers (static gate, language layer,
worker, OS jail). The host compiles env.py with RestrictedPython
(``gate.compile_env``, the kept library named by the design card), which
turns every attribute read into ``_getattr_(obj, name)``, every attribute or
item write into ``_write_(obj)...``, every class statement into one with
``metaclass=__metaclass__``, and refuses at compile time what it refuses (see
gate.py). The worker runs that code, inside the jail, in the namespace
``env_globals`` builds here: these guards, restricted builtins and module
proxies.

The guards refuse at run time, whatever way the name was spelled: dunders;
private names of objects env code did not define (single-underscore names
pass only on instances and classes that env code defined, for attributes found
in those classes or the instance's own dict); every attribute whose prefix is
a frame, code, traceback, generator or coroutine internal (``gi_``, ``f_``,
``tb_``, ``co_``, ``cr_``, ``ag_``, ``func_``, ``im_``: a superset of
RestrictedPython's list); ``mro``; ``str.format`` fields that walk attributes or
items; ``format_map``; three-argument ``type()`` and ``type()`` of a class (a
metaclass); changes to classes, modules and functions env code did not define,
and to attributes of their instances; metaclass bases.

The standard library is open by allowlist (``MODULES``: per module, the names
env code may use), the one policy the static gate reads too. Module proxies
hand out only those names, and wrap every function they hand out (and the
functions those return) so that no ``__func__``/``__globals__``/``__self__`` is
reachable. Stdlib calls that read or write attributes by names taken from data
get those names checked as plain identifiers where they enter
(``CHECKED_CALLS``: dataclass fields, namedtuple fields); Enum's functional API,
which builds a class from a dict and writes into a module named by data, is
refused in the jail's copy of ``enum``.

Must not: import anything beyond the standard library (it runs inside the
jail, where only the standard library is), or hand env code any object of
the worker.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import functools
import keyword
import operator
import re
import string
import types
import weakref

LAYER = "the language layer (RestrictedPython guards)"
INTROSPECTION_PREFIXES = ("gi_", "ag_", "cr_", "f_", "tb_", "co_", "func_", "im_")
INTROSPECTION_NAMES = frozenset({"mro", "format_map"})
PRIVATE_NAME = re.compile(r"_[A-Za-z0-9](\w*[A-Za-z0-9])?")
RESERVED_NAMES = frozenset({"_print"})  # RestrictedPython's own helper name

# The standard library env code may use, by allowlist: per module, the names it may
# import or read, and nothing else (sandbox/README.md says why each is there). The
# one definition of this policy: the static gate (gate.py) refuses any other import
# or attribute of a module at compile time, the module proxies below at run time.
# Left out on purpose: whatever reads, writes or executes by names taken from data
# (functools.update_wrapper/wraps, typing.TypedDict/get_type_hints/ForwardRef,
# dataclasses.make_dataclass, enum.global_enum, copy.dispatch_table, string.Formatter,
# functools.singledispatch), the wall clock's only way in besides datetime (time),
# and collections.abc (abstract classes built by a metaclass; no env needs them).
MODULES: dict[str, frozenset[str]] = {
    name: frozenset(names.split())
    for name, names in {
        "json": "dumps loads JSONDecodeError",
        "random": "Random random randint randrange choice choices sample shuffle uniform gauss seed getrandbits",
        "math": "acos acosh asin asinh atan atan2 atanh ceil comb copysign cos cosh degrees dist e erf erfc exp expm1 "
        "fabs factorial floor fmod frexp fsum gamma gcd hypot inf isclose isfinite isinf isnan isqrt lcm ldexp "
        "lgamma log log10 log1p log2 modf nan perm pi pow prod radians remainder sin sinh sqrt tan tanh tau trunc",
        "re": "compile match search fullmatch findall finditer sub subn split escape error Pattern Match "
        "IGNORECASE I MULTILINE M DOTALL S VERBOSE X ASCII A",
        "datetime": "date datetime time timedelta timezone MINYEAR MAXYEAR",
        "collections": "Counter defaultdict OrderedDict deque namedtuple ChainMap",
        "itertools": "count cycle repeat accumulate chain compress dropwhile filterfalse groupby islice pairwise starmap "
        "takewhile tee zip_longest product permutations combinations combinations_with_replacement",
        "functools": "reduce partial lru_cache cache cmp_to_key",
        "string": "ascii_letters ascii_lowercase ascii_uppercase digits hexdigits octdigits punctuation whitespace "
        "printable capwords Template",
        "typing": "Any Optional Union List Dict Tuple Set FrozenSet Callable Iterable Iterator Sequence Mapping "
        "NamedTuple Literal",
        "enum": "Enum IntEnum Flag IntFlag auto unique",
        "copy": "copy deepcopy",
        "dataclasses": "dataclass field fields asdict astuple replace is_dataclass",
        # the world kit (world.py beside the worker): plain data in, plain data out
        "world": "retail_address retail_user retail_item retail_order retail_orders retail_answer retail_made "
        "retail_typed retail_products retail_stock retail_login retail_spelled retail_play retail_step "
        "called before logged_in read_ids figures script graded "
        "RETAIL_TOOLS RETAIL_ID_LISTS PAYMENT_SOURCES ADDRESS_FIELDS CANCEL_REASONS CANCEL_SAID "
        "airline_user airline_flight airline_reservation airline_answer airline_play airline_step "
        "AIRLINE_TOOLS AIRLINE_PAYMENT_SOURCES AIRPORTS CABINS MEMBERSHIPS FLIGHT_STATUSES AIRLINE_TODAY",
    }.items()
}
ALLOWED_MODULES = tuple(MODULES)
# Dunders that a class namespace may hold: Python's own and the methods RestrictedPython lets env code define.
CLASS_DUNDERS = frozenset(
    {
        "__module__",
        "__qualname__",
        "__doc__",
        "__annotations__",
        "__classcell__",
        "__orig_bases__",
        "__static_attributes__",
        "__firstlineno__",
        "__init__",
        "__contains__",
        "__lt__",
        "__le__",
        "__eq__",
        "__ne__",
        "__gt__",
        "__ge__",
        "__hash__",
    }
)
SAFE_BUILTINS = (
    "abs all any ascii bin bool bytearray bytes callable chr classmethod complex dict divmod enumerate "
    "filter float format frozenset hash hex id int isinstance issubclass iter len list map max min next "
    "object oct ord pow property range repr reversed round set slice sorted staticmethod str sum super "
    "tuple zip ArithmeticError AssertionError AttributeError BaseException Exception IndexError "
    "KeyError LookupError NameError NotImplementedError OverflowError RecursionError RuntimeError "
    "StopIteration TypeError ValueError ZeroDivisionError NotImplemented Ellipsis True False None "
    "__build_class__"
).split()


class ImportRefused(ImportError):
    """An import the sandbox's importer does not allow (the static gate refuses the
    spelled ones; this catches any that reach ``__import__`` at run time)."""


class Refused(AttributeError):
    """An attribute, name or call the language layer does not allow."""

    def __init__(self, what: str):
        super().__init__(f"{what}: refused by {LAYER}")


# --- run time: the guards ------------------------------------------------------------------
ENV_CLASSES: weakref.WeakSet = weakref.WeakSet()


def _env_owns(obj, name: str) -> bool:
    """``obj.<name>`` resolves to env code's own: the instance's dict, or the first
    class that defines it in the lookup order is an env class (for ``super()``,
    the order after its class: ``super(E, e)._x`` must not reach a stdlib base's
    ``_x`` because ``E`` defines one too)."""
    after = None
    if isinstance(obj, super):  # super()._helper() in an env class: judged on the instance
        after = obj.__thisclass__
        obj = obj.__self__
    cls = obj if isinstance(obj, type) else type(obj)
    mro = type.__getattribute__(cls, "__mro__")
    if not any(c in ENV_CLASSES for c in mro):
        return False
    if after is not None:
        mro = mro[mro.index(after) + 1 :] if after in mro else ()
    elif not isinstance(obj, type):
        try:
            own = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            own = None
        if isinstance(own, dict) and name in own:
            return True
    for c in mro:
        if name in type.__getattribute__(c, "__dict__"):
            return c in ENV_CLASSES
    return False


def refusal(obj, name) -> str | None:
    """Why reading ``obj.<name>`` is refused, or None."""
    if type(name) is not str:  # a str subclass could answer startswith() as it likes
        return "an attribute name that is not a plain string"
    if name.startswith("__") or name.endswith("__"):
        return f"dunder attribute '{name}'"
    if name.startswith(INTROSPECTION_PREFIXES) or name in INTROSPECTION_NAMES:
        return f"introspection attribute '{name}'"
    if name.startswith("_") and not (PRIVATE_NAME.fullmatch(name) and _env_owns(obj, name)):
        return f"private attribute '{name}' of an object env code did not define"
    return None


def guarded_getattr(obj, name, *default):
    why = refusal(obj, name)
    if why:
        raise Refused(why)
    if isinstance(obj, super) and obj.__thisclass__ not in ENV_CLASSES:
        # super(X, ...) of a class env code did not define looks past the worker's overrides (the fixed clock's
        # datetime.now, a proxy's refusals) into the real class; super() inside env classes is unaffected
        raise Refused(f"super({obj.__thisclass__.__name__}, ...), past a class env code did not define")
    if isinstance(obj, BaseException) and name == "obj":
        # AttributeError.obj is the object a lookup failed on: inside stdlib code, an object of the worker's
        raise Refused("attribute 'obj' of an exception (the object a failed lookup was made on)")
    if name == "register" and isinstance(obj, abc.ABCMeta):
        # register() on an env subclass of an ABC changes isinstance() for the stdlib ABC above it too
        raise Refused("register() of an abstract base class (it writes into the stdlib's ABC registry)")
    if type(obj).__module__ == "typing":
        # typing's aliases hand ordinary attribute names to their origin class (typing.Mapping.register is
        # collections.abc.Mapping.register, which writes into the stdlib's ABC registry): annotations only
        raise Refused(f"attribute '{name}' of a typing alias (typing names are for annotations)")
    if name in ("format", "format_map") and (isinstance(obj, str) or obj is str):
        return _str_format(obj) if name == "format" and isinstance(obj, str) else _refuse_call(f"str.{name}")
    value = getattr(obj, name, *default)
    if isinstance(value, types.ModuleType):
        raise Refused(f"module reached through '{name}'")
    if _is_str_format(value):  # reached another way (super(str, s).format...): the same rule
        owner = getattr(value, "__self__", None)
        if value.__name__ == "format" and isinstance(owner, str):
            return _str_format(owner)
        return _refuse_call(f"str.{value.__name__}")
    return value


_STR_FORMATTERS = (str.format, str.format_map)


def _is_str_format(value) -> bool:
    """str.format or format_map, bound or not, whatever object handed it out."""
    if isinstance(value, types.MethodDescriptorType):
        return value in _STR_FORMATTERS
    return (
        isinstance(value, types.BuiltinMethodType)
        and isinstance(getattr(value, "__self__", None), str)
        and value.__name__ in ("format", "format_map")
    )


def _str_format(template: str):
    """``template.format`` as env code gets it: call-only (a raw ``partial`` would hand
    out the worker's own ``safe_format`` function as ``.func``)."""
    return FunctionProxy(functools.partial(safe_format, template), "str.format")


def _refuse_call(what: str):
    def refused(*args, **kwargs):
        raise Refused(what)

    return refused


_FIELD = re.compile(r"\w*")


def safe_format(template: str, *args, **kwargs) -> str:
    """``str.format`` whose fields name arguments only (no ``.attr`` or ``[key]`` walks)."""
    for _, field, spec, _ in string.Formatter().parse(template):
        if field is not None and not _FIELD.fullmatch(field):
            raise Refused(f"format field '{field}' (only plain names or positions)")
        if spec and "{" in spec:
            raise Refused(f"nested format field in '{spec}'")
    return template.format(*args, **kwargs)


def guarded_write(obj):
    """RestrictedPython's ``_write_``: the target of every attribute *and* item write.
    Classes, modules and functions env code did not define are refused; so are the
    attributes of instances of such classes (a dataclass ``Field``'s name, a
    stdlib object's private state: a name chosen at run time that stdlib code then
    reads with ``getattr``), while their items stay writable (``counts[k] += 1``)."""
    if isinstance(obj, type) and obj not in ENV_CLASSES:
        raise Refused(f"changing class '{obj.__name__}', which env code did not define")
    if isinstance(
        obj,
        (types.ModuleType, ModuleProxy, FunctionProxy, types.FunctionType, types.BuiltinFunctionType, types.MethodType),
    ):
        raise Refused("changing a module or a function")
    if isinstance(obj, type) or type(obj) in (dict, list) or _env_instance(obj):
        return obj
    return ItemsOnly(obj)


def _env_instance(obj) -> bool:
    return any(c in ENV_CLASSES for c in type.__getattribute__(type(obj), "__mro__"))


class Uncopyable:
    """The worker's own wrappers (module and function proxies, write targets) hold
    the real objects in their slots; ``copy``/pickling reads slots as data
    (``object.__reduce_ex__``) past every guard, so they refuse to be copied."""

    __slots__ = ()

    def __reduce_ex__(self, protocol):
        raise Refused(f"copying or pickling a {type(self).__name__}")

    def __reduce__(self):
        raise Refused(f"copying or pickling a {type(self).__name__}")

    def __copy__(self):
        raise Refused(f"copying a {type(self).__name__}")

    def __deepcopy__(self, memo):
        raise Refused(f"copying a {type(self).__name__}")


class ItemsOnly(Uncopyable):
    """The write target for an object env code did not define: items only."""

    __slots__ = ("_target",)

    def __init__(self, target):
        object.__setattr__(self, "_target", target)

    def __setitem__(self, key, value):
        object.__getattribute__(self, "_target")[key] = value

    def __delitem__(self, key):
        del object.__getattribute__(self, "_target")[key]

    def __setattr__(self, name, value):
        raise Refused(
            f"changing attribute '{name}' of a {type(object.__getattribute__(self, '_target')).__name__}, which env code did not define"
        )

    def __delattr__(self, name):
        self.__setattr__(name, None)


def guarded_hasattr(obj, name) -> bool:
    if refusal(obj, name):
        return False
    return hasattr(obj, name)


PLAIN_TYPES = frozenset(
    {int, float, complex, str, bytes, bool, type(None), list, dict, tuple, set, frozenset, range, slice}
)


def guarded_build_class(func, name, *bases, **kwargs):
    """``__build_class__`` with every base a class or one of typing's forms (an alias,
    the checked NamedTuple): an object of env code's among the bases would be compared
    (``__eq__``) by typing's ``__mro_entries__`` with typing's own internals."""
    for base in bases:
        if not (isinstance(base, type) or type(base).__module__ == "typing" or isinstance(base, _CheckedNamedTuple)):
            raise Refused(f"class {name} with a base that is not a class (a {type(base).__name__})")
    return builtins.__build_class__(func, name, *bases, **kwargs)


def guarded_type(*args):
    """``type(x)``, by allowlist: plain data types, env code's own classes, exceptions
    of the builtins, and classes of the allowed modules that env code may call
    anyway (``MODULES``). Anything else (``types.MethodType`` from a bound method,
    typing's internal alias classes, function and descriptor types, metaclasses)
    would be a constructor env code was never given."""
    if len(args) != 1:
        raise Refused("type() with three arguments (a class from a dict)")
    kind = type(args[0])
    if _is_metaclass(kind):  # type(int)("X", (), {...}) would be type() with three arguments
        raise Refused("type() of a class (its metaclass builds classes from a dict)")
    if kind in (ModuleProxy, FunctionProxy):  # the worker's own classes
        raise Refused("type() of a module or function proxy")
    if kind in PLAIN_TYPES or any(c in ENV_CLASSES for c in type.__getattribute__(kind, "__mro__")):
        return kind
    if issubclass(kind, BaseException) and kind.__module__ == "builtins":
        return kind
    if kind in _module_classes():
        return kind
    raise Refused(
        f"type() of a {kind.__name__} (only plain data, env code's classes, builtin exceptions and the "
        "allowed modules' classes)"
    )


def _module_classes() -> set:
    """The classes env code can reach through the allowlist (the fixed clock's included)."""
    if not _MODULE_CLASSES and _MODULES_SEEN:
        for name, module in _MODULES_SEEN.items():
            for attr in MODULES.get(name, ()):
                value = REPLACED.get((name, attr), getattr(module, attr, None))
                if isinstance(value, type) and not _is_metaclass(value):
                    _MODULE_CLASSES.add(value)
    return _MODULE_CLASSES


_MODULE_CLASSES: set = set()
_MODULES_SEEN: dict = {}


def _is_metaclass(value) -> bool:
    return isinstance(value, type) and issubclass(value, type)


def guarded_getitem(obj, key):
    return obj[key]


def unpack_sequence(value, spec, getiter):
    """``a, (b, c) = value``: each level listed through the iteration guard
    (RestrictedPython's unpacking spec: ``min_len`` and the ``childs`` to recurse into)."""
    items = list(getiter(value))
    if len(items) >= spec["min_len"]:
        for index, child in spec["childs"]:
            items[index] = unpack_sequence(items[index], child, getiter)
    return items


def iter_unpack_sequence(iterable, spec, getiter):
    """``for a, b in iterable``: each item unpacked as above."""
    for value in getiter(iterable):
        yield unpack_sequence(value, spec, getiter)


def apply(function, *args, **kwargs):
    return function(*args, **kwargs)


_INPLACE = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "|=": operator.ior,
    "^=": operator.ixor,
    "&=": operator.iand,
    "@=": operator.imatmul,
}


def inplacevar(op: str, x, y):
    return _INPLACE[op](x, y)


BUILTIN_DATA = (str, bytes, int, float, list, dict, tuple, set, frozenset)


class EnvMeta:
    """Every class statement of env code goes through here (RestrictedPython adds
    ``metaclass=__metaclass__``): the real metaclass of its bases builds it, the
    namespace may hold no dunder beyond Python's own and the allowed methods, and
    the class is remembered as env code's own."""

    @staticmethod
    def _winner(bases):
        meta = type
        for base in bases:
            candidate = type(base)
            if issubclass(candidate, meta):
                meta = candidate
        return meta

    def __prepare__(self, name, bases, **kwargs):
        return self._winner(bases).__prepare__(name, bases, **kwargs)

    def __call__(self, name, bases, namespace, **kwargs):
        if any(_is_metaclass(base) for base in bases):
            raise Refused(f"class {name} deriving from a metaclass (it would build classes from a dict)")
        extra = [
            k
            for k in namespace
            if isinstance(k, str) and k.startswith("__") and k.endswith("__") and k not in CLASS_DUNDERS
        ]
        if extra:
            raise Refused(f"class {name} defining {', '.join(sorted(extra))}")
        for base in bases:  # stdlib code calls these methods on what it is given, with its own data as arguments
            builtin = next((t for t in BUILTIN_DATA if isinstance(base, type) and issubclass(base, t)), None)
            hooks = sorted(
                k
                for k in namespace
                if builtin is not None and isinstance(k, str) and hasattr(builtin, k) and not k.startswith("__")
            )
            if hooks:
                raise Refused(
                    f"class {name} overriding {builtin.__name__}.{hooks[0]} (stdlib code calls it with its own data)"
                )
        cls = self._winner(bases)(name, bases, namespace, **kwargs)
        ENV_CLASSES.add(cls)
        return cls


class PrintCollector:
    """RestrictedPython's ``print`` hook, writing to the worker's capped buffer."""

    sink = None

    def __init__(self, _getattr_=None):
        self.parts = []

    def write(self, text):
        self.parts.append(text)
        if PrintCollector.sink is not None:
            PrintCollector.sink.write(text)

    def __call__(self):
        return "".join(self.parts)

    def _call_print(self, *objects, sep=" ", end="\n", **_):
        self.write(sep.join(str(o) for o in objects) + end)


# --- run time: module proxies --------------------------------------------------------------
class FunctionProxy(Uncopyable):
    """A stdlib function handed to env code: callable, and nothing else."""

    __slots__ = ("_fn", "_name")

    def __init__(self, fn, name):
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        return wrap(
            object.__getattribute__(self, "_fn")(*args, **kwargs), object.__getattribute__(self, "_name") + "()"
        )

    def __getattr__(self, attr):
        raise Refused(f"attribute '{attr}' of {object.__getattribute__(self, '_name')}")

    def __setattr__(self, attr, value):
        raise Refused("changing a function")

    def __repr__(self):
        return "<function %s>" % object.__getattribute__(self, "_name")


class ModuleProxy(Uncopyable):
    """The allowlisted names of an allowed module (``MODULES``), each wrapped; nothing else."""

    __slots__ = ("_module", "_name", "_allowed")

    def __init__(self, module, name):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_allowed", MODULES.get(name, frozenset()))

    def __getattr__(self, attr):
        name = object.__getattribute__(self, "_name")
        if attr not in object.__getattribute__(self, "_allowed"):
            raise Refused(f"{name}.{attr} is not on the sandbox's allowlist")
        if (name, attr) in REPLACED:
            return REPLACED[name, attr]
        value = getattr(object.__getattribute__(self, "_module"), attr)
        checker = CHECKED_CALLS.get((name, attr))
        if checker is not None:
            return FunctionProxy(checker(value), f"{name}.{attr}")
        return wrap(value, f"{name}.{attr}")

    def __setattr__(self, attr, value):
        raise Refused("changing a module")

    def __repr__(self):
        return "<module %s>" % object.__getattribute__(self, "_name")


_CALLABLES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodWrapperType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
)


def wrap(value, name: str):
    """What a proxy hands out: modules as proxies (allowed ones only), functions as
    call-only proxies, everything else (classes, constants, data) as it is."""
    if isinstance(value, types.ModuleType):
        sub = value.__name__
        if sub in ALLOWED_MODULES:
            return ModuleProxy(value, sub)
        raise Refused(f"{name} is not an allowed module")
    if _is_metaclass(value):  # enum.EnumType, collections.abc.ABCMeta, typing.get_origin(typing.Type[int])
        raise Refused(f"{name} is a metaclass (it builds classes from a dict)")
    if (
        isinstance(value, _CALLABLES)
        and getattr(value, "__module__", None) != "env"
        and not hasattr(value, "__mro_entries__")
    ):
        return FunctionProxy(value, name)  # (typing.NamedTuple and TypedDict are functions used as bases: kept)
    return value


def plain_identifier(name) -> bool:
    """A name passed as data (a field, a member, a namedtuple's field) that stdlib code
    will read or write as an attribute: an identifier, not a keyword, not private
    (``_x``) and not a dunder."""
    return type(name) is str and name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


DATACLASS_READERS = ("dataclass", "fields", "asdict", "astuple", "replace")


def _check_field_names(names, where: str) -> None:
    for name in names:
        if not plain_identifier(name):
            raise Refused(
                f"{where} of a field named {name!r} (a name stdlib code reads and writes as an attribute: "
                "plain identifiers only)"
            )


def _dataclass_field_names(obj) -> list:
    fields = getattr(obj, "__dataclass_fields__", None)
    if not isinstance(fields, dict):
        return []
    return list(fields) + [getattr(f, "name", None) for f in fields.values()]


def _checked_dataclasses(real):
    """dataclasses functions that read or set attributes by field names: every field
    name (annotations before ``dataclass`` runs, fields after; the fields of the
    object given to ``fields``/``asdict``/``astuple``/``replace``) is checked like an
    attribute name, so a field cannot be a runtime-built dunder."""
    where = f"dataclasses.{real.__name__}"

    def decorate(cls, make):
        if not (isinstance(cls, type) and cls in ENV_CLASSES):
            raise Refused(f"{where} of {getattr(cls, '__name__', type(cls).__name__)}, which env code did not define")
        if isinstance(cls, type):
            annotations = type.__getattribute__(cls, "__dict__").get("__annotations__", {})
            _check_field_names(list(annotations) if isinstance(annotations, dict) else [None], where)
            if not type.__getattribute__(cls, "__dict__").get("__doc__"):
                # dataclass writes a missing docstring from inspect.signature(cls), which may parse a base
                # class's docstring as a signature and eval() the dotted names in it against sys.modules
                type.__setattr__(cls, "__doc__", cls.__name__)
        made = make(cls)
        _check_field_names(_dataclass_field_names(made), where)
        return made

    def checked(*args, **kwargs):
        if real is dataclasses.dataclass:
            if args:
                return decorate(args[0], lambda cls: real(cls, *args[1:], **kwargs))
            return lambda cls: decorate(cls, lambda c: real(c, **kwargs))
        if args:
            _check_field_names(_dataclass_field_names(args[0]), where)
        return real(*args, **kwargs)

    return checked


def _checked_namedtuple(real):
    """collections.namedtuple with its type and field names checked as plain
    identifiers, and no ``module=`` (it would name a module the class claims)."""

    def checked(typename, field_names, **kwargs):
        if set(kwargs) - {"defaults"}:
            raise Refused(
                f"collections.namedtuple with {', '.join(sorted(set(kwargs) - {'defaults'}))}= (only defaults=)"
            )
        names = field_names.replace(",", " ").split() if isinstance(field_names, str) else list(field_names)
        _check_field_names([typename, *names], "collections.namedtuple")
        made = real(typename, names, **kwargs)
        ENV_CLASSES.add(made)  # made for env code from names it gave: its own, like a class statement's
        return made

    return checked


CHECKED_CALLS = {("dataclasses", name): _checked_dataclasses for name in DATACLASS_READERS}
CHECKED_CALLS["collections", "namedtuple"] = _checked_namedtuple


# --- a fixed clock -------------------------------------------------------------------------
FIXED_NOW = (2025, 1, 6, 12, 0, 0)
"""The only time env code can read (``datetime.date.today()``, ``datetime.datetime.now()``...):
a fixed instant, the same in validation and training, so that no env can behave one
way on the day it was validated and another later."""
FIXED_CLOCK: dict = {}
REPLACED = FIXED_CLOCK  # (module, name) -> what env code gets instead: the fixed clock, the plain-data copies


def fixed_clock(module) -> None:
    """``datetime.date`` and ``datetime.datetime`` as env code gets them: subclasses
    whose clock reads return ``FIXED_NOW``, with ``min``/``max`` of their own class
    (the real classes' instances would lead back to the real clock)."""
    real_date, real_datetime = module.date, module.datetime

    class date(real_date):
        __slots__ = ()

        @classmethod
        def today(cls):
            return cls(*FIXED_NOW[:3])

    class datetime(real_datetime):
        __slots__ = ()

        @classmethod
        def now(cls, tz=None):
            fixed = cls(*FIXED_NOW, tzinfo=module.timezone.utc)
            return fixed.replace(tzinfo=None) if tz is None else fixed.astimezone(tz)

        @classmethod
        def today(cls):
            return cls(*FIXED_NOW)

        @classmethod
        def utcnow(cls):
            return cls(*FIXED_NOW)

        def date(self):  # the real method returns the real date class, whose today() reads the real clock
            return FIXED_CLOCK["datetime", "date"](self.year, self.month, self.day)

    for fixed, real in ((date, real_date), (datetime, real_datetime)):
        fixed.min, fixed.max = (
            fixed.combine(real.min, module.time()) if fixed is datetime else fixed(1, 1, 1),
            fixed.combine(real.max, module.time.max) if fixed is datetime else fixed(9999, 12, 31),
        )
        fixed.__module__ = "datetime"
        fixed.__name__ = f"datetime.{real.__name__}"  # what repr() prints, as for the real class
    FIXED_CLOCK.update({("datetime", "date"): date, ("datetime", "datetime"): datetime})


# --- copies of plain data, never by reduction ------------------------------------------------
MAX_COPY_DEPTH = 200


def plain_copy(value, deep: bool):
    """``copy.copy``/``copy.deepcopy`` as env code gets them. The stdlib's copy reduces
    an object (``__reduce_ex__``) and calls whatever callable the reduction names:
    ``getattr`` for a bound method, ``operator.getitem`` on typing's globals for an
    alias, the slots of the worker's proxies as data. Env code copies its task state,
    so this copies plain data and env code's own objects itself, with no reduction at
    all: containers, env classes' instances (their ``__dict__``), NamedTuples, Random
    generators; immutable values (numbers, text, dates, enum members, functions) are
    shared as the stdlib shares them; anything else is refused."""
    import collections
    import datetime
    import enum
    import random

    atomic = (
        int,
        float,
        complex,
        str,
        bytes,
        bool,
        type(None),
        range,
        datetime.date,
        datetime.time,
        datetime.timedelta,
        datetime.tzinfo,
        enum.Enum,
        type,
        FunctionProxy,
        ModuleProxy,
        types.FunctionType,
        types.MethodType,
        types.BuiltinFunctionType,
        functools.partial,
        re.Pattern,
    )
    memo: dict = {}

    def copy_of(x, depth: int):
        if isinstance(x, atomic):
            return x
        if depth > MAX_COPY_DEPTH:
            raise Refused(f"copy of data nested deeper than {MAX_COPY_DEPTH}")
        if id(x) in memo:
            return memo[id(x)]
        inner = (lambda v: copy_of(v, depth + 1)) if deep else (lambda v: v)
        kind = type(x)
        env = any(c in ENV_CLASSES for c in type.__getattribute__(kind, "__mro__"))
        if isinstance(x, tuple):
            items = [inner(v) for v in x]
            new = kind(*items) if env else tuple(items) if kind is tuple else None
        elif kind in (list, set, frozenset, collections.deque):
            new = kind() if kind is not collections.deque else collections.deque(maxlen=x.maxlen)
            memo[id(x)] = new
            items = [inner(v) for v in x]
            new = frozenset(items) if kind is frozenset else new
            if kind is list or kind is collections.deque:
                new.extend(items)
            elif kind is set:
                new.update(items)
        elif kind in (dict, collections.OrderedDict, collections.Counter, collections.defaultdict):
            new = kind(x.default_factory) if kind is collections.defaultdict else kind()
            memo[id(x)] = new
            for k, v in x.items():
                new[inner(k)] = inner(v)
        elif isinstance(x, random.Random) and (kind is random.Random or env):
            new = kind.__new__(kind)
            new.setstate(x.getstate())
        elif env and kind.__new__ is object.__new__:
            new = object.__new__(kind)
        else:
            new = None
        if new is None:
            raise Refused(f"copy of a {kind.__name__} (plain data and env code's own objects only)")
        memo[id(x)] = new
        if env and not isinstance(x, tuple):
            try:
                own = object.__getattribute__(x, "__dict__")
            except AttributeError:
                raise Refused(f"copy of a {kind.__name__} without a __dict__ (slots)") from None
            target = object.__getattribute__(new, "__dict__")
            for k, v in own.items():
                target[k] = inner(v)
        return new

    return copy_of(value, 0)


def _copy(x):
    return plain_copy(x, deep=False)


def _deepcopy(x, *args, **kwargs):
    if args or kwargs:  # the stdlib keeps the originals it reduced in a caller's memo
        raise Refused("copy.deepcopy with a memo (only copy.deepcopy(x))")
    return plain_copy(x, deep=True)


class _CheckedNamedTuple(Uncopyable):
    """``typing.NamedTuple`` as env code gets it: usable as a base of a class statement,
    and its functional form with its type and field names checked as plain identifiers
    (a callable whose name is a dunder is what a reduction by name needs)."""

    __slots__ = ("_real",)

    def __init__(self, real):
        object.__setattr__(self, "_real", real)

    def __call__(self, typename, fields=None, **kwargs):
        names = [f[0] if isinstance(f, (tuple, list)) and f else f for f in (fields or [])]
        _check_field_names([typename, *names, *kwargs], "typing.NamedTuple")
        made = object.__getattribute__(self, "_real")(typename, fields, **kwargs)
        ENV_CLASSES.add(made)
        return made

    def __mro_entries__(self, bases):
        real = object.__getattribute__(self, "_real")
        return real.__mro_entries__(tuple(real if base is self else base for base in bases))


def guard_stdlib(modules: dict) -> None:
    """Changes to the worker's own copy of the standard library, made before env code
    runs (the worker calls this in the jail; the host's modules are never changed).

    Enum's functional API (``enum.Enum("E", names, module=...)``) builds a class from
    a dict that no class statement, hence no EnvMeta, sees, and writes into a module
    named by data: a member named ``__reduce_ex__`` or ``__annotations__`` would be a
    class attribute, and ``module=`` plus ``global_enum`` put members into any loaded
    module's globals. Env code declares enums with a class statement; the functional
    API is refused."""
    fixed_clock(modules["datetime"])
    # asdict/astuple deep-copy every field value that is not a dataclass or container with the copy module:
    # the jail's dataclasses gets the plain-data copy instead, so no reduction runs there either
    modules["dataclasses"].copy = types.SimpleNamespace(deepcopy=lambda x, memo=None: plain_copy(x, deep=True))
    REPLACED.update(
        {
            ("copy", "copy"): FunctionProxy(_copy, "copy.copy"),
            ("copy", "deepcopy"): FunctionProxy(_deepcopy, "copy.deepcopy"),
            ("typing", "NamedTuple"): _CheckedNamedTuple(modules["typing"].NamedTuple),
        }
    )
    _MODULES_SEEN.update(modules)
    _MODULE_CLASSES.clear()
    enum_type = modules["enum"].EnumType
    if getattr(enum_type.__dict__["_create_"], "checked_by_language_layer", False):
        return

    def _create_(cls, class_name, names, **kwargs):
        raise Refused("enum's functional API (Enum('Name', members)): declare an enum with a class statement")

    _create_.checked_by_language_layer = True
    enum_type._create_ = _create_


# --- the namespace ------------------------------------------------------------------------------
def env_globals(modules: dict, print_sink) -> dict:
    """Globals for the compiled env code: guards, restricted builtins, module proxies."""
    table = {name: getattr(builtins, name) for name in SAFE_BUILTINS if hasattr(builtins, name)}
    proxies = {name: ModuleProxy(mod, name) for name, mod in modules.items()}

    def safe_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in proxies:
            raise ImportRefused("import of %r is not allowed in the sandbox" % name)
        if "." in name and not fromlist:
            return proxies[name.split(".")[0]]
        return proxies[name]

    table.update(
        {
            "__import__": safe_import,
            "hasattr": guarded_hasattr,
            "type": guarded_type,
            "__build_class__": guarded_build_class,
        }
    )
    PrintCollector.sink = print_sink
    return {
        "__builtins__": table,
        "__name__": "env",
        "__metaclass__": EnvMeta(),
        "_getattr_": guarded_getattr,
        "_write_": guarded_write,
        "_getitem_": guarded_getitem,
        "_getiter_": iter,
        "_iter_unpack_sequence_": iter_unpack_sequence,
        "_unpack_sequence_": unpack_sequence,
        "_apply_": apply,
        "_inplacevar_": inplacevar,
        "_print_": PrintCollector,
    }
