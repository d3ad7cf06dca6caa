"""A target of your own, as `trace-gym targets new` writes it: a plain ``gymnasium.Env``.

The contract is one page (docs/targets.md): ``reset`` returns the task's opening
message and puts the system prompt, the OpenAI tool schemas and the task id in
``info``; ``step`` takes the agent's raw text and returns a reward in [0, 1] when
the episode ends; ``split=`` and ``task_ids`` give train and test tasks;
``oracle_actions()`` (optional) solves the current task. This one is a small
order desk (look an order up, cancel it only if it is still pending) that already
works end to end: replace the tasks, tools and reward with your own, one at a time.
"""

import json
import random

import gymnasium as gym

from trace_gym.actions import ActionKind, parse_action  # optional: the parser the agents' formats follow
from trace_gym.env import AnyText  # optional: any text, async vector envs included

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": text,
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    }
    for name, text in [("get_order", "An order's status and items."), ("cancel_order", "Cancel a pending order.")]
]
SPLITS = {"train": range(0, 12), "test": range(12, 16)}  # evaluation alone plays the test tasks


class TargetEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, split="train", max_steps=6):
        self.split, self.max_steps = split, max_steps
        self.task_ids = [str(i) for i in SPLITS[split]]
        self.observation_space = self.action_space = AnyText(10_000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        task = (options or {}).get("task_id")
        task = str(task) if task is not None else self.task_ids[int(self.np_random.integers(len(self.task_ids)))]
        if task not in self.task_ids:
            raise ValueError(f"task {task!r} is not in the {self.split} split")
        rng = random.Random(int(task))
        self.order, self.pending = "ORD-%05d" % rng.randrange(10**5), rng.random() < 0.5
        self.looked = self.cancelled = self.blundered = False
        self.steps = 0
        prompt = "You are an order desk agent. Look the order up; cancel it only if it is still pending."
        return (f"Please cancel my order {self.order}.", {"system_prompt": prompt, "tools": TOOLS, "task_id": task})

    def step(self, action):
        self.steps += 1
        parsed = parse_action(action)
        done = parsed.kind == ActionKind.MESSAGE  # a message to the user ends the episode; a malformed turn is answered
        if parsed.kind == ActionKind.MALFORMED:
            observation = f"Error: {parsed.error}"
        elif parsed.kind == ActionKind.TOOL_CALLS:
            observation = "\n".join(self._call(call.name, call.arguments) for call in parsed.tool_calls)
        else:
            observation = "Thanks, bye."
        truncated = not done and self.steps >= self.max_steps
        solved = self.looked and self.cancelled == self.pending and not self.blundered
        reward = float(solved) if done or truncated else 0.0
        return observation, reward, done, truncated, {"termination_reason": "done" if done else None}

    def _call(self, name, arguments):
        if arguments.get("order_id") != self.order or name not in ("get_order", "cancel_order"):
            return "Error: not found"
        if name == "cancel_order":
            if not (self.looked and self.pending):  # cancelling unlooked, or what cannot be cancelled, is the mistake
                self.blundered = True
                return "Error: only a pending order you have looked up can be cancelled"
            self.cancelled = True
        self.looked = True
        status = "cancelled" if self.cancelled else "pending" if self.pending else "delivered"
        return json.dumps({"order_id": self.order, "status": status})

    def oracle_actions(self):
        call = lambda name: json.dumps({"name": name, "arguments": {"order_id": self.order}})  # noqa: E731
        return [
            call("get_order"),
            *([call("cancel_order")] if self.pending else []),
            "Your order is cancelled." if self.pending else "Your order was delivered; it cannot be cancelled.",
        ]
