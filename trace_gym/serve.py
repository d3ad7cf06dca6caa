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
import sys
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .actions import parse_action
from .errors import TraceGymError
from .evaluation import Unavailable, get_method, policy_backend
from .llm import make_backend
from .llm.base import GenerationRequest, LLMError, NextTokenLogprobs
from .llm.registry import split_spec
from .pipeline import eval_context, load_run

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

    def vocabulary(self) -> int:
        """Ids a prompt may hold: the tokenizer's, and no more than the model has embeddings for."""
        size = len(self.backend.tokenizer)
        model = getattr(self.backend, "model", None)
        embeddings = getattr(model, "get_input_embeddings", None)
        rows = getattr(embeddings(), "num_embeddings", None) if callable(embeddings) else None
        return min(size, rows) if rows else size

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
    """The policy of an earlier ``trace-gym run`` with every adapter it trained (and
    ``summed``, their weights added, where it trained two or more capability adapters),
    and its router (none if the run trained no capability adapter)."""
    config, state = load_run(run_dir)
    ctx = eval_context(config, state, None)
    ctx.backend = policy_backend(config.policy.spec, ctx.adapters)
    _check_token_level(ctx.backend)
    try:
        router = get_method("trace").build(ctx).kwargs["router"]
    except Unavailable:
        router = None
    saved = config.run_dir / "eval" / "summed-adapter"
    try:
        if (saved / "adapter_config.json").exists():
            ctx.backend.load_adapter("summed", str(saved))  # what evaluation played and saved
        else:
            get_method("summed").build(ctx)  # the capability adapters' weights added, as evaluation adds them
    except Unavailable:
        pass
    except Exception as exc:  # noqa: BLE001 - the other adapters are still served
        print(
            f"trace-gym serve: no 'summed' adapter ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
            file=sys.stderr,
        )

    return Served(ctx.backend, split_spec(config.policy.model)[0], router)


def served_model(model: str, adapters: dict[str, str] | None = None) -> Served:
    """A local model (and adapters by name), with no router; served under its name
    without the spec's chat template choice."""
    backend = make_backend(model)
    _check_token_level(backend)
    for name, path in (adapters or {}).items():
        backend.load_adapter(name, path)
    return Served(backend, split_spec(model)[0])


def _check_token_level(backend: Any) -> None:
    if not getattr(backend, "token_level", False):
        raise ServeError(
            f"serve needs a token-level model (the embedded one, hf:<folder> or vllm:<model>), not "
            f"{backend.name}: an OpenAI-compatible server's chat model is served by that server"
        )


# --- requests -------------------------------------------------------------------------------------

SEED_RANGE = (0, 2**63 - 1)
MAX_TEMPERATURE = 5.0
MIN_TEMPERATURE = 1e-4
"""Below it, a temperature is greedy decoding (a tiny divisor would make the logits overflow)."""
UNSUPPORTED = {
    "stream": (False, None),
    "stop": (None, [], ""),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "top_p": (None, 1, 1.0),
    "top_k": (None, -1, 0),
    "min_p": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "response_format": (None, {"type": "text"}),
    "parallel_tool_calls": (None, True, False),
    "tool_choice": (None, "auto"),
}
"""Parameters this server does not implement, with the values that mean "not used"; any other
value is refused rather than silently ignored (``stream`` included: the reply is one JSON body)."""


def _number(
    body: dict[str, Any], key: str, default: Any, kind: type, low: float | None = None, high: float | None = None
) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not float(value).is_integer())
    ):
        raise ServeError(f"'{key}' must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ServeError(
            f"'{key}' must be {'at least ' + str(low) if high is None else f'between {low} and {high}'}, got {value}"
        )
    return kind(value)


