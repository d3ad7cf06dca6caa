"""The host's handle on one sandboxed worker: start, call, kill.

Every reply must be one line ``<token> <json>`` with the session's token,
within the time limit and the size cap; anything else kills the worker and
raises a typed ``SandboxError``. Only an exception raised by the env code
itself (``SandboxEnvError``) leaves the worker running.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from .backends import Backend, Limits, select_backend
from .channel import Channel
from .errors import SandboxCrashed, SandboxEnvError, SandboxError, SandboxProtocolError
from .gate import enforce


class SandboxWorker:
    def __init__(self, source: str, *, backend: Backend | str = "auto", limits: Limits | None = None, filename: str = "env.py"):
        enforce(source, filename)  # nothing runs unless the static gate passes
        self.limits = limits or Limits()
        self.backend = select_backend(backend) if isinstance(backend, str) else backend
        self._token = secrets.token_hex(16)
        self._channel: Channel | None = self.backend.spawn(self.limits)
        self.info: dict[str, Any] = {}
        init = {
            "token": self._token,
            "source": source,
            "limits": self.limits.rlimits(),
            "seccomp": True,
        }
        try:
            self._send(init)
            reply = self._receive(self.limits.start_timeout_s)
        except SandboxError:
            self.close()
            raise
        if not reply.get("ok"):
            self.close()
            raise SandboxEnvError(f"{filename} failed to load: {reply.get('error')}")
        self.info = reply

    @property
    def alive(self) -> bool:
        return self._channel is not None

    def call(self, op: str, timeout: float | None = None, **payload: Any) -> Any:
        if self._channel is None:
            raise SandboxCrashed("the worker is no longer running; make a new one")
        try:
            self._send({"op": op, **payload})
            reply = self._receive(timeout or self.limits.call_timeout_s)
        except SandboxError:
            self.close()
            raise
        if not reply.get("ok"):
            raise SandboxEnvError(f"env code raised in {op}: {reply.get('error')}")
        return reply.get("result")

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> "SandboxWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _send(self, message: dict[str, Any]) -> None:
        self._channel.send((json.dumps(message) + "\n").encode("utf-8"))

    def _receive(self, timeout: float) -> dict[str, Any]:
        line = self._channel.recv_line(timeout)
        token, _, body = line.partition(b" ")
        if not secrets.compare_digest(token, self._token.encode()):
            self._channel.kill()
            raise SandboxProtocolError(f"the worker sent a line without the session token (forged or stray output: {line[:80]!r}); killed")
        try:
            reply = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._channel.kill()
            raise SandboxProtocolError("the worker sent a reply that is not JSON; killed") from None
        if not isinstance(reply, dict) or "ok" not in reply:
            self._channel.kill()
            raise SandboxProtocolError("the worker sent a reply of the wrong shape; killed")
        return reply
