"""The ``envs`` and ``targets`` verbs: list, scaffold, freeze, serve and catalogue registry envs."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import TraceGymError
from .common import format_table


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add the ``envs`` and ``targets`` verbs to ``sub``, the top parser's subcommands."""
    envs = sub.add_parser("envs", help="list and manage registered environments")
    envs_sub = envs.add_subparsers(title="envs commands", metavar="COMMAND")
    listing = envs_sub.add_parser("list", help="id, kind, target, capability and validation status of every env")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=cmd_envs_list)
    new = envs_sub.add_parser("new", help="scaffold a new synthesized env folder that already passes validation")
    new.add_argument("name", help="lower-case name with dashes, e.g. order-lookup (id trace/<name>-v0)")
    new.add_argument("--target", required=True, help="the target env id, e.g. trace/tau2-retail-v0")
    new.add_argument("--dir", default="env_registry", help="where to create the folder (default env_registry)")
    new.add_argument("--capability", default="", help="the capability's short name")
    new.add_argument("--description", default="", help="the capability in one sentence")
    new.set_defaults(func=cmd_envs_new)
    freeze = envs_sub.add_parser(
        "freeze-tools",
        help="re-freeze a target's tool schemas and result shapes into env_registry/<target>/tools.json and results.json",
    )
    freeze.add_argument("env_id")
    freeze.set_defaults(func=cmd_envs_freeze)

    eserve = envs_sub.add_parser(
        "serve",
        help="serve a registry env as an OpenEnv environment (episodes on its /ws)",
        description="OpenEnv's server (openenv-core) over a registry env, a target or a "
        "synthesized env in its sandbox: reset takes seed, task_id and split; the "
        'action is {"text": the agent\'s turn}; the observation holds the text, the '
        "messages, the system prompt and tools at reset, and the reward at the end. "
        "docs/targets.md has the protocol.",
    )
    eserve.add_argument("env_id")
    eserve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    eserve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    eserve.add_argument(
        "--max-sessions", type=int, default=8, help="episodes played at once, one per WebSocket session (default 8)"
    )
    eserve.set_defaults(func=cmd_envs_serve)
    catalog = envs_sub.add_parser("catalog", help="write the registry catalogue (CATALOG.md and catalog.json)")
    catalog.add_argument(
        "--registry", default=None, metavar="DIR", help="the registry folder (default: the installed env_registry)"
    )
    catalog.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the committed catalogue is out of date"
    )
    catalog.set_defaults(func=cmd_envs_catalog)

    targets = sub.add_parser("targets", help="a target of your own: scaffold it, freeze its tools")
    targets_sub = targets.add_subparsers(title="targets commands", metavar="COMMAND")
    tnew = targets_sub.add_parser(
        "new",
        help="scaffold a target of your own that already plays (docs/targets.md)",
        description="Writes DIR/NAME/manifest.toml and DIR/NAME/<name>.py: a plain gymnasium.Env "
        "(a small order desk with train and test tasks, tools, a reward and "
        "reference solutions) that rollout, the oracle and training play as it is. "
        "Make it yours one piece at a time.",
    )
    tnew.add_argument("name", help="lower-case name with dashes, e.g. my-desk (id trace/<name>-v0)")
    tnew.add_argument(
        "--dir",
        default=".",
        help="where to create the folder (default: here); register it by putting "
        "this folder on TRACE_GYM_REGISTRY_PATH or in a package's trace_gym.registry entry point",
    )
    tnew.add_argument("--description", default="", help="one sentence on what the target is")
    tnew.set_defaults(func=cmd_targets_new)
    tfreeze = targets_sub.add_parser(
        "freeze",
        help="freeze a target's tool schemas and result formats (tools.json and "
        "results.json beside its manifest, both or neither)",
    )
    tfreeze.add_argument("env_id")
    tfreeze.set_defaults(func=cmd_envs_freeze)


def cmd_envs_list(args: argparse.Namespace) -> int:
    from ..registry import discover

    rows = [
        {
            "id": e.id,
            "kind": e.kind,
            "target": e.target or "",
            "capability": e.capability.get("name", ""),
            "status": e.validation_status(),
        }
        for e in discover().values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows, ["id", "kind", "target", "capability", "status"]))
    return 0


def cmd_envs_new(args: argparse.Namespace) -> int:
    from ..scaffold import new_env

    folder = new_env(args.name, args.target, args.dir, args.capability, args.description)
    print(f"created {folder}/ (env.py, manifest.toml, README.md); next: edit env.py, then trace-gym validate {folder}")
    return 0


def cmd_targets_new(args: argparse.Namespace) -> int:
    from ..scaffold import new_target

    folder = new_target(args.name, args.dir, args.description)
    parent = os.path.abspath(args.dir)
    print(
        f"created {folder}/ (manifest.toml, {args.name.replace('-', '_')}.py); next:\n"
        f"  export TRACE_GYM_REGISTRY_PATH={parent}${{TRACE_GYM_REGISTRY_PATH:+:$TRACE_GYM_REGISTRY_PATH}}\n"
        f"  trace-gym rollout --env trace/{args.name}-v0 --agent oracle --split train --out runs/{args.name}-oracle.jsonl\n"
        f"  trace-gym targets freeze trace/{args.name}-v0"
    )
    return 0


def cmd_envs_serve(args: argparse.Namespace) -> int:
    from ..openenv_server import BackgroundServer

    if not 0 <= args.port < 65536:
        raise TraceGymError(f"--port must be in 0..65535, got {args.port}")
    try:
        server = BackgroundServer(args.env_id, host=args.host, port=args.port, max_sessions=args.max_sessions)
    except OSError as exc:
        raise TraceGymError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    with server:
        print(f"serving {args.env_id} over OpenEnv at {server.base_url} (episodes on /ws; Ctrl-C stops)", flush=True)
        try:
            server.wait()
        except KeyboardInterrupt:
            pass
    return 0


def cmd_envs_catalog(args: argparse.Namespace) -> int:
    from ..catalog import StaleCatalogError, check_catalog, write_catalog

    if args.check:
        try:
            check_catalog(args.registry)
        except StaleCatalogError as exc:
            print(f"trace-gym: {exc}", file=sys.stderr)
            return 1
        print("the registry catalogue is up to date")
        return 0
    for path in write_catalog(args.registry):
        print(f"wrote {path}")
    return 0


def cmd_envs_freeze(args: argparse.Namespace) -> int:
    from ..freeze import freeze_tools

    print("wrote " + ", ".join(str(path) for path in freeze_tools(args.env_id)))
    return 0