def _common(
    served: Served, body: dict[str, Any], prompt_len: int, default_tokens: int, *, completions: bool = False
) -> dict[str, Any]:
    """Sampling settings of a request, each checked here, before it can share a batch
    with anyone else's: a request that would fail in the batch fails alone."""
    for key, neutral in UNSUPPORTED.items():
        if completions and key in ("logprobs",):
            continue
        if key in body and body[key] not in neutral:
            raise ServeError(f"'{key}' is not supported by this server (got {body[key]!r}); leave it out")
    if _number(body, "n", 1, int, 1) != 1:
        raise ServeError("'n' must be 1 here: send one request per sample, each with its own seed")
    stops = body.get("stop_token_ids")
    own = getattr(served.backend, "stop_ids", set())
    if stops is not None and set(stops if isinstance(stops, list) else [stops]) != set(own):
        raise ServeError(
            f"'stop_token_ids' {stops!r} differ from the ids this model stops on ({sorted(own)}): the "
            "client and the server render with different templates"
        )
    context = getattr(served.backend, "context_size", None) or 0
    room = context - prompt_len if context else None
    if room is not None and room < 1:
        raise ServeError(f"a prompt of {prompt_len} tokens leaves no room in the model's context of {context} tokens")
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    tokens = _number({"max_tokens": tokens}, "max_tokens", min(default_tokens, room or default_tokens), int, 1)
    if room is not None and tokens > room:
        raise ServeError(
            f"a prompt of {prompt_len} tokens with max_tokens {tokens} passes the model's context of {context} tokens"
        )
    temperature = _number(body, "temperature", 1.0, float, 0, MAX_TEMPERATURE)
    return {
        "max_new_tokens": tokens,
        "temperature": 0.0 if temperature < MIN_TEMPERATURE else temperature,
        "seed": _number(body, "seed", None, int, *SEED_RANGE),
    }


def chat_request(served: Served, body: dict[str, Any]) -> tuple[Any, Any]:
    """(generation request, route decision) of a chat completion body."""
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
    return GenerationRequest(
        messages=messages,
        tools=tools or None,
        adapter=adapter,
        prompt_ids=ids,
        prefix_len=prefix_len,
        **_common(served, body, len(ids), 1024),
    ), decision


def completion_request(served: Served, body: dict[str, Any]) -> Any:
    """The generation request of a token-id (vLLM) completion body."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt = served.backend.tokenizer.encode(prompt, add_special_tokens=False)
    vocabulary = served.vocabulary()
    if not (
        isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
    ):
        raise ServeError("'prompt' must be text or a non-empty list of token ids (one prompt per request)")
    if any(i < 0 or i >= vocabulary for i in prompt):
        raise ServeError(f"'prompt' holds token ids outside the vocabulary (0..{vocabulary - 1})")
    adapter, _ = served.adapter_for(body.get("model"), None)
    return GenerationRequest(
        messages=[],
        adapter=adapter,
        prompt_ids=list(prompt),
        prefix_len=_number(body, "prefix_len", 0, int, 0, len(prompt)),
        **_common(served, body, len(prompt), 16, completions=True),
    )


def _stamp(kind: str, model: str) -> dict[str, Any]:
    return {"id": f"{kind}-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model}


def chat_response(model: str, completion: Any, adapter: str | None, decision: Any, tools: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    finish = completion.finish_reason or "stop"
    parsed = parse_action(completion.text) if tools else None
    if parsed is not None and parsed.is_tool_call:
        message = {
            "role": "assistant",
            "content": parsed.thought or None,
            "tool_calls": [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                }
                for c in parsed.tool_calls
            ],
        }
        finish = "tool_calls" if finish == "stop" else finish
    usage = {"prompt_tokens": completion.prompt_tokens or 0, "completion_tokens": completion.completion_tokens or 0}
    return {
        **_stamp("chatcmpl", model),
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {**usage, "total_tokens": sum(usage.values())},
        "trace_gym": {"adapter": adapter, "route": decision.as_dict() if decision is not None else None},
    }


MAX_TOP_LOGPROBS = 20
"""vLLM's own default cap on ``logprobs``."""


