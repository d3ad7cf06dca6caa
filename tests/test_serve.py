"""`trace-gym serve` as a real process on 127.0.0.1: the openai SDK gets routed tool
calls from an earlier run's adapters, and the vLLM-protocol client (`vllm:<model>`)
plays τ² episodes through the server with the ids and logprobs the local model gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import gymnasium as gym
import pytest

import trace_gym  # noqa: F401
from conftest import run_cli

pytest.importorskip("peft")
WARM = "smollm2-135m-tau2-retail-sft"


@contextmanager
def serving(*args: str, start_s: float = 180):
    """A `trace-gym serve ... --port 0` process; yields its base URL."""
    import threading

    exe = shutil.which("trace-gym", path=str(Path(sys.executable).parent)) or "trace-gym"
    process = subprocess.Popen(
        [exe, "serve", *args, "--port", "0", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(start_s)
    try:
        assert first and first[0].startswith("serving "), f"the server did not start: {first}"
        yield first[0].split(" at ", 1)[1].split()[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


def post(url: str, body, headers: dict | None = None) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def _play(backend, episodes: int = 1):
    from trace_gym.agents import LLMAgent
    from trace_gym.rollout import Episode, play_batched

    env = gym.make("trace/tau2-retail-v0", split="base", max_steps=4)  # two agent turns
    try:
        agent = LLMAgent(backend, max_new_tokens=40)
        return list(
            play_batched(
                [env], [agent], "trace/tau2-retail-v0", [Episode(str(task), 0, task) for task in range(episodes)]
            )
        )
    finally:
        env.close()


@pytest.mark.slow
def test_the_vllm_client_plays_the_episodes_the_local_model_plays():
    from trace_gym.llm import make_backend

    local = _play(make_backend(WARM))
    with serving("--model", WARM) as url:
        remote_backend = make_backend(f"vllm:{WARM}", base_url=url)
        assert remote_backend.token_level and remote_backend.stop_ids == make_backend(WARM).stop_ids
        remote = _play(remote_backend)
        with urllib.request.urlopen(f"{url.removesuffix('/v1')}/health", timeout=30) as response:
            cache = json.loads(response.read())["cache"]
        refused = post(f"{url}/load_lora_adapter", {"lora_name": "x", "lora_path": "/"})
        assert refused[0] == 403 and "--allow-adapter-loading" in refused[1]  # off unless asked for
    assert cache["hits"] >= 1  # a later turn extended the episode's keys and values on the server
    assert [p.trajectory.task_id for p in remote] == [p.trajectory.task_id for p in local]
    for mine, theirs in zip(local, remote):
        assert len(theirs.tokens.turns) == len(mine.tokens.turns) >= 2
        assert theirs.tokens.ids == mine.tokens.ids and theirs.tokens.mask == mine.tokens.mask
        assert theirs.tokens.logprobs == pytest.approx(mine.tokens.logprobs, abs=2e-3)
        assert [m.content for m in theirs.trajectory.messages] == [m.content for m in mine.trajectory.messages]


@pytest.mark.slow
def test_serve_routes_each_conversation_of_an_earlier_run_to_its_adapter(tmp_path):
    import openai

    from test_evaluation import _earlier_run, _lora, _model_folder, _policy

    run = _earlier_run(tmp_path)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_order_details",
                "description": "An order's status and items.",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}},
                    "required": ["order_id"],
                },
            },
        }
    ]
    messages = [
        {"role": "system", "content": "You are a retail customer-service agent. Call tools to look things up."},
        {"role": "user", "content": "I want to return the blue headphones from order #W1234567."},
    ]
    key = {"Authorization": "Bearer sesame"}
    with serving(str(run), "--api-key", "sesame", "--allow-adapter-loading") as url:
        client = openai.OpenAI(base_url=url, api_key="sesame")
        served = [m.id for m in client.models.list().data]
        assert served[0] == "trace" and _policy(run) in served
        assert {"precise_arguments", "complete_actions", "grpo-target", "merged", "summed"} <= set(served)
        reply = client.chat.completions.create(
            model="trace", messages=messages, tools=tools, max_tokens=24, temperature=0
        )
        route = reply.model_extra["trace_gym"]["route"]
        assert route["capability"] in {"precise_arguments", "complete_actions", None} and set(route["scores"]) == {
            "A",
            "B",
            "none",
        }
        assert reply.model_extra["trace_gym"]["adapter"] == route["adapter"]
        assert reply.choices[0].finish_reason in {"stop", "length", "tool_calls"} and reply.usage.completion_tokens >= 1
        again = client.chat.completions.create(
            model="trace",
            messages=[*messages, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Thanks."}],
            max_tokens=4,
        )
        assert again.model_extra["trace_gym"]["route"] == route  # one conversation, one route (its opening)
        named = client.chat.completions.create(model="merged", messages=messages, max_tokens=4)
        assert named.model_extra["trace_gym"] == {"adapter": "merged", "route": None}

        with pytest.raises(openai.NotFoundError, match="does not exist here"):
            client.chat.completions.create(model="no-such-adapter", messages=messages, max_tokens=4)
        for bad, words in (
            ({"model": "trace", "messages": []}, "non-empty list"),
            ({"messages": messages, "max_tokens": 0}, "at least 1"),
            ({"messages": messages, "n": 2}, "'n' must be 1"),
            ({"messages": messages, "tools": "x"}, "'tools' must be"),
        ):
            status, body = post(f"{url}/chat/completions", bad, key)
            assert status == 400 and words in json.loads(body)["error"]["message"], body
        for bad, words in (
            ({"prompt": [10**9], "max_tokens": 2}, "outside the vocabulary"),
            ({"prompt": [1, 2, 3], "max_tokens": 40000}, "context"),  # over the tiny model's 32k: one line
            ({"prompt": [1, 2, 3], "seed": 10**40}, "'seed' must be between"),
            ({"prompt": [1, 2, 3], "temperature": 1e9}, "'temperature' must be between"),
            ({"prompt": [1, 2, 3], "stream": True}, "'stream' is not supported"),
            ({"prompt": [1, 2, 3], "top_p": 0.5}, "'top_p' is not supported"),
            ({"prompt": [1, 2, 3], "stop_token_ids": [5]}, "differ from the ids"),
        ):
            status, body = post(f"{url}/completions", bad, key)
            assert status == 400 and words in body, body
        assert post(f"{url}/completions", {"prompt": [1, 2, 3], "max_tokens": 2})[0] == 401  # no key
        assert post(f"{url}/completions", b"prompt=1", {**key, "Content-Type": "text/plain"})[0] == 415  # no form posts
        host = urllib.request.Request(f"{url}/models", headers={**key, "Host": "evil.example:80"})
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(host, timeout=30)  # a page that rebinds its name to 127.0.0.1

        _lora(tmp_path / "new", _model_folder(run))
        status, body = post(f"{url}/load_lora_adapter", {"lora_name": "late", "lora_path": str(tmp_path / "new")}, key)
        assert status == 200 and "Success" in body
        assert "late" in [m.id for m in client.models.list().data]
        assert (
            client.chat.completions.create(model="late", messages=messages, max_tokens=4).model_extra["trace_gym"][
                "adapter"
            ]
            == "late"
        )
        for bad, words in (
            ({"lora_name": "late", "lora_path": str(tmp_path / "new")}, "already loaded"),
            ({"lora_name": "x", "lora_path": str(tmp_path / "none")}, "no LoRA adapter"),
        ):
            status, body = post(f"{url}/load_lora_adapter", bad, key)
            assert status == 400 and words in body, body
        status, body = post(f"{url}/chat/completions", {"model": "trace"}, key)
        assert status == 400  # the server is still up after every refusal
        assert client.models.list().data


def test_a_request_answers_for_its_own_mistakes_and_an_episode_keeps_its_session():
    """The generator's own logic over a backend that fails any batch holding a bad row:
    batched with a good request, the bad one gets the error and the good one its
    completion; a request extending an earlier one's ids (same adapter) continues its session."""
    import threading

    from trace_gym.llm.base import Completion, GenerationRequest, LLMError, TokenTurn
    from trace_gym.serve import Generator

    class Backend:
        max_batch = 8

        def __init__(self):
            self.batches: list[list[tuple[str, str | None]]] = []

        def complete(self, requests):
            self.batches.append([(r.session, r.adapter) for r in requests])
            if any(r.max_new_tokens == 99 for r in requests):
                raise LLMError("row 99 is bad")
            return [Completion("ok", tokens=TokenTurn(list(r.prompt_ids), [7], [0.0])) for r in requests]

        def release(self, session):
            pass

    backend = Backend()
    generator = Generator(backend, window_s=0.5)
    answers: dict[str, object] = {}

    def ask(name, request):
        try:
            answers[name] = generator.submit(request)
        except Exception as exc:  # noqa: BLE001 - the answer under test
            answers[name] = exc

    threads = [
        threading.Thread(target=ask, args=(n, GenerationRequest([], prompt_ids=[1, 2], max_new_tokens=t)))
        for n, t in (("good", 4), ("bad", 99))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(backend.batches[0]) == 2 and [len(b) for b in backend.batches[1:]] == [1, 1]  # together, then alone
    assert isinstance(answers["bad"], Exception) and "row 99" in str(answers["bad"])
    assert answers["good"].tokens.completion_ids == [7]
    [good_session] = [name for name, (_, ids) in generator.sessions.items() if ids == [1, 2, 7]]
    ask("next", GenerationRequest([], prompt_ids=[1, 2, 7, 8], max_new_tokens=4))
    assert backend.batches[-1] == [(good_session, None)]  # the episode's next turn, its own session
    ask("other", GenerationRequest([], prompt_ids=[1, 2, 7, 8, 7, 9], max_new_tokens=4, adapter="x"))
    assert backend.batches[-1][0][0] != good_session  # another adapter never continues it


@pytest.mark.slow
def test_labels_scored_through_the_server_are_the_local_models_logprobs():
    """The router's scores through a vLLM-protocol server (one greedy token with its top
    logprobs) are the local model's; top logprobs of anything longer are refused, not dropped."""
    from trace_gym.llm import make_backend

    conversation = [
        {"role": "system", "content": "Answer with one label."},
        {"role": "user", "content": "Which fits a refund request, A or B?"},
    ]
    want = make_backend("smollm2-135m-instruct").score(conversation, ["A", "B"])  # one token each
    with serving("--model", "smollm2-135m-instruct") as url:
        got = make_backend("vllm:smollm2-135m-instruct", base_url=url).score(conversation, ["A", "B"])
        longer = post(f"{url}/completions", {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "logprobs": 5})
        too_many = post(f"{url}/completions", {"prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0, "logprobs": 50})
    assert got == pytest.approx(want, abs=2e-3)
    assert longer[0] == 400 and "one greedy token only" in longer[1]
    assert too_many[0] == 400 and "'logprobs' must be between 0 and 20" in too_many[1]


def test_serve_refuses_what_it_cannot_serve_in_one_line(tmp_path):
    for args, words in (
        (["--model", "openai:gpt-x"], "needs a token-level model"),
        ([str(tmp_path)], "holds no run"),
        (["--adapter", "oops"], "expected NAME=PATH"),
        (["--adapter", f"a={tmp_path}"], "no LoRA adapter"),
        ([str(tmp_path), "--model", WARM], "not both"),
    ):
        result = run_cli("serve", *args, "--port", "0")
        assert result.returncode == 2 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            result.stderr
        )


def test_the_vllm_client_refuses_what_it_cannot_use_in_one_line(tmp_path):
    """No tokenizer here, a 4xx (never asked again), a reply without sampled ids, a
    server that is not there (asked again, then given up): each one LLMError."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from trace_gym.llm import LLMError, make_backend

    with pytest.raises(LLMError, match="no tokenizer"):
        make_backend(f"vllm:{tmp_path}")
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(self.path)
            status, body = (
                (400, b'{"error": {"message": "bad request"}}')
                if len(calls) == 1
                else (200, b'{"choices": [{"text": "x"}]}')
            )
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conversation = [[{"role": "user", "content": "hi"}]]
    try:
        client = make_backend(
            "vllm:smollm2-135m-instruct", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", backoff_s=0
        )
        with pytest.raises(LLMError, match="400 bad request"):
            client.generate(conversation, max_new_tokens=2)
        assert calls == ["/v1/completions"]  # a request the server refused is not sent again
        with pytest.raises(LLMError, match="no sampled token ids"):
            client.generate(conversation, max_new_tokens=2)
    finally:
        server.shutdown()
    gone = make_backend("vllm:smollm2-135m-instruct", base_url="http://127.0.0.1:9/v1", max_retries=1, backoff_s=0)
    with pytest.raises(LLMError, match="no answer after 2 tries"):
        gone.generate(conversation, max_new_tokens=2)
