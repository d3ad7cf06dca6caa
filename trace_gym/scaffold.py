"""``trace-gym envs new``: a new env folder that already passes validation;
``trace-gym targets new``: a target of the user's own that already plays.

The scaffold is a complete, small env (a lookup with one of the target's read
tools) so that a contributor starts from green and changes one thing at a
time: replace the scenario with the capability, rerun ``trace-gym validate``.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from .errors import TraceGymError
from .registry import EnvKind, get_entry
from .result_shapes import example_result, load_result_shapes
from .tools import load_frozen_tools, tool_name, tool_parameters

NAME = re.compile(r"^[a-z][a-z0-9-]{1,48}[a-z0-9]$")

ENV_TEMPLATE = '''"""Transfer rationale: {capability_description} This scaffold only
exercises calling {tool} with the exact value the user gives and reporting
what it returns; replace the scenario below with the capability, keep the
target's tool names and result formats, and rerun `trace-gym validate`."""
import json
import random

TOOLS = ["{tool}"]
STATES = {states}
# What the target's {tool} returns, every field it writes (from its frozen results.json):
# the validator's interface_fidelity check rejects results of any other shape.
RECORD = {record}


class Environment:
    max_steps = 8

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.key = "{prefix}" + str(rng.randrange(10**6, 10**7))
        self.state = rng.choice(STATES)
        self.used_tool = False
        self.looked_up = False
        self.answer = None
        prompt = "You are a support agent. Use the tools to answer the user."
        if hint:
            prompt += " Hint: look the record up with the exact value the user gives before answering."
        return {{"system_prompt": prompt, "user_message": "What is the state of {param} " + self.key + "?"}}

    def step(self, action):
        if action.get("type") == "tool_call":
            # The host lets through only calls of TOOLS with the schema's argument names;
            # the values are yours to judge.
            self.used_tool = True
            if action.get("arguments", {{}}).get("{param}") != self.key:
                return {{"observation": "Error: not found", "done": False}}
            self.looked_up = True
            return {{"observation": {observation}, "done": False}}
        self.answer = str(action.get("content", ""))
        return {{"observation": "Thank you!", "done": True}}

    def reward(self):
        said = self.answer is not None and self.state in self.answer.lower()
        components = {{
            "used_tool": 1.0 if self.used_tool else 0.0,
            "looked_up": 1.0 if self.looked_up else 0.0,
            "correct_answer": 1.0 if said else 0.0,
        }}
        reward = 0.1 * components["used_tool"] + 0.2 * components["looked_up"] + 0.7 * components["correct_answer"]
        return {{"reward": reward, "components": components, "reason": "looked up, then answered"}}

    def oracle(self):
        return [
            {{"type": "tool_call", "name": "{tool}", "arguments": {{"{param}": self.key}}}},
            {{"type": "message", "content": "It is " + self.state + "."}},
        ]
