"""Layer 1: the static gate refuses hostile or disallowed code before anything runs."""

import pytest

from trace_gym.sandbox import SandboxViolation, check_source, enforce

REFUSED = {
    "read host file": ("data = open('/etc/shadow').read()", "'open' is not allowed"),
    "import os": ("import os\nos.system('id')", "import of 'os' is not allowed"),
    "subprocess": ("import subprocess", "import of 'subprocess'"),
    "socket": ("import socket", "import of 'socket'"),
    "urllib": ("from urllib import request", "import from 'urllib'"),
    "time.sleep": ("import time\ntime.sleep(10**9)", "import of 'time'"),
    "importlib": ("import importlib", "import of 'importlib'"),
    "builtins dict": ("__builtins__['__import__']('os')", "'__builtins__' is not allowed"),
    "dunder import": ("__import__('os')", "'__import__' is not allowed"),
    "subclasses walk": (
        "x = ().__class__.__bases__[0].__subclasses__()",
        'RestrictedPython: "__class__" is an invalid attribute',
    ),
    "generator frame": ("g = (i for i in [1])\nf = g.gi_frame.f_back", "introspection attribute '.gi_frame'"),
    "traceback frame": (
        "try:\n    1/0\nexcept Exception as e:\n    t = e.__traceback__",
        'RestrictedPython: "__traceback__" is an invalid attribute',
    ),
    "tb attrs": ("def f(e):\n    return e.tb_frame", "introspection attribute '.tb_frame'"),
    "code object": ("def f():\n    pass\nc = f.co_code", "introspection attribute '.co_code'"),
    "format string": ("s = '{0.__class__.__mro__}'.format(1)", "spells a dunder"),
    "format_map": ("s = '{x}'.format_map({'x': 1})", "introspection attribute '.format_map'"),
    "module private": ("import random\nrandom._os.system('id')", "private attribute '._os'"),
    "private import": ("from random import _os", "private name '_os'"),
    "eval": ("x = eval('1+1')", "'eval' is not allowed"),
    "exec": ("exec('import os')", "'exec' is not allowed"),
    "compile": ("c = compile('1', 'f', 'eval')", "'compile' is not allowed"),
    "getattr": ("import random\nf = getattr(random, '_os')", "'getattr' is not allowed"),
    "globals": ("g = globals()", "'globals' is not allowed"),
    "vars": ("v = vars()", "'vars' is not allowed"),
    "star import": ("from json import *", "import *"),
    "relative import": ("from . import secrets", "relative imports"),
    "sys": ("import sys\nsys.modules['os']", "import of 'sys'"),
    "async": ("async def f():\n    pass", "RestrictedPython: AsyncFunctionDef statements are not allowed"),
    "chained unpacking": ("a, b = c = [1, 2]", "chained assignment that unpacks"),
    "chained unpacking, list target": ("x = [a, b] = [1, 2]", "chained assignment that unpacks"),
    "syntax error": ("def (:", "syntax error"),
    "too large": ("x = 1\n" * 60000, "larger than"),
    "deep unary nesting": ("x = " + "-" * 100000 + "1", "nests too deeply"),
    "deep attribute chain": ("x = a" + ".b" * 100000, "nests too deeply"),
    "deep operator chain": ("x = " + "+".join(["1"] * 100000), "nests too deeply"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_hostile_source_is_refused_with_a_line_number(name):
    source, fragment = REFUSED[name]
    findings = check_source(source)
    assert findings, f"{name} passed the gate"
    assert any(fragment in f.message for f in findings), [str(f) for f in findings]
    with pytest.raises(SandboxViolation, match=r"line \d+: "):
        enforce(source)


def test_legitimate_env_code_passes(tmp_path):
    from conftest import FIXTURE_ENVS

    assert check_source((FIXTURE_ENVS / "order-lookup" / "env.py").read_text()) == []
    ok = (
        "import random, json, re, math, datetime, dataclasses, collections, itertools, functools, string, typing, enum, copy\n"
        "from collections import Counter\nfrom dataclasses import dataclass, field\n"
        "class Environment:\n    def reset(self, seed, hint=False):\n        self._rng = random.Random(seed)\n"
        "        return {'system_prompt': f'{self._rng.random():.2f}', 'user_message': 'hi'}\n"
    )
    assert check_source(ok) == []
    assert check_source("a = b = 1\nc, d = [1, 2]\n") == []  # one value per statement: evaluated once


def test_findings_name_every_offending_line():
    findings = check_source("import os\nx = 1\nimport socket\n")
    assert [f.line for f in findings] == [1, 3]