def top_logprobs_of(body: dict[str, Any]) -> int:
    """How many top logprobs a token-id completion asks for: vLLM's ``logprobs: k``
    (0, or absent: the sampled token's logprob only)."""
    return _number(body, "logprobs", 0, int, 0, MAX_TOP_LOGPROBS)


def scoring_response(served: Served, model: str, request: Any, k: int) -> dict[str, Any]:
    """A one-token greedy completion with the ``k`` likeliest first tokens: what a client
    scoring labels asks for (``VLLMTokens.score``). Top logprobs of a longer or sampled
    completion are not implemented, and are refused rather than left out."""
    if request.max_new_tokens != 1 or request.temperature != 0.0:
        raise ServeError(
            f"'logprobs': {k} (top logprobs) is served for one greedy token only (max_tokens 1, temperature 0), "
            "the request a client scoring labels makes; use 'logprobs': 0 to generate"
        )
    if not isinstance(served.backend, NextTokenLogprobs):
        raise ServeError(f"{served.backend.name} cannot give top logprobs", 501)
    top = served.backend.next_token_logprobs(
        request.prompt_ids, prefix_len=request.prefix_len, adapter=request.adapter, k=k
    )
    tokenizer = served.backend.tokenizer
    best, logprob = top[0]
    choice = {
        "index": 0,
        "text": tokenizer.decode([best], skip_special_tokens=True),
        "finish_reason": "length",
        "logprobs": {
            "tokens": [f"token_id:{best}"],
            "token_logprobs": [logprob],
            "top_logprobs": [{f"token_id:{i}": lp for i, lp in top}],
            "text_offset": None,
        },
        "token_ids": [best],
    }
    usage = {"prompt_tokens": len(request.prompt_ids), "completion_tokens": 1}
    return {
        **_stamp("cmpl", model),
        "object": "text_completion",
        "choices": [choice],
        "usage": {**usage, "total_tokens": sum(usage.values())},
    }


def completion_response(served: Served, model: str, completion: Any, body: dict[str, Any]) -> dict[str, Any]:
    turn = completion.tokens
    tokenizer = served.backend.tokenizer
    choice: dict[str, Any] = {
        "index": 0,
        "text": tokenizer.decode(turn.completion_ids, skip_special_tokens=True),
        "finish_reason": completion.finish_reason or "stop",
        "logprobs": None,
    }
    if body.get("logprobs") is not None:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        tokens = [f"token_id:{i}" if as_ids else tokenizer.decode([i]) for i in turn.completion_ids]
        choice["logprobs"] = {
            "tokens": tokens,
            "token_logprobs": list(turn.logprobs),
            "top_logprobs": None,
            "text_offset": None,
        }
    if body.get("return_token_ids"):
        choice["token_ids"] = list(turn.completion_ids)
        choice["prompt_token_ids"] = list(turn.prompt_ids)
    usage = {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(turn.completion_ids)}
    return {
        **_stamp("cmpl", model),
        "object": "text_completion",
        "choices": [choice],
        "usage": {**usage, "total_tokens": sum(usage.values())},
    }


# --- batching and the episode caches ---------------------------------------------------------------


