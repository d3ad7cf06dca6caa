"""A small target of your own: a plain ``gymnasium.Env`` (no trace-gym base class) that
keeps docs/targets.md's contract: text in and out; ``reset`` puts the system prompt, the
OpenAI tool schemas and the task id in ``info``; a reward in [0, 1] when the episode
ends; ``split=`` and ``task_ids``. ``oracle_actions()`` is optional (the oracle agent, the
generic analyst and validation of envs written for this target use it)."""

import json
import random

import gymnasium as gym

from trace_gym.actions import parse_action  # optional: the parser the agents' formats follow
from trace_gym.env import AnyText  # optional: any text, async vector envs included


def tool(name, text, arg):
    schema = {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}
    return {"type": "function", "function": {"name": name, "description": text, "parameters": schema}}


TOOLS = [
    tool("get_account", "The account's holder and cards.", "account_id"),
    tool("get_card", "A card's status and last four digits.", "card_id"),
    tool("freeze_card", "Freeze a card so that it cannot be used.", "card_id"),
]
SPLITS = {"train": range(0, 14), "test": range(14, 20)}
PROMPT = "You are a bank's support agent. Use the tools; freeze only the card the customer lost."


class BankSupportEnv(gym.Env):
    def __init__(self, split="train", max_steps=8):
        self.split, self.max_steps, self.task_ids = split, max_steps, [str(i) for i in SPLITS[split]]
        self.observation_space = self.action_space = AnyText(10_000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("task_id") or self.task_ids[(seed or 0) % len(self.task_ids)]
        rng = random.Random(int(self.task))
        self.account = "ACC-%05d" % rng.randrange(10**5)
        self.cards = {"card_%06d" % rng.randrange(10**6): "%04d" % rng.randrange(10**4) for _ in range(3)}
        self.lost, self.frozen, self.steps = rng.choice(sorted(self.cards)), set(), 0
        opening = (
            f"Hi, my account is {self.account}. I lost my card ending in {self.cards[self.lost]}; please freeze it."
        )
        return opening, {"system_prompt": PROMPT, "tools": TOOLS, "task_id": self.task}

    def step(self, action):
        self.steps, parsed, done = self.steps + 1, parse_action(action), False
        if parsed.kind == "tool_calls":
            call = parsed.tool_calls[0]
            observation = self.answer(call.name, str(call.arguments.get("account_id") or call.arguments.get("card_id")))
        elif parsed.kind == "malformed":  # answered, so the agent can write it again
            observation = f"Error: {parsed.error}"
        else:
            observation, done = "Thanks, bye.", True
        truncated = not done and self.steps >= self.max_steps
        reward = (0.7 * (self.lost in self.frozen) + 0.3 * (self.frozen <= {self.lost})) if done or truncated else 0.0
        return observation, reward, done, truncated, {"termination_reason": "done" if done else None}

    def answer(self, tool, value):
        if tool == "get_account" and value == self.account:
            return json.dumps({"account_id": self.account, "cards": sorted(self.cards)})
        if tool not in ("get_card", "freeze_card") or value not in self.cards:
            return "Error: not found"
        if tool == "freeze_card":
            self.frozen.add(value)
        return json.dumps({"card_id": value, "last_four": self.cards[value], "frozen": value in self.frozen})

    def oracle_actions(self):
        call = lambda name, arg, value: json.dumps({"name": name, "arguments": {arg: value}})  # noqa: E731
        looks = [call("get_card", "card_id", card) for card in sorted(self.cards)]
        account = call("get_account", "account_id", self.account)
        return [account, *looks, call("freeze_card", "card_id", self.lost), "Your card is frozen."]
