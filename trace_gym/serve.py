"""``trace-gym serve``: the improved agent behind an OpenAI-compatible HTTP API.

A user's own agent code points its base URL here and gets TRACE: each
conversation is routed to its capability adapter (or the base model) as
evaluation routes a task, by the router of an earlier run, on the
conversation's first user message. Endpoints (under ``/v1``):

- ``GET /models``: the served model ids. ``trace`` (routed; only when a run's
  router is loaded), the policy's own name (no adapter) and each adapter's name.
- ``POST /chat/completions``: messages and OpenAI tool schemas in; the reply
  with native ``tool_calls`` parsed from the model's ``<tool_call>`` text (as
  the envs parse it), and a ``trace_gym`` field saying which adapter answered
  and why (the route).
- ``POST /completions``: vLLM's token-id protocol, for a client that keeps the
  episode as ids (``prompt`` a list of ids; ``logprobs`` and
  ``return_tokens_as_token_ids`` or ``return_token_ids`` to get the sampled
  ids back). Logprobs are those of the distribution each token was sampled
  from (the logits over the temperature), as our local backend records them.
- ``POST /load_lora_adapter``: ``{"lora_name", "lora_path"}``, vLLM's way of
  adding an adapter at run time.

Requests that arrive together are generated in one batch (each keeps its own
seed, temperature and adapter), and an episode's next turn reuses the keys and
values of its last one: a request whose ids extend an earlier request's prompt
and completion continues that cache. Every mistake in a request is a 4xx with
one line in OpenAI's error shape; nothing a client sends stops the server.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .errors import TraceGymError

ROUTED = "trace"
"""The model id of the routed agent."""
MAX_BODY = 16 * 1024 * 1024


class ServeError(TraceGymError):
    """A request the server cannot answer; ``status`` is its HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Served:
    """What a server answers with: a token-level backend (every adapter loaded under
    its name), the policy's name, and the router of a run (None: no ``trace`` id)."""

    backend: Any
    name: str
    router: Any = None
    routes: "OrderedDict[str, Any]" = field(default_factory=OrderedDict)

    def models(self) -> list[str]:
        return [*([ROUTED] if self.router is not None else []), self.name, *sorted(self.backend.adapters)]

    def route(self, messages: list[dict[str, Any]]) -> Any:
        """The router's decision for a conversation, on its first user message (cached)."""
        opening = next((m.get("content") for m in messages if m.get("role") == "user" and m.get("content")), None)
        if not isinstance(opening, str):
            raise ServeError("the routed model needs a conversation with a user message to route on")
        if opening not in self.routes:
            self.routes[opening] = self.router.route(opening)
            while len(self.routes) > 4096:
                self.routes.popitem(last=False)
        return self.routes[opening]

    def adapter_for(self, model: Any, messages: list[dict[str, Any]] | None) -> tuple[str | None, Any]:
        """(adapter, route decision or None) for a request's ``model``."""
        if model == ROUTED and self.router is not None and messages is not None:
            decision = self.route(messages)
            return decision.adapter, decision
        if model in (self.name, None):
            return None, None
        if model in self.backend.adapters:
            return model, None
        raise ServeError(f"the model '{model}' does not exist here (served: {', '.join(self.models())})", 404)


def served_from_run(run_dir: str | Path) -> Served:
    """The policy of an earlier ``trace-gym run`` with every adapter it trained, and its
    router (none if the run trained no capability adapter)."""
    from .evaluation import Unavailable, get_method, policy_backend
    from .pipeline import eval_context, load_run

    config, state = load_run(run_dir)
    ctx = eval_context(config, state, None)
    ctx.backend = policy_backend(config.policy.model, ctx.adapters)
    _check_token_level(ctx.backend)
    try:
        router = get_method("trace").build(ctx).kwargs["router"]
    except Unavailable:
        router = None
    return Served(ctx.backend, config.policy.model, router)


def served_model(model: str, adapters: dict[str, str] | None = None) -> Served:
    """A local model (and adapters by name), with no router."""
    from .llm import make_backend

    backend = make_backend(model)
    _check_token_level(backend)
    for name, path in (adapters or {}).items():
        backend.load_adapter(name, path)
    return Served(backend, model)


def _check_token_level(backend: Any) -> None:
    if not getattr(backend, "token_level", False):
        raise ServeError(f"serve needs a local model (the embedded one or hf:<folder>), not {backend.name}: "
                         "a server's model is served by that server")


# --- requests -------------------------------------------------------------------------------------

