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
and to attributes of their instances; metaclass bases. Stdlib code that reads or
sets attributes by names taken from data gets those names checked where they
enter (dataclass fields, Enum's functional API; ``copy.dispatch_table`` denied).
Module proxies hand out only public attributes, wrap every function they hand out (and functions those return) so
that no ``__func__``/``__globals__``/``__self__`` is reachable, and check the
attribute names given to ``functools.update_wrapper``/``wraps``.

Must not: import anything beyond the standard library (it runs inside the
jail, where only the standard library is), or hand env code any object of
the worker.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import operator
import re
import string
import types
import weakref

LAYER = "the language layer (RestrictedPython guards)"
INTROSPECTION_PREFIXES = ("gi_", "ag_", "cr_", "f_", "tb_", "co_", "func_", "im_")
INTROSPECTION_NAMES = frozenset({"mro"})
PRIVATE_NAME = re.compile(r"_[A-Za-z0-9](\w*[A-Za-z0-9])?")
RESERVED_NAMES = frozenset({"_print"})  # RestrictedPython's own helper name
ALLOWED_MODULES = (
    "random", "math", "json", "re", "datetime", "dataclasses", "collections", "itertools",
    "functools", "string", "typing", "enum", "copy", "collections.abc",
)
# Attributes that evaluate code or walk attributes by names given at run time.
DENIED_MODULE_ATTRS = {
    "string": {"Formatter"},
    "typing": {"get_type_hints", "ForwardRef", "EXCLUDED_ATTRIBUTES"},  # (a list the protocol checks read names from)
    "functools": {"singledispatch", "singledispatchmethod"},  # evaluate annotation strings
    "dataclasses": {"make_dataclass"},  # a class namespace from a dict: dunder methods by the back door
    "copy": {"dispatch_table"},  # copyreg's reductors: a reductor's state is set with setattr, names unchecked
}
# Dunders that a class namespace may hold: Python's own and the methods RestrictedPython lets env code define.
CLASS_DUNDERS = frozenset(
    {"__module__", "__qualname__", "__doc__", "__annotations__", "__classcell__", "__orig_bases__",
     "__static_attributes__", "__firstlineno__", "__init__", "__contains__", "__lt__", "__le__", "__eq__",
     "__ne__", "__gt__", "__ge__", "__hash__"}
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
        mro = mro[mro.index(after) + 1:] if after in mro else ()
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
    if not isinstance(name, str):
        return "an attribute name that is not a string"
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
    if name in ("format", "format_map") and (isinstance(obj, str) or obj is str):
        return functools.partial(safe_format, obj) if name == "format" and isinstance(obj, str) else _refuse_call(f"str.{name}")
    value = getattr(obj, name, *default)
    if isinstance(value, types.ModuleType):
        raise Refused(f"module reached through '{name}'")
    if _is_str_format(value):  # reached another way (super(str, s).format...): the same rule
        owner = getattr(value, "__self__", None)
        if value.__name__ == "format" and isinstance(owner, str):
            return functools.partial(safe_format, owner)
        return _refuse_call(f"str.{value.__name__}")
    return value


_STR_FORMATTERS = (str.format, str.format_map)


def _is_str_format(value) -> bool:
    """str.format or format_map, bound or not, whatever object handed it out."""
    if isinstance(value, types.MethodDescriptorType):
        return value in _STR_FORMATTERS
    return (isinstance(value, types.BuiltinMethodType) and isinstance(getattr(value, "__self__", None), str)
            and value.__name__ in ("format", "format_map"))


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
    if isinstance(obj, (types.ModuleType, ModuleProxy, FunctionProxy, types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        raise Refused("changing a module or a function")
    if isinstance(obj, type) or type(obj) in (dict, list) or _env_instance(obj):
        return obj
    return ItemsOnly(obj)


def _env_instance(obj) -> bool:
    return any(c in ENV_CLASSES for c in type.__getattribute__(type(obj), "__mro__"))


class ItemsOnly:
    """The write target for an object env code did not define: items only."""

    __slots__ = ("_target",)

    def __init__(self, target):
        object.__setattr__(self, "_target", target)

    def __setitem__(self, key, value):
        object.__getattribute__(self, "_target")[key] = value

    def __delitem__(self, key):
        del object.__getattribute__(self, "_target")[key]

    def __setattr__(self, name, value):
        raise Refused(f"changing attribute '{name}' of a {type(object.__getattribute__(self, '_target')).__name__}, which env code did not define")

    def __delattr__(self, name):
        self.__setattr__(name, None)


def guarded_hasattr(obj, name) -> bool:
    if refusal(obj, name):
        return False
    return hasattr(obj, name)


def guarded_type(*args):
    if len(args) != 1:
        raise Refused("type() with three arguments (a class from a dict)")
    kind = type(args[0])
    if _is_metaclass(kind):  # type(int)("X", (), {...}) would be type() with three arguments
        raise Refused("type() of a class (its metaclass builds classes from a dict)")
    if kind in (ModuleProxy, FunctionProxy):  # the worker's own classes
        raise Refused("type() of a module or function proxy")
    return kind


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
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv, "//=": operator.ifloordiv,
    "%=": operator.imod, "**=": operator.ipow, "<<=": operator.ilshift, ">>=": operator.irshift, "|=": operator.ior,
    "^=": operator.ixor, "&=": operator.iand, "@=": operator.imatmul,
}


def inplacevar(op: str, x, y):
    return _INPLACE[op](x, y)


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
        extra = [k for k in namespace if isinstance(k, str) and k.startswith("__") and k.endswith("__") and k not in CLASS_DUNDERS]
        if extra:
            raise Refused(f"class {name} defining {', '.join(sorted(extra))}")
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
class FunctionProxy:
    """A stdlib function handed to env code: callable, and nothing else."""

    __slots__ = ("_fn", "_name")

    def __init__(self, fn, name):
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", name)

    def __call__(self, *args, **kwargs):
        return wrap(object.__getattribute__(self, "_fn")(*args, **kwargs), object.__getattribute__(self, "_name") + "()")

    def __getattr__(self, attr):
        raise Refused(f"attribute '{attr}' of {object.__getattribute__(self, '_name')}")

    def __setattr__(self, attr, value):
        raise Refused("changing a function")

    def __repr__(self):
        return "<function %s>" % object.__getattribute__(self, "_name")


class ModuleProxy:
    """Public, allowed attributes of an allowed module, each wrapped; nothing else."""

    __slots__ = ("_module", "_name", "_denied")

    def __init__(self, module, name):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_denied", DENIED_MODULE_ATTRS.get(name, set()))

    def __getattr__(self, attr):
        name = object.__getattribute__(self, "_name")
        if attr.startswith("_") or attr in object.__getattribute__(self, "_denied"):
            raise Refused(f"{name}.{attr} is not available in the sandbox")
        value = getattr(object.__getattribute__(self, "_module"), attr)
        if name == "functools" and attr in ("update_wrapper", "wraps"):
            return FunctionProxy(_checked_wrapper(value), f"functools.{attr}")
        if name == "dataclasses" and attr in DATACLASS_READERS:
            return FunctionProxy(_checked_dataclasses(value), f"dataclasses.{attr}")
        return wrap(value, f"{name}.{attr}")

    def __setattr__(self, attr, value):
        raise Refused("changing a module")

    def __repr__(self):
        return "<module %s>" % object.__getattribute__(self, "_name")


_CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.MethodWrapperType,
              types.WrapperDescriptorType, types.MethodDescriptorType)


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
    if isinstance(value, _CALLABLES) and getattr(value, "__module__", None) != "env" and not hasattr(value, "__mro_entries__"):
        return FunctionProxy(value, name)  # (typing.NamedTuple and TypedDict are functions used as bases: kept)
    return value


def _checked_wrapper(real):
    """functools.update_wrapper / wraps with every attribute name checked like a read."""
    defaults = frozenset(functools.WRAPPER_ASSIGNMENTS) | frozenset(functools.WRAPPER_UPDATES)

    def checked(*args, **kwargs):
        wrapped = args[1] if real is functools.update_wrapper and len(args) > 1 else (args[0] if args else kwargs.get("wrapped"))
        positional = args[2:] if real is functools.update_wrapper else args[1:]
        names = list(kwargs.get("assigned", ())) + list(kwargs.get("updated", ()))
        for extra in positional:
            names += list(extra)
        for name in names:
            if name not in defaults and refusal(wrapped, name):
                raise Refused(f"functools.{real.__name__} of {refusal(wrapped, name)}")
        return real(*args, **kwargs)

    return checked


DATACLASS_READERS = ("dataclass", "fields", "asdict", "astuple", "replace")


def _check_field_names(names, where: str) -> None:
    for name in names:
        if not isinstance(name, str) or name.startswith("__") or name.endswith("__") \
                or name.startswith(INTROSPECTION_PREFIXES) or name in INTROSPECTION_NAMES:
            raise Refused(f"dataclasses.{where} of a field named {name!r} (a name it would read with getattr)")


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
    where = real.__name__

    def decorate(cls, make):
        if isinstance(cls, type):
            annotations = type.__getattribute__(cls, "__dict__").get("__annotations__", {})
            _check_field_names(list(annotations) if isinstance(annotations, dict) else [None], where)
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


def guard_stdlib(modules: dict) -> None:
    """Changes to the worker's own copy of the standard library, made before env code
    runs (the worker calls this in the jail; the host's modules are never changed).

    Enum's functional API (``enum.Enum("E", names)``) builds a class from a dict
    that no class statement, hence no EnvMeta, sees: a member named ``__reduce_ex__``
    or ``__annotations__`` would be a class attribute, so a copy's reductor state
    would be set with an unguarded setattr and ``typing`` would read annotations
    env code chose. Member names starting with ``_`` are refused there."""
    enum_type = modules["enum"].EnumType
    original = enum_type.__dict__["_create_"]
    if getattr(original, "checked_by_language_layer", False):
        return

    def _create_(cls, class_name, names, **kwargs):
        return original(cls, class_name, _checked_member_names(names), **kwargs)

    _create_.checked_by_language_layer = True
    enum_type._create_ = _create_


def _checked_member_names(names):
    """Enum's ``names`` (a string, names, pairs or a mapping), read once into plain data and checked."""
    if names is None:
        return None
    if isinstance(names, str):
        names = names.replace(",", " ").split()
    items = list(names)
    if items and all(isinstance(item, str) for item in items):
        plain = items if isinstance(names, (list, tuple)) else [(key, names[key]) for key in items]
    else:
        plain = [tuple(item) for item in items]
    for entry in plain:
        name = entry if isinstance(entry, str) else (entry[0] if len(entry) == 2 else None)
        if not isinstance(name, str) or name.startswith("_"):
            raise Refused(f"enum member name {name!r} (names starting with '_' set the class's own attributes)")
    return plain


# --- the namespace ------------------------------------------------------------------------------
def env_globals(modules: dict, print_sink) -> dict:
    """Globals for the compiled env code: guards, restricted builtins, module proxies."""
    table = {name: getattr(builtins, name) for name in SAFE_BUILTINS if hasattr(builtins, name)}
    proxies = {name: ModuleProxy(mod, name) for name, mod in modules.items()}

    def safe_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level != 0 or name not in proxies:
            raise ImportError("import of %r is not allowed in the sandbox" % name)
        if "." in name and not fromlist:
            return proxies[name.split(".")[0]]
        return proxies[name]

    table.update({"__import__": safe_import, "hasattr": guarded_hasattr, "type": guarded_type})
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
