"""The host's handle on one sandboxed worker: start, call, kill.

Every reply must be one line ``<token> <json>`` with the session's token,
within the time limit and the size cap, and pass the host reply check
(``check_reply``): JSON no deeper than ``MAX_DEPTH``, integers that fit in 64
bits, strings and lists of bounded size, and the fields each reply kind must
have, with their types. Anything else kills the worker and raises a typed
``SandboxError`` that says "refused by the host reply check". Only an
exception raised by the env code itself (``SandboxEnvError``) leaves the
worker running.

At start the host also checks what the worker reports of its jail: its
seccomp filter must be on (unless the backend was named ``*-no-seccomp``),
and in a real jail its uid must not be 0 and ``/proc/sys`` must not be
writable. This module must not trust anything a reply says before checking it.
"""

from __future__ import annotations

import base64
import json
import marshal
import re
import secrets
import sys
from typing import Any

from trace_gym.closing import Closing

from .backends import Backend, Limits, select_backend
from .channel import Channel
from .errors import (
    IN_JAIL_LAYERS,
    SandboxCrashed,
    SandboxEnvError,
    SandboxError,
    SandboxProtocolError,
    SandboxUnavailable,
)
from .gate import compile_env, enforce

MAX_DEPTH = 32
MAX_INT = 2**63
MAX_ITEMS = 200_000
MAX_TEXT = 2000
CHECK = "refused by the host reply check"


class SandboxWorker(Closing):
    def __init__(
        self,
        source: str,
        *,
        backend: Backend | str = "auto",
        limits: Limits | None = None,
        filename: str = "env.py",
        worker_options: dict[str, Any] | None = None,
    ):
        """``worker_options``: ``{"seccomp": False}`` asks the worker not to install
        its filter (tests; a platform without seccomp): the host then refuses it
        unless the backend is a ``*-no-seccomp`` one."""
        enforce(source, filename)  # nothing runs unless the static gate passes
        self.limits = limits or Limits()
        self.backend = select_backend(backend) if isinstance(backend, str) else backend
        self._token = secrets.token_hex(16)
        self._channel: Channel | None = self.backend.spawn(self.limits)
        self.info: dict[str, Any] = {}
        code, _ = compile_env(source)  # cached: enforce() has just compiled it
        init = {
            "token": self._token,
            "code": base64.b64encode(marshal.dumps(code)).decode("ascii"),
            "python": list(sys.version_info[:2]),
            "limits": self.limits.rlimits(),
            "seccomp": bool((worker_options or {}).get("seccomp", True)),
        }
        try:
            self._send(init)
            reply = self._receive(self.limits.start_timeout_s, kind="load")
        except SandboxError:
            self.close()
            raise
        if not reply["ok"]:
            self.close()
            raise SandboxEnvError(f"{filename} failed to load: {reply['error']}", reply)
        try:
            self._check_jail(reply)
        except SandboxError:
            self.close()
            raise
        self.info = reply

    def _check_jail(self, info: dict[str, Any]) -> None:
        name = getattr(self.backend, "name", "?")
        if info["seccomp"] != "on" and getattr(self.backend, "require_seccomp", True):
            raise SandboxUnavailable(
                f"the worker's seccomp filter is not active ({info['seccomp']}); refused by the host. "
                f"Name the weaker backend '{name}-no-seccomp' explicitly to run without it"
            )
        if getattr(self.backend, "isolated", True):
            if info.get("uid") == 0:
                raise SandboxUnavailable(f"the {name} jail runs the worker as uid 0; refused by the host")
            if info.get("proc_sys_writable"):
                raise SandboxUnavailable(f"the {name} jail leaves /proc/sys writable; refused by the host")

    @property
    def alive(self) -> bool:
        return self._channel is not None

    def call(self, op: str, timeout: float | None = None, **payload: Any) -> Any:
        if self._channel is None:
            raise SandboxCrashed("the worker is no longer running; make a new one")
        try:
            self._send({"op": op, **payload})
            reply = self._receive(timeout or self.limits.call_timeout_s, kind="call")
        except SandboxError:
            self.close()
            raise
        if not reply["ok"]:
            raise SandboxEnvError(f"env code raised in {op}: {reply['error']}", reply)
        return reply.get("result")

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _send(self, message: dict[str, Any]) -> None:
        self._channel.send((json.dumps(message) + "\n").encode("utf-8"))

    def _receive(self, timeout: float, kind: str) -> dict[str, Any]:
        line = self._channel.recv_line(timeout)
        token, _, body = line.partition(b" ")
        if not secrets.compare_digest(token, self._token.encode()):
            self._channel.kill()
            raise SandboxProtocolError(
                f"the worker sent a line without the session token (forged or stray output: {line[:80]!r}); killed"
            )
        try:
            return check_reply(body, kind)
        except SandboxProtocolError:
            self._channel.kill()
            raise


