"""The ``serve`` verb: a model, or an earlier run's policy and adapters, behind an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import TraceGymError
from .common import TEMPLATE_HELP, model_spec


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add the ``serve`` verb to ``sub``, the top parser's subcommands."""
    serve = sub.add_parser(
        "serve",
        help="the improved agent behind an OpenAI-compatible API, each conversation routed",
        description="An OpenAI-compatible server (chat completions with tools, vLLM's token-id "
        "completions, /v1/load_lora_adapter) over a local model. Given an earlier run, it "
        "serves its policy with every adapter the run trained, and the model id 'trace' "
        "routes each conversation to its capability adapter as evaluation does.",
    )
    serve.add_argument(
        "run_dir",
        metavar="RUN",
        nargs="?",
        default=None,
        help="an earlier trace-gym run (its policy, adapters and router)",
    )
    serve.add_argument(
        "--model",
        default=None,
        help="without RUN: a local model, the embedded smollm2-135m-instruct "
        "(default), a shipped warm start or hf:<folder>",
    )
    serve.add_argument("--chat-template", default=None, metavar="T", help="with --model: " + TEMPLATE_HELP)
    serve.add_argument(
        "--adapter",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="also serve this LoRA adapter under NAME (repeatable)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.add_argument(
        "--api-key",
        default=None,
        help="require this key from every client (Authorization: Bearer KEY); "
        "default: the TRACE_GYM_SERVE_API_KEY variable, else none",
    )
    serve.add_argument(
        "--allow-adapter-loading",
        action="store_true",
        help="answer /v1/load_lora_adapter (off: a client cannot make the server read a folder)",
    )
    serve.add_argument("--quiet", action="store_true", help="do not log each request to stderr")
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..serve import ROUTED, make_server, served_from_run, served_model

    if args.run_dir and (args.model or args.chat_template):
        raise TraceGymError("give RUN (its policy is served, under its own chat template) or --model, not both")
    adapters = {}
    for item in args.adapter or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise TraceGymError(f"--adapter: expected NAME=PATH, got {item!r}")
        if not (Path(path) / "adapter_config.json").exists():
            raise TraceGymError(f"--adapter {name}: no LoRA adapter at {path} (no adapter_config.json there)")
        adapters[name] = path
    if args.run_dir:
        served = served_from_run(args.run_dir)
        for name, path in adapters.items():
            served.backend.load_adapter(name, path)
    else:
        from ..llm import EMBEDDED_DEFAULT

        served = served_model(model_spec(args.model or EMBEDDED_DEFAULT, args.chat_template), adapters)
    try:
        server = make_server(
            served,
            args.host,
            args.port,
            log=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
            api_key=args.api_key or os.environ.get("TRACE_GYM_SERVE_API_KEY") or None,
            allow_adapter_loading=args.allow_adapter_loading,
        )
    except OSError as exc:
        raise TraceGymError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    host, port = server.server_address[:2]
    routed = f"'{ROUTED}' routes each conversation; " if served.router is not None else ""
    print(f"serving {', '.join(served.models())} at http://{host}:{port}/v1 ({routed}Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
