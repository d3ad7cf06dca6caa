"""Byte channels to a worker: pipes (bubblewrap, plain subprocess) or a Docker
attach socket. Both read lines under a deadline and a size cap, so a silent,
slow or flooding worker cannot block or swamp the host."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import struct
import subprocess
import time

from .errors import SandboxCrashed, SandboxFlood, SandboxTimeout

STDERR_KEEP = 8192


class Channel:
    """A line-oriented connection to one worker process."""

    def __init__(self, max_line: int):
        self.max_line = max_line
        self._buffer = bytearray()
        self._stderr = bytearray()

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def recv_line(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                return line
            if len(self._buffer) > self.max_line:
                self.kill()
                raise SandboxFlood(f"the worker sent more than {self.max_line} bytes without a line end; killed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise SandboxTimeout(f"no answer within {timeout:g}s; the worker was killed")
            if not self._read(remaining):
                raise SandboxCrashed(f"the worker exited{self._exit_note()}{self.stderr_note()}")

    def _read(self, timeout: float) -> bool:
        """Read what is available into the buffer; False at end of stream."""
        raise NotImplementedError

    def _keep_stderr(self, data: bytes) -> None:
        self._stderr += data
        del self._stderr[:-STDERR_KEEP]

    def stderr_note(self) -> str:
        text = bytes(self._stderr).decode("utf-8", "replace").strip()
        return f"; its stderr ends: {text[-500:]}" if text else ""

    def _exit_note(self) -> str:
        return ""

    def kill(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.kill()


class PipeChannel(Channel):
    def __init__(self, argv: list[str], max_line: int, env: dict[str, str] | None = None, user: int | None = None):
        """``user``: start the process as this uid and gid, with no supplementary groups."""
        super().__init__(max_line)
        identity = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env if env is not None else {},
            start_new_session=True,
            close_fds=True,
            cwd="/",
            **identity,
        )
        self._selector = selectors.DefaultSelector()
        for stream in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(stream.fileno(), False)
            self._selector.register(stream, selectors.EVENT_READ)
        self._open = 2

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.kill()
            raise SandboxCrashed(f"the worker is gone{self._exit_note()}{self.stderr_note()}") from None

    def _read(self, timeout: float) -> bool:
        for key, _ in self._selector.select(timeout):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if key.fileobj is self.proc.stderr:
                if chunk:
                    self._keep_stderr(chunk)
                else:
                    self._selector.unregister(key.fileobj)
                continue
            if not chunk:
                self.proc.wait(timeout=2)
                self._drain_stderr()
                return False
            self._buffer += chunk
        return True

    def _drain_stderr(self) -> None:
        try:
            while chunk := os.read(self.proc.stderr.fileno(), 65536):
                self._keep_stderr(chunk)
        except (BlockingIOError, OSError, ValueError):
            pass

    def _exit_note(self) -> str:
        code = self.proc.poll()
        if code is None:
            return ""
        if code < 0:
            return f" (killed by signal {signal.Signals(-code).name})"
        return f" (status {code})"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self._selector.close()
        except (OSError, ValueError):
            pass


class DockerChannel(Channel):
    """stdin/stdout/stderr of a container through the Engine's attach socket.

    With ``tty=False`` the Engine multiplexes stdout and stderr in frames: an
    8-byte header (stream type, 3 zero bytes, big-endian length) then the data.
    """

    def __init__(self, container, sock, max_line: int, holders: list | None = None):
        """``holders``: the socket's file wrappers (the attach response's); a socket
        they hold stays open after its own close() until they are closed too."""
        super().__init__(max_line)
        self.container = container
        self._sock = sock
        self._holders = [h for h in (holders or []) if h is not sock]
        self._raw = bytearray()
        self._dead = False

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError:
            self.kill()
            raise SandboxCrashed(f"the container is gone{self.stderr_note()}") from None

    def _read(self, timeout: float) -> bool:
        self._sock.settimeout(timeout)
        try:
            chunk = self._sock.recv(65536)
        except (socket.timeout, TimeoutError):
            return True
        if not chunk:
            return False
        self._raw += chunk
        while len(self._raw) >= 8:
            kind, length = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + length:
                break
            payload = bytes(self._raw[8 : 8 + length])
            del self._raw[: 8 + length]
            if kind == 2:
                self._keep_stderr(payload)
            else:
                self._buffer += payload
        if len(self._raw) > self.max_line + 8:
            self.kill()
            raise SandboxFlood(f"the container sent a frame over {self.max_line} bytes; killed")
        return True

    def _exit_note(self) -> str:
        try:
            self.container.reload()
            state = self.container.attrs.get("State", {})
            if state.get("OOMKilled"):
                return " (out of memory)"
            return f" (status {state.get('ExitCode')})"
        except Exception:  # the container may be gone already
            return ""

    def kill(self) -> None:
        if self._dead:
            return
        self._dead = True
        for stream in (*self._holders, self._sock):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.container.remove(force=True)
        except Exception:  # already removed
            pass