def check_reply(body: bytes, kind: str) -> dict[str, Any]:
    """A reply body, parsed and checked before any of it is used; kind: load or call."""
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SandboxProtocolError(
            f"the worker sent a reply that is not JSON within limits ({type(exc).__name__}); {CHECK}; killed"
        ) from None
    _check_data(reply)
    if _ESCAPED_SURROGATE.search(body):
        reply = _without_surrogates(reply)
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise SandboxProtocolError(f"the worker sent a reply of the wrong shape (no boolean 'ok'); {CHECK}; killed")
    expected: dict[str, tuple[type, ...]]
    if not reply["ok"]:
        expected = {
            "error": (str,),
            "where": (str, type(None)),
            "printed": (str, type(None)),
            "exception": (dict, type(None)),
            "traceback": (str, type(None)),
        }
    elif kind == "load":
        expected = {
            "tools": (list, type(None)),
            "max_steps": (int, type(None)),
            "levels": (int, type(None)),
            "has_oracle": (bool,),
            "seccomp": (str,),
            "uid": (int, type(None)),
            "proc_sys_writable": (bool, type(None)),
        }
    else:
        expected = {}
    for field, types in expected.items():
        value = reply.get(field)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise SandboxProtocolError(
                f"the worker's reply has '{field}' of type {type(value).__name__}; {CHECK}; killed"
            )
    if not reply["ok"]:
        reply["error"] = reply["error"][:MAX_TEXT]
        exception = reply.get("exception") or {}
        reply["exception"] = {
            "type": str(exception.get("type", "Exception"))[:200],
            "message": str(exception.get("message", ""))[:MAX_TEXT],
            "layer": layer if isinstance(layer := exception.get("layer"), str) and layer in IN_JAIL_LAYERS else None,
        }
        reply["traceback"] = (reply.get("traceback") or "")[-4 * MAX_TEXT :]
    elif kind == "load" and reply["tools"] is not None and not all(isinstance(t, str) for t in reply["tools"]):
        raise SandboxProtocolError(f"the worker's TOOLS are not all strings; {CHECK}; killed")
    return reply


_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate (JSON can spell one, ``"\\ud800"``; no
    tokenizer, UTF-8 writer or terminal accepts it) replaced by U+FFFD, keys included:
    env text that cannot be encoded never reaches the host's stores or models.
    (json pairs a valid surrogate pair into one character first; depth is checked.)"""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def _check_data(value: Any) -> None:
    """Depth, size and types of parsed JSON, without recursion."""
    stack = [(value, 0)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH:
            raise SandboxProtocolError(f"the worker's reply nests deeper than {MAX_DEPTH}; {CHECK}; killed")
        if seen > MAX_ITEMS:
            raise SandboxProtocolError(f"the worker's reply holds more than {MAX_ITEMS} values; {CHECK}; killed")
        if isinstance(item, bool) or item is None or isinstance(item, (str, float)):
            continue
        if isinstance(item, int):
            if not -MAX_INT <= item < MAX_INT:
                raise SandboxProtocolError(f"the worker's reply holds an integer beyond 64 bits; {CHECK}; killed")
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        else:  # json gives nothing else; kept for safety
            raise SandboxProtocolError(f"the worker's reply holds a {type(item).__name__}; {CHECK}; killed")