class Generator:
    """Runs the requests that arrive together as one batch on the backend. Each
    request gets a session: the one of its adapter whose ids (prompt + completion)
    its prompt extends, else a new one, so an episode's keys and values are reused
    turn by turn. A batch that fails is run again request by request, so a
    request answers for its own mistakes only."""

    def __init__(self, backend: Any, *, window_s: float = 0.005, max_sessions: int = 256, wait_s: float = 3600.0):
        self.backend = backend
        self.window_s = window_s
        self.wait_s = wait_s
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, tuple[str | None, list[int]]] = OrderedDict()
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="trace-gym-serve-generate", daemon=True)
        self.thread.start()

    def submit(self, request: Any) -> Any:
        done: dict[str, Any] = {"event": threading.Event()}
        self.queue.put((request, done))
        deadline = time.monotonic() + self.wait_s
        while not done["event"].wait(1.0):
            if not self.thread.is_alive():
                raise ServeError("the generation thread has stopped; restart the server", 500)
            if time.monotonic() > deadline:
                raise ServeError(f"no completion within {self.wait_s:.0f} s", 503)
        if "error" in done:
            raise done["error"]
        return done["completion"]

    def _session(self, adapter: str | None, ids: list[int]) -> str:
        best, best_len = None, 0
        for name, (held_adapter, held) in self.sessions.items():
            if held_adapter == adapter and best_len < len(held) < len(ids) and ids[: len(held)] == held:
                best, best_len = name, len(held)
        if best is None:
            return uuid.uuid4().hex
        del self.sessions[best]  # claimed by this request: another request must not extend it too
        return best

    def _finish(self, session: str, adapter: str | None, ids: list[int]) -> None:
        self.sessions[session] = (adapter, ids)
        while len(self.sessions) > self.max_sessions:
            old, _ = self.sessions.popitem(last=False)
            self.backend.release(old)

    def _run(self, batch: list[tuple[Any, dict[str, Any]]]) -> None:
        try:
            completions = self.backend.complete([request for request, _ in batch])
            if len(completions) != len(batch):
                raise ServeError(f"the model gave {len(completions)} completions for {len(batch)} requests", 500)
        except Exception as exc:  # noqa: BLE001 - answered below, never the thread's end
            if len(batch) > 1:
                for item in batch:  # whose request was it? each alone answers for itself
                    self._run([item])
                return
            batch[0][1]["error"] = _as_serve_error(exc)
            return
        for (request, done), completion in zip(batch, completions):
            turn = completion.tokens
            if turn is not None:
                self._finish(request.session, request.adapter, [*turn.prompt_ids, *turn.completion_ids])
            done["completion"] = completion

    def _loop(self) -> None:
        while True:
            batch = [self.queue.get()]
            deadline = time.monotonic() + self.window_s
            while len(batch) < getattr(self.backend, "max_batch", 8):
                try:
                    batch.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            try:
                for request, _ in batch:
                    request.session = self._session(request.adapter, request.prompt_ids)
                self._run(batch)
            except Exception as exc:  # noqa: BLE001 - whatever went wrong, every waiting client is answered
                for _, done in batch:
                    done.setdefault("error", _as_serve_error(exc))
            finally:
                for _, done in batch:
                    if "completion" not in done:
                        done.setdefault("error", ServeError("the model gave no completion for this request", 500))
                    done["event"].set()


def _as_serve_error(exc: Exception) -> ServeError:
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, (LLMError, TraceGymError)):
        return ServeError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return ServeError(
        f"the model failed on this request: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 500
    )


# --- HTTP -----------------------------------------------------------------------------------------

LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}


