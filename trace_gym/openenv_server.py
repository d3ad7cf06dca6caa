"""Any registry env served as an OpenEnv environment (``trace-gym envs serve ID``).

Built on OpenEnv's own package (``openenv-core``: its ``Environment`` base class,
its pydantic ``Action``/``Observation`` types and its ``create_app``), so that
OpenEnv clients and the trainers that speak OpenEnv (TRL's OpenEnv integration,
prime-rl, SkyRL) play registry envs as they are: a target, or a synthesized env
in its sandbox.

The protocol is OpenEnv's. An episode lives on one WebSocket session (``/ws``;
OpenEnv's HTTP ``/reset`` and ``/step`` build a fresh env per request, so they
cannot carry one). The env is text in, text out, as every trace-gym env:

- ``reset`` takes ``seed``, and ``task_id`` (a target's task) and ``split``
  (which of the target's splits the task is in; default: the env's own);
- the action is ``{"text": ...}``: the agent's raw turn, a tool call
  (``{"name": ..., "arguments": {...}}``, alone or in ``<tool_call>`` tags) or
  a message to the user;
- the observation is ``text`` (what the agent is told), ``messages`` (what its
  conversation gained, OpenAI format), at reset ``system_prompt``, ``tools``
  (OpenAI function schemas) and ``task_id``, and at the end ``reward_info`` and
  ``termination_reason``; ``reward`` and ``done`` are OpenEnv's own fields.

Nothing else crosses: no reference solution, no grader state.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any

from .errors import TraceGymError
from .registry import get_entry, make


def _openenv() -> Any:
    try:
        from openenv.core import env_server
    except ImportError as exc:
        raise TraceGymError(
            f"serving an env over OpenEnv needs openenv-core ({exc}); pip install 'trace-gym[openenv]'"
        ) from None
    return env_server


def _types() -> tuple[type, type]:
    """``TextAction`` and ``TextObservation``, built on OpenEnv's base types at first use
    (importing openenv-core loads its web stack: seconds, which ``import trace_gym`` must not pay)."""
    global _TYPES
    if _TYPES is None:
        server = _openenv()

        class TextAction(server.Action):
            """The agent's raw turn: a tool call or a message to the user."""

            text: str

        class TextObservation(server.Observation):
            """What the agent is told, and what its conversation gained."""

            text: str = ""
            messages: list[dict[str, Any]] | None = None  # None: the env keeps no conversation of its own
            system_prompt: str | None = None
            tools: list[dict[str, Any]] = []
            task_id: str | None = None
            truncated: bool = False
            termination_reason: str | None = None
            reward_info: dict[str, Any] | None = None

        _TYPES = (TextAction, TextObservation)
    return _TYPES


_TYPES: tuple[type, type] | None = None


def registry_environment(env_id: str, env_kwargs: dict[str, Any] | None = None) -> type:
    """An OpenEnv ``Environment`` class playing ``env_id`` (made with ``env_kwargs``);
    one instance per session, each with its own env, so sessions run side by side."""
    get_entry(env_id)  # an unknown id is one line here, not an error frame per session
    server = _openenv()
    TextAction, TextObservation = _types()
    base_kwargs = dict(env_kwargs or {})

    class RegistryEnvironment(server.Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._envs: dict[str | None, Any] = {}
            self._env: Any = None
            self._state = server.State(episode_id=None, step_count=0)

        def _env_for(self, split: str | None) -> Any:
            if split not in self._envs:
                self._envs[split] = make(env_id, **base_kwargs, **({"split": split} if split else {}))
            return self._envs[split]

        def reset(
            self,
            seed: int | None = None,
            episode_id: str | None = None,
            task_id: str | None = None,
            split: str | None = None,
            **kwargs: Any,
        ) -> Any:
            if kwargs:
                raise TraceGymError(f"{env_id}: reset takes seed, episode_id, task_id and split; not {sorted(kwargs)}")
            self._env = self._env_for(split)
            observation, info = self._env.reset(
                seed=seed, options={"task_id": str(task_id)} if task_id is not None else None
            )
            self._state = server.State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
            return TextObservation(
                text=observation,
                messages=info.get("messages"),
                system_prompt=info.get("system_prompt"),
                tools=list(info.get("tools") or []),
                task_id=None if info.get("task_id") is None else str(info["task_id"]),
                done=False,
                reward=None,
            )

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            if self._env is None:
                raise TraceGymError(f"{env_id}: step before reset")
            observation, reward, terminated, truncated, info = self._env.step(action.text)
            self._state.step_count += 1
            done = bool(terminated or truncated)
            return TextObservation(
                text=observation,
                messages=info.get("messages"),
                done=done,
                reward=float(reward) if done else 0.0,
                truncated=bool(truncated),
                termination_reason=info.get("termination_reason"),
                reward_info=info.get("reward_info") if done else None,
            )

        @property
        def state(self) -> Any:
            return self._state

        def close(self) -> None:
            for env in self._envs.values():
                env.close()
            self._envs.clear()
            self._env = None

    RegistryEnvironment.__name__ = RegistryEnvironment.__qualname__ = "RegistryEnvironment"
    return RegistryEnvironment


class _QuietDisconnects:
    """Drops uvicorn's log of a client that hung up while OpenEnv closed its session
    (openenv-core 0.3.0 logs a traceback for every WebSocket client that closes first);
    every other error is still logged."""

    NAMES = ("WebSocketDisconnect", "ClientDisconnected")

    def filter(self, record: Any) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if type(exc).__name__ in self.NAMES:
                return False
            exc = exc.__context__
        return True


def openenv_app(env_id: str, *, max_sessions: int = 8, env_kwargs: dict[str, Any] | None = None) -> Any:
    """OpenEnv's FastAPI app serving ``env_id``, at most ``max_sessions`` episodes at once."""
    import logging

    if max_sessions < 1:
        raise TraceGymError(f"max_sessions must be at least 1, got {max_sessions}")
    log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDisconnects) for f in log.filters):
        log.addFilter(_QuietDisconnects())
    server = _openenv()
    TextAction, TextObservation = _types()
    return server.create_app(
        registry_environment(env_id, env_kwargs),
        TextAction,
        TextObservation,
        env_name=env_id,
        concurrency_config=server.ConcurrencyConfig(max_concurrent_envs=max_sessions),
    )


class BackgroundServer:
    """``openenv_app`` under uvicorn in a thread (tests, notebooks): ``with`` it, read ``base_url``."""

    def __init__(
        self,
        env_id: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_sessions: int = 8,
        env_kwargs: dict[str, Any] | None = None,
    ):
        import uvicorn

        app = openenv_app(env_id, max_sessions=max_sessions, env_kwargs=env_kwargs)
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = host, self._socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_ping_interval=None))
        self._thread: Any = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "BackgroundServer":
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise TraceGymError(f"the OpenEnv server did not start on {self.base_url}")
            time.sleep(0.05)
        return self

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C in the main thread stops the wait)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self._socket.close()
