"""A small target of your own: a plain ``gymnasium.Env`` (no trace-gym base class).

The contract (docs/targets.md): text observations and actions; ``reset`` puts the
system prompt, the OpenAI tool schemas and the task id in ``info``; a reward in
[0, 1] when the episode ends; ``split=`` and ``task_ids`` for train/test tasks.
``oracle_actions()`` is optional (reference solutions: the oracle agent, the
generic analyst, validation of envs written for this target use it).
"""

import json
import random
import string

import gymnasium as gym

from trace_gym.actions import parse_action  # optional: the same parser the agents' formats follow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": text,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }
    for name, text, arg in [
        ("get_account", "The account's holder and cards.", "account_id"),
        ("get_card", "A card's status and last four digits.", "card_id"),
        ("freeze_card", "Freeze a card so that it cannot be used.", "card_id"),
    ]
]
SPLITS = {"train": range(0, 14), "test": range(14, 20)}


class BankSupportEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, split="train", max_steps=8):
        self.split, self.max_steps = split, max_steps
        self.task_ids = [str(i) for i in SPLITS[split]]
        self.observation_space = self.action_space = gym.spaces.Text(10_000, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        task = (options or {}).get("task_id") or self.task_ids[(seed or 0) % len(self.task_ids)]
        rng = random.Random(int(task))
        self.account = "ACC-%05d" % rng.randrange(10**5)
        self.cards = {"card_%06d" % rng.randrange(10**6): "%04d" % rng.randrange(10**4) for _ in range(3)}
        self.lost = rng.choice(sorted(self.cards))
        self.frozen, self.steps, self.task = set(), 0, task
        prompt = "You are a bank's support agent. Use the tools; freeze only the card the customer lost."
        return (
            f"Hi, my account is {self.account}. I lost my card ending in {self.cards[self.lost]}; please freeze it.",
            {"system_prompt": prompt, "tools": TOOLS, "task_id": task},
        )

    def step(self, action):
        self.steps += 1
        parsed = parse_action(action)
        if parsed.kind == "tool_calls":
            call = parsed.tool_calls[0]
            value = str(call.arguments.get("account_id") or call.arguments.get("card_id") or "")
            if call.name == "get_account" and value == self.account:
                observation = json.dumps({"account_id": self.account, "cards": sorted(self.cards)})
            elif call.name in ("get_card", "freeze_card") and value in self.cards:
                if call.name == "freeze_card":
                    self.frozen.add(value)
                observation = json.dumps(
                    {"card_id": value, "last_four": self.cards[value], "frozen": value in self.frozen}
                )
            else:
                observation = "Error: not found"
            done = False
        elif parsed.kind == "malformed":  # answered, so the agent can write it again
            observation, done = f"Error: {parsed.error}", False
        else:
            observation, done = "Thanks, bye.", True
        truncated = not done and self.steps >= self.max_steps
        reward = (0.7 * (self.lost in self.frozen) + 0.3 * (self.frozen <= {self.lost})) if done or truncated else 0.0
        return observation, reward, done, truncated, {"termination_reason": "done" if done else None}

    def oracle_actions(self):
        call = lambda name, **args: json.dumps({"name": name, "arguments": args})  # noqa: E731
        return [
            call("get_account", account_id=self.account),
            *[call("get_card", card_id=c) for c in sorted(self.cards)],
            call("freeze_card", card_id=self.lost),
            "Your card is frozen.",
        ]