def _number(body: dict[str, Any], key: str, default: Any, kind: type, low: float | None = None) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise ServeError(f"'{key}' must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if low is not None and value < low:
        raise ServeError(f"'{key}' must be at least {low}, got {value}")
    return kind(value)


def _common(body: dict[str, Any], default_tokens: int, default_temperature: float) -> dict[str, Any]:
    if _number(body, "n", 1, int, 1) != 1:
        raise ServeError("'n' must be 1 here: send one request per sample, each with its own seed")
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {"max_new_tokens": _number({"max_tokens": tokens}, "max_tokens", default_tokens, int, 1),
            "temperature": _number(body, "temperature", default_temperature, float, 0),
            "seed": _number(body, "seed", None, int)}


def chat_request(served: Served, body: dict[str, Any]) -> tuple[Any, Any]:
    """(generation request, route decision) of a chat completion body."""
    from .llm.base import GenerationRequest

    messages, tools = body.get("messages"), body.get("tools")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ServeError("'messages' must be a non-empty list of messages, each with a 'role'")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ServeError("'tools' must be a list of tool schemas")
    adapter, decision = served.adapter_for(body.get("model"), messages)
    backend = served.backend
    try:
        ids, prefix_len = backend.encode_conversation(messages, tools or None)
    except Exception as exc:  # a template that cannot render these messages: the client's request
        raise ServeError(f"the chat template cannot render these messages: {str(exc).splitlines()[0]}") from None
    return GenerationRequest(messages=messages, tools=tools or None, adapter=adapter, prompt_ids=ids,
                             prefix_len=prefix_len, **_common(body, 256, 1.0)), decision


def completion_request(served: Served, body: dict[str, Any]) -> Any:
    """The generation request of a token-id (vLLM) completion body."""
    from .llm.base import GenerationRequest

    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt = served.backend.tokenizer.encode(prompt, add_special_tokens=False)
    vocabulary = len(served.backend.tokenizer)
    if not (isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)):
        raise ServeError("'prompt' must be text or a non-empty list of token ids (one prompt per request)")
    if any(i < 0 or i >= vocabulary for i in prompt):
        raise ServeError(f"'prompt' holds token ids outside the vocabulary (0..{vocabulary - 1})")
    adapter, _ = served.adapter_for(body.get("model"), None)
    return GenerationRequest(messages=[], adapter=adapter, prompt_ids=list(prompt),
                             prefix_len=_number(body, "prefix_len", 0, int, 0), **_common(body, 16, 1.0))


def _stamp(kind: str, model: str) -> dict[str, Any]:
    return {"id": f"{kind}-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model}


def chat_response(model: str, completion: Any, adapter: str | None, decision: Any, tools: bool) -> dict[str, Any]:
    from .actions import parse_action

    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    finish = completion.finish_reason or "stop"
    parsed = parse_action(completion.text) if tools else None
    if parsed is not None and parsed.is_tool_call:
        message = {"role": "assistant", "content": parsed.thought or None, "tool_calls": [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in parsed.tool_calls]}
        finish = "tool_calls" if finish == "stop" else finish
    usage = {"prompt_tokens": completion.prompt_tokens or 0, "completion_tokens": completion.completion_tokens or 0}
    return {**_stamp("chatcmpl", model), "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {**usage, "total_tokens": sum(usage.values())},
            "trace_gym": {"adapter": adapter, "route": decision.as_dict() if decision is not None else None}}


def completion_response(served: Served, model: str, completion: Any, body: dict[str, Any]) -> dict[str, Any]:
    turn = completion.tokens
    tokenizer = served.backend.tokenizer
    choice: dict[str, Any] = {"index": 0, "text": tokenizer.decode(turn.completion_ids, skip_special_tokens=True),
                              "finish_reason": completion.finish_reason or "stop", "logprobs": None}
    if body.get("logprobs") is not None:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        tokens = [f"token_id:{i}" if as_ids else tokenizer.decode([i]) for i in turn.completion_ids]
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(turn.logprobs),
                              "top_logprobs": None, "text_offset": None}
    if body.get("return_token_ids"):
        choice["token_ids"] = list(turn.completion_ids)
        choice["prompt_token_ids"] = list(turn.prompt_ids)
    usage = {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(turn.completion_ids)}
    return {**_stamp("cmpl", model), "object": "text_completion", "choices": [choice],
            "usage": {**usage, "total_tokens": sum(usage.values())}}


# --- batching and the episode caches ---------------------------------------------------------------

