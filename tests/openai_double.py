"""A local OpenAI-compatible server for tests: real HTTP on 127.0.0.1, the real
chat-completions protocol, answers from a function the test gives.

A test double at the edge of the network only: everything on our side of the
socket (the openai SDK, our backend, agent and env) runs for real.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

# request body -> {"content": ...} or {"tool_calls": [...]}, optionally with "top_logprobs":
# [{"token", "logprob"}, ...] (returned when the request asks for logprobs); or {"status": 400,
# "message": ...} for an error response
Answer = Callable[[dict[str, Any]], dict[str, Any]]


class OpenAIDouble:
    def __init__(self, answer: Answer, *, key: str = "test-key", models: tuple[str, ...] = ("double",)):
        self.answer = answer
        self.key = key
        self.models = models
        self.requests: list[dict[str, Any]] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                double.requests.append(body)
                if self.headers.get("Authorization") != f"Bearer {double.key}":
                    return self._send(
                        401,
                        {
                            "error": {
                                "message": "Incorrect API key provided.",
                                "type": "invalid_request_error",
                                "code": "invalid_api_key",
                            }
                        },
                    )
                if body.get("model") not in double.models:
                    return self._send(
                        404,
                        {
                            "error": {
                                "message": f"The model `{body.get('model')}` does not exist.",
                                "type": "invalid_request_error",
                                "code": "model_not_found",
                            }
                        },
                    )
                reply = double.answer(body)
                if "status" in reply:  # an error the server answers with, e.g. {"status": 400, "message": "..."}
                    return self._send(
                        reply["status"],
                        {"error": {"message": reply.get("message", "error"), "type": "invalid_request_error"}},
                    )
                message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
                if reply.get("tool_calls"):
                    message["tool_calls"] = [
                        {
                            "id": f"call_{uuid.uuid4().hex[:8]}",
                            "type": "function",
                            "function": {
                                "name": c["name"],
                                "arguments": c["arguments"]
                                if isinstance(c["arguments"], str)
                                else json.dumps(c["arguments"]),
                            },
                        }
                        for c in reply["tool_calls"]
                    ]
                prompt = sum(len(str(m.get("content") or "")) // 4 for m in body.get("messages", []))
                choice: dict[str, Any] = {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                }
                if body.get("logprobs") and reply.get("top_logprobs"):  # the answer's first token and its alternatives
                    top = [{"token": t["token"], "logprob": t["logprob"], "bytes": None} for t in reply["top_logprobs"]]
                    choice["logprobs"] = {"content": [{**top[0], "top_logprobs": top[: body.get("top_logprobs") or 0]}]}
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [choice],
                        "usage": {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7},
                    },
                )

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "OpenAIDouble":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def gold_answer(scripts: dict[str, list[str]]) -> Answer:
    """Answer with the oracle's next action for the conversation, found by its
    first user message; native tool calls for tool-call actions."""
    from trace_gym.actions import parse_action

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        start = next(i for i, m in enumerate(messages) if m["role"] == "user")
        first_user = messages[start]["content"]
        turn = sum(1 for m in messages[start:] if m["role"] == "assistant")  # not the env's greeting before it
        script = scripts[first_user]
        action = parse_action(script[min(turn, len(script) - 1)])
        if action.is_tool_call:
            return {"tool_calls": [{"name": c.name, "arguments": c.arguments} for c in action.tool_calls]}
        return {"content": action.content}

    return answer
