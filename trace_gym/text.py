"""Text from env code, made safe to print."""

import re

_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """Evidence as it may be printed: escape sequences removed, other control
    characters (carriage returns, bells, bidi overrides) shown as spaces."""
    return _CONTROL.sub(" ", _ANSI.sub("", str(text)))