'''

MANIFEST_TEMPLATE = """id = "trace/{name}-v0"
kind = "synthesized"
target = "{target}"
description = "{description}"

[capability]
name = "{capability}"
description = "{capability_description}"

[provenance]
author = "scaffold"
"""

README_TEMPLATE = """# trace/{name}-v0

**Capability:** {capability}: {capability_description}

**Target:** `{target}` (tools: {tool})

## What it trains
Describe the scenario, how it varies across seeds, and why success here
transfers to the target.

## Reward
- `used_tool` (0.1): the agent called the tool at all.
- `looked_up` (0.2): the record was looked up with the exact value.
- `correct_answer` (0.7): the final message states the record's state.

Validate with `trace-gym validate {folder}`.
"""


def pick_tool(tools: list[dict]) -> tuple[str, str]:
    """A read tool with a required string parameter (get_/find_ first)."""
    candidates = []
    for schema in tools:
        params = tool_parameters(schema)
        required = [
            p for p in params.get("required", []) or [] if params["properties"].get(p, {}).get("type") == "string"
        ]
        if required:
            rank = 0 if tool_name(schema).startswith("get_") else 1 if tool_name(schema).startswith("find_") else 2
            candidates.append((rank, tool_name(schema), required[0]))
    if not candidates:
        raise TraceGymError("the target has no tool with a required string parameter to scaffold from")
    _, name, param = min(candidates)
    return name, param


def new_env(name: str, target: str, dest: str | Path, capability: str = "", description: str = "") -> Path:
    if not NAME.match(name):
        raise TraceGymError(f"env name '{name}' must be lower-case letters, digits and dashes (e.g. order-lookup)")
    entry = get_entry(target)
    if entry.kind != EnvKind.TARGET:
        raise TraceGymError(
            f"{target} is not a target; synthesized envs train for a target such as trace/tau2-retail-v0"
        )
    folder = Path(dest) / name
    if folder.exists():
        raise TraceGymError(f"{folder} already exists; pick another name or remove it")
    tool, param = pick_tool(load_frozen_tools(entry.tools_path))
    record, observation, states = _result_code(entry.path, tool, param)
    values = {
        "name": name,
        "target": entry.id,
        "tool": tool,
        "param": param,
        "prefix": "".join(w[0] for w in param.split("_")).upper() + "-",
        "capability": _toml_text(capability or name.replace("-", " ")),
        "capability_description": _toml_text(description or "Describe the capability in one sentence."),
        "description": _toml_text(f"Trains {capability or name} for {entry.id}."),
        "folder": str(folder),
        "record": record,
        "states": states,
        "observation": observation,
    }
    folder.mkdir(parents=True)
    (folder / "env.py").write_text(ENV_TEMPLATE.format(**values), encoding="utf-8")
    (folder / "manifest.toml").write_text(MANIFEST_TEMPLATE.format(**values), encoding="utf-8")
    (folder / "README.md").write_text(README_TEMPLATE.format(**values), encoding="utf-8")
    return folder


DEFAULT_STATES = ["active", "pending", "closed", "on hold", "archived"]


def _result_code(target_folder: Path, tool: str, param: str) -> tuple[str, str, str]:
    """The scaffold's RECORD literal, the expression of its tool result and its
    STATES: the target's frozen result shape with the looked-up key and the state
    filled in. The state goes to a field with a fixed set of values (which then
    are the STATES), else to the first plain string field; a text result is the state."""
    shapes = load_result_shapes(target_folder)
    if shapes is None or shapes["tools"].get(tool, {}).get("format") == "text":
        return "None", "self.state", repr(DEFAULT_STATES)
    record = example_result(shapes, tool)
    properties = shapes["tools"][tool]["schema"].get("properties") or {}
    strings = [
        (name, sub)
        for name, sub in properties.items()
        if sub.get("type") == "string" and name != param and "const" not in sub
    ]
    if not isinstance(record, dict) or not strings:
        return repr(record), "json.dumps(RECORD)", repr(DEFAULT_STATES)
    name, sub = next(((n, s) for n, s in strings if s.get("enum")), strings[0])
    states = list(sub["enum"]) if sub.get("enum") else DEFAULT_STATES
    fills = {param: "self.key"} if param in record else {}
    fills[name] = "self.state"
    return (
        repr(record),
        "json.dumps(dict(RECORD, " + ", ".join(f"{k}={v}" for k, v in fills.items()) + "))",
        repr(states),
    )


def _toml_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


TARGET_TEMPLATE = Path(__file__).with_name("templates") / "target.py"
TARGET_MANIFEST = """# A target of your own (docs/targets.md): put this folder's parent on TRACE_GYM_REGISTRY_PATH.
id = "{env_id}"
kind = "target"
entry_point = "{module}:{cls}"   # the module beside this manifest
description = "{description}"
agent = "an order desk's support agent"   # what your agent is, in words the analyst's and router's prompts use
"""


def new_target(name: str, dest: str | Path, description: str = "") -> Path:
    """``dest/name/``: a manifest and a plain ``gymnasium.Env`` module (the template's
    order desk, its class renamed) that rollout, the oracle and training play as they are."""
    if not NAME.match(name):
        raise TraceGymError(
            f"target name {name!r}: use 3-50 lowercase letters, digits and dashes, starting with a letter"
        )
    if re.search(r"-v\d+$", name):
        raise TraceGymError(
            f"target name {name!r}: leave out the version; its id is trace/{name[: name.rindex('-v')]}-v0"
        )
    if Path(dest).exists() and not Path(dest).is_dir():
        raise TraceGymError(f"--dir {dest}: not a folder")
    env_id = f"trace/{name}-v0"
    try:
        get_entry(env_id)
    except TraceGymError:
        pass
    else:
        raise TraceGymError(f"{env_id} is already registered; choose another NAME")
    module = name.replace("-", "_")
    if importlib.util.find_spec(module) is not None:
        raise TraceGymError(
            f"the module name {module!r} is taken by an installed module, which would shadow it; choose another NAME"
        )
    folder = Path(dest) / name
    if folder.exists():
        raise TraceGymError(f"{folder} already exists; choose another NAME or --dir")
    cls = "".join(part.capitalize() for part in name.split("-")) + "Env"
    folder.mkdir(parents=True)
    (folder / f"{module}.py").write_text(
        TARGET_TEMPLATE.read_text(encoding="utf-8").replace("TargetEnv", cls), encoding="utf-8"
    )
    (folder / "manifest.toml").write_text(
        TARGET_MANIFEST.format(
            env_id=env_id,
            module=module,
            cls=cls,
            description=_toml_text(description or f"{name}: a target of my own, from trace-gym's order-desk scaffold"),
        ),
        encoding="utf-8",
    )
    return folder