def make_server(
    served: Served,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log: Any = None,
    api_key: str | None = None,
    allow_adapter_loading: bool = False,
) -> ThreadingHTTPServer:
    """An HTTP server for ``served`` (not started: call ``serve_forever``). With
    ``api_key``, every request must carry it as a bearer token. Bound to a loopback
    address, it answers only requests addressed to a loopback name (a web page the
    user visits cannot reach it by DNS rebinding) and only JSON bodies (no form a page
    can post). ``/v1/load_lora_adapter`` is refused unless ``allow_adapter_loading``."""
    generator = Generator(served.backend)
    lock = threading.Lock()  # routing scores with the base model; adapters load one at a time
    loopback = host in LOOPBACK_NAMES

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "trace-gym"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            if log is not None:
                log(f"{self.address_string()} {format % args}")

        def _send(self, status: int, payload: Any) -> None:
            body = (payload if isinstance(payload, str) else json.dumps(payload)).encode("utf-8")
            self.send_response(status)
            self.send_header(
                "Content-Type", "text/plain; charset=utf-8" if isinstance(payload, str) else "application/json"
            )
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _error(self, exc: ServeError) -> None:
            kind = (
                "not_found_error"
                if exc.status == 404
                else "invalid_request_error"
                if exc.status < 500
                else "server_error"
            )
            self._send(exc.status, {"error": {"message": str(exc), "type": kind, "param": None, "code": exc.status}})

        def _admit(self) -> None:
            """Refuse a request this server must not answer (before its body is read)."""
            if loopback:
                header = self.headers.get("Host") or ""
                name = header.split("]")[0] + "]" if header.startswith("[") else header.rsplit(":", 1)[0]
                if name not in LOOPBACK_NAMES:
                    self.close_connection = True
                    raise ServeError(
                        f"this server answers requests to {host} only (Host: {self.headers.get('Host')!r})", 403
                    )
            if api_key is not None and self.headers.get("Authorization") != f"Bearer {api_key}":
                self.close_connection = True
                raise ServeError("a valid API key is needed (Authorization: Bearer <key>)", 401)

        def _body(self) -> dict[str, Any]:
            if (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() != "application/json":
                self.close_connection = True
                raise ServeError("the request body must be JSON (Content-Type: application/json)", 415)
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self.close_connection = True  # the body is left unread: nothing more can be read on this connection
                raise ServeError(
                    f"Content-Length must be a number of bytes up to {MAX_BODY}, got "
                    f"{self.headers.get('Content-Length')!r}",
                    413 if length > MAX_BODY else 400,
                )
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ServeError("the request body is not JSON") from None
            if not isinstance(body, dict):
                raise ServeError("the request body must be a JSON object")
            return body

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            try:
                self._admit()
                path = self.path.rstrip("/")
                if path == "/v1/models":
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [
                                {"id": m, "object": "model", "created": 0, "owned_by": "trace-gym"}
                                for m in served.models()
                            ],
                        },
                    )
                elif path in ("/health", "/v1/health"):
                    stats = getattr(served.backend, "cache_stats", None)
                    self._send(200, {"status": "ok", "cache": stats() if callable(stats) else None})
                else:
                    raise ServeError(f"no such endpoint: GET {self.path}", 404)
            except ServeError as exc:
                self._error(exc)

        def do_POST(self) -> None:  # noqa: N802
            try:
                self._admit()
                body = self._body()
                path = self.path.rstrip("/")
                if path == "/v1/chat/completions":
                    with lock:
                        request, decision = chat_request(served, body)
                    completion = generator.submit(request)
                    self._send(
                        200,
                        chat_response(
                            body.get("model") or served.name,
                            completion,
                            request.adapter,
                            decision,
                            bool(body.get("tools")),
                        ),
                    )
                elif path == "/v1/completions":
                    request = completion_request(served, body)
                    model = body.get("model") or served.name
                    k = top_logprobs_of(body)
                    if k:
                        self._send(200, scoring_response(served, model, request, k))
                    else:
                        self._send(200, completion_response(served, model, generator.submit(request), body))
                elif path == "/v1/load_lora_adapter":
                    if not allow_adapter_loading:
                        raise ServeError(
                            "loading adapters at run time is off; start the server with --allow-adapter-loading", 403
                        )
                    name, folder = body.get("lora_name"), body.get("lora_path")
                    if not isinstance(name, str) or not name or not isinstance(folder, str):
                        raise ServeError("load_lora_adapter needs 'lora_name' and 'lora_path'")
                    if not (Path(folder) / "adapter_config.json").exists():
                        raise ServeError(f"no LoRA adapter at {folder} (no adapter_config.json there)")
                    with lock:
                        if name in served.models():
                            raise ServeError(f"the adapter '{name}' is already loaded")
                        served.backend.load_adapter(name, folder)
                    self._send(200, f"Success: LoRA adapter '{name}' added successfully.")
                else:
                    raise ServeError(f"no such endpoint: POST {self.path}", 404)
            except ServeError as exc:
                self._error(exc)
            except Exception as exc:  # noqa: BLE001 - answered, never a dead server
                self._error(_as_serve_error(exc))

    return ThreadingHTTPServer((host, port), Handler)