class Generator:
    """Runs the requests that arrive together as one batch on the backend. Each
    request gets a session: the one whose ids (prompt + completion) its prompt
    extends, else a new one, so an episode's keys and values are reused turn by turn."""

    def __init__(self, backend: Any, *, window_s: float = 0.005, max_sessions: int = 256):
        self.backend = backend
        self.window_s = window_s
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, list[int]] = OrderedDict()
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="trace-gym-serve-generate", daemon=True)
        self.thread.start()

    def submit(self, request: Any) -> Any:
        done: dict[str, Any] = {"event": threading.Event()}
        self.queue.put((request, done))
        done["event"].wait()
        if "error" in done:
            raise done["error"]
        return done["completion"]

    def _session(self, ids: list[int]) -> str:
        best, best_len = None, 0
        for name, held in self.sessions.items():
            if best_len < len(held) < len(ids) and ids[: len(held)] == held:
                best, best_len = name, len(held)
        if best is None:
            best = uuid.uuid4().hex
        else:
            del self.sessions[best]  # claimed by this request: another request must not extend it too
        return best

    def _finish(self, session: str, ids: list[int]) -> None:
        self.sessions[session] = ids
        while len(self.sessions) > self.max_sessions:
            old, _ = self.sessions.popitem(last=False)
            self.backend.release(old)

    def _loop(self) -> None:
        while True:
            batch = [self.queue.get()]
            deadline = time.monotonic() + self.window_s
            while len(batch) < getattr(self.backend, "max_batch", 8):
                try:
                    batch.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            for request, _ in batch:
                request.session = self._session(request.prompt_ids)
            try:
                completions = self.backend.complete([r for r, _ in batch])
            except Exception as exc:  # noqa: BLE001 - one bad batch is answered, the server goes on
                for request, done in batch:
                    done["error"] = _as_serve_error(exc)
                    done["event"].set()
                continue
            for (request, done), completion in zip(batch, completions):
                self._finish(request.session, [*completion.tokens.prompt_ids, *completion.tokens.completion_ids])
                done["completion"] = completion
                done["event"].set()


def _as_serve_error(exc: Exception) -> ServeError:
    from .llm.base import LLMError

    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, LLMError):
        return ServeError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return ServeError(f"the model failed on this request: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 500)


# --- HTTP -----------------------------------------------------------------------------------------

def make_server(served: Served, host: str = "127.0.0.1", port: int = 8000, *, log: Any = None) -> ThreadingHTTPServer:
    """An HTTP server for ``served`` (not started: call ``serve_forever``)."""
    generator = Generator(served.backend)
    lock = threading.Lock()  # routing scores with the base model; adapters load one at a time

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "trace-gym"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            if log is not None:
                log(f"{self.address_string()} {format % args}")

        def _send(self, status: int, payload: Any) -> None:
            body = (payload if isinstance(payload, str) else json.dumps(payload)).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, exc: ServeError) -> None:
            kind = "not_found_error" if exc.status == 404 else "invalid_request_error" if exc.status < 500 else "server_error"
            self._send(exc.status, {"error": {"message": str(exc), "type": kind, "param": None, "code": exc.status}})

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "trace-gym"}
                                                           for m in served.models()]})
            elif self.path.rstrip("/") in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            else:
                self._error(ServeError(f"no such endpoint: GET {self.path}", 404))

        def do_POST(self) -> None:  # noqa: N802
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise ServeError(f"a request body of {length} bytes is over the {MAX_BODY}-byte limit", 413)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise ServeError("the request body is not JSON") from None
                if not isinstance(body, dict):
                    raise ServeError("the request body must be a JSON object")
                path = self.path.rstrip("/")
                if path == "/v1/chat/completions":
                    with lock:
                        request, decision = chat_request(served, body)
                    completion = generator.submit(request)
                    self._send(200, chat_response(body.get("model") or served.name, completion, request.adapter, decision,
                                                  bool(body.get("tools"))))
                elif path == "/v1/completions":
                    request = completion_request(served, body)
                    self._send(200, completion_response(served, body.get("model") or served.name, generator.submit(request), body))
                elif path == "/v1/load_lora_adapter":
                    name, folder = body.get("lora_name"), body.get("lora_path")
                    if not isinstance(name, str) or not name or not isinstance(folder, str):
                        raise ServeError("load_lora_adapter needs 'lora_name' and 'lora_path'")
                    if name in served.models():
                        raise ServeError(f"the adapter '{name}' is already loaded")
                    if not (Path(folder) / "adapter_config.json").exists():
                        raise ServeError(f"no LoRA adapter at {folder} (no adapter_config.json there)")
                    with lock:
                        served.backend.load_adapter(name, folder)
                    self._send(200, f"Success: LoRA adapter '{name}' added successfully.")
                else:
                    raise ServeError(f"no such endpoint: POST {self.path}", 404)
            except ServeError as exc:
                self._error(exc)
            except Exception as exc:  # noqa: BLE001 - answered, never a dead server
                self._error(_as_serve_error(exc))

    return ThreadingHTTPServer((host, port), Handler)
