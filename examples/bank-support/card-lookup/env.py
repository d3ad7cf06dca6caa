"""Transfer rationale: the bank's cards have ids that differ in a digit or two, and the customer names the lost
one only by its last four digits; an agent that freezes a look-alike, or retypes an id instead of copying it from
get_account's answer, freezes the wrong card. Here every account holds several look-alike cards, and the reward
pays for reading the account, reading the lost card and freezing exactly it, with the target's tools and answers."""

import json
import random

TOOLS = ["get_account", "get_card", "freeze_card"]
PROMPT = "You are a bank's support agent. Use the tools; freeze only the card the customer lost."
HINT = " Hint: list the account's cards, read each until its last four digits match, then freeze that card id as given."


class Environment:
    max_steps = 10

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.account = "ACC-%05d" % rng.randrange(10**5)
        stem = "%06d" % rng.randrange(10**6)
        ids = {stem[:4] + "%02d" % rng.randrange(100) for _ in range(rng.randint(4, 6))}  # look-alikes
        self.cards = {"card_" + i: "%04d" % rng.randrange(10**4) for i in sorted(ids)}
        self.lost = rng.choice(sorted(self.cards))
        self.frozen, self.read, self.account_read = set(), set(), False
        return {"system_prompt": PROMPT + (HINT if hint else ""),
                "user_message": "Hi, account %s here. I lost my card ending in %s, please freeze it right away."
                % (self.account, self.cards[self.lost])}

    def step(self, action):
        if action.get("type") != "tool_call":
            return {"observation": "Thanks, bye.", "done": True}
        name, value = action["name"], str(next(iter((action.get("arguments") or {}).values()), ""))
        if name == "get_account" and value == self.account:
            self.account_read = True
            return {"observation": json.dumps({"account_id": self.account, "cards": sorted(self.cards)}), "done": False}
        if value not in self.cards:
            return {"observation": "Error: not found", "done": False}
        (self.frozen if name == "freeze_card" else self.read).add(value)
        card = {"card_id": value, "last_four": self.cards[value], "frozen": value in self.frozen}
        return {"observation": json.dumps(card), "done": False}

    def reward(self):
        parts = {"account_read": float(self.account_read), "lost_card_read": float(self.lost in self.read),
                 "lost_card_frozen": float(self.lost in self.frozen),
                 "only_it_frozen": float(self.frozen == {self.lost})}
        weights = {"account_read": 0.15, "lost_card_read": 0.25, "lost_card_frozen": 0.45, "only_it_frozen": 0.15}
        wrong = len(self.frozen - {self.lost})
        return {"reward": round(sum(weights[k] * v for k, v in parts.items()), 4), "components": parts,
                "reason": "lost card %sfrozen, %d other card(s) frozen" % ("" if parts["lost_card_frozen"] else "not ", wrong)}

    def oracle(self):
        reads = [{"type": "tool_call", "name": "get_card", "arguments": {"card_id": c}} for c in sorted(self.cards)]
        return ([{"type": "tool_call", "name": "get_account", "arguments": {"account_id": self.account}}] + reads
                + [{"type": "tool_call", "name": "freeze_card", "arguments": {"card_id": self.lost}},
                   {"type": "message", "content": "Your card ending in %s is frozen." % self.cards[self.lost]}])
