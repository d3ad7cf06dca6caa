"""Transfer rationale: a customer who lost a wallet asks for several cards at once, and the bank's target pays only
when every lost card is frozen; an agent that freezes the first and says goodbye leaves the others open. Here the
customer names two or three lost cards by their last four digits, and the reward counts each one frozen, so
finishing the whole list pays and stopping early does not."""

import json
import random

TOOLS = ["get_account", "get_card", "freeze_card"]
PROMPT = "You are a bank's support agent. Use the tools; freeze only the cards the customer lost."
HINT = " Hint: the customer lost several cards; freeze every one of them before you reply."


class Environment:
    max_steps = 12

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.account = "ACC-%05d" % rng.randrange(10**5)
        ids = rng.sample(range(10**6), rng.randint(4, 5))
        self.cards = {"card_%06d" % i: "%04d" % rng.randrange(10**4) for i in ids}
        self.lost = sorted(rng.sample(sorted(self.cards), rng.randint(2, 3)))
        self.frozen, self.account_read = set(), False
        endings = " and ".join(self.cards[c] for c in self.lost)
        return {"system_prompt": PROMPT + (HINT if hint else ""),
                "user_message": "Hi, account %s. I lost my wallet: please freeze my cards ending in %s."
                % (self.account, endings)}

    def step(self, action):
        if action.get("type") != "tool_call":
            return {"observation": "Thanks, bye.", "done": True}
        name, value = action["name"], str(next(iter((action.get("arguments") or {}).values()), ""))
        if name == "get_account" and value == self.account:
            self.account_read = True
            return {"observation": json.dumps({"account_id": self.account, "cards": sorted(self.cards)}), "done": False}
        if value not in self.cards:
            return {"observation": "Error: not found", "done": False}
        if name == "freeze_card":
            self.frozen.add(value)
        card = {"card_id": value, "last_four": self.cards[value], "frozen": value in self.frozen}
        return {"observation": json.dumps(card), "done": False}

    def reward(self):
        done = len(self.frozen & set(self.lost))
        parts = {"account_read": float(self.account_read), "lost_cards_frozen": done / len(self.lost),
                 "all_and_only_those": float(self.frozen == set(self.lost))}
        wrong = len(self.frozen) - done  # freezing every card is not finishing the list
        reward = 0.1 * parts["account_read"] + 0.75 * parts["lost_cards_frozen"] + 0.15 * parts["all_and_only_those"]
        return {"reward": round(max(reward - 0.25 * wrong, 0.0), 4), "components": parts,
                "reason": "%d of %d lost cards frozen, %d other(s)" % (done, len(self.lost), wrong)}

    def oracle(self):
        reads = [{"type": "tool_call", "name": "get_card", "arguments": {"card_id": c}} for c in sorted(self.cards)]
        freezes = [{"type": "tool_call", "name": "freeze_card", "arguments": {"card_id": c}} for c in self.lost]
        return ([{"type": "tool_call", "name": "get_account", "arguments": {"account_id": self.account}}] + reads
                + freezes + [{"type": "message", "content": "All %d cards are frozen." % len(self.lost)}])
