"""Transfer rationale: on tau2-retail a call that does not parse, or a value of the wrong JSON type (item ids as
one string, a number for a string), fails and costs a turn. Here a return needs a chain of calls with structured
arguments within a tight step budget, and the reward counts each call that arrived well formed and well typed."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "return_delivered_order_items"]
STEPS = dict(zip(TOOLS, ["user_found", "user_read", "order_read", "return_made"]))
PROMPT = ("You are a retail customer service agent. Authenticate users by name and zip code. Delivered items can be "
          "returned to the original payment method. Keep the conversation short: you have few turns.")
HINT = (" Hint: write each tool call as one JSON object with a name and an arguments object; give every argument the "
        "JSON type of its schema (lists as JSON arrays of strings), and never describe a call in prose instead.")


class Environment:
    max_steps = 7  # tight: every broken call costs a turn the return needs

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.user = world.retail_user(rng.randrange(2**31), payment=["credit_card"])
        products = rng.sample(sorted(world.retail_products()), rng.randint(3, 5))
        items = [world.retail_item(rng.randrange(2**31), product) for product in products]
        self.order = world.retail_order(rng.randrange(2**31), self.user, items)
        self.wanted = sorted(rng.sample([i["item_id"] for i in items], rng.randint(2, 3)))
        self.good, self.mistyped, self.in_prose, self.messages = set(), 0, 0, 0
        name, wanted = self.user["name"], " and the ".join(i["name"] for i in items if i["item_id"] in self.wanted)
        message = "Hi, I'm %s %s, zip %s. I want to return the %s from my order %s, refund to my card please." % (
            name["first_name"], name["last_name"], self.user["address"]["zip"], wanted, self.order["order_id"])
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            name, args = action["name"], action.get("arguments") or {}
            self.mistyped += not all(isinstance(v, list) and all(isinstance(i, str) for i in v) if k == "item_ids"
                                     else isinstance(v, str) for k, v in args.items())  # answered as the target would
            answer = world.retail_answer([self.user], [self.order], name, args)
            if not answer.startswith("Error") and sorted(args.get("item_ids", self.wanted)) == self.wanted:
                self.good.add(STEPS[name])
            return {"observation": answer, "done": False}
        content, self.messages = str(action.get("content")), self.messages + 1
        if "{" in content or '"name"' in content or "arguments" in content:
            self.in_prose += 1  # a call written as text reaches the user, who cannot run it
            return {"observation": "Sorry, I don't get that. Can you just do the return?", "done": self.messages >= 3}
        done = "return_made" in self.good or self.messages >= 2
        return {"observation": "Thanks, bye!" if done else "Yes, please return those items.", "done": done}

    def reward(self):
        parts = {step: 1.0 if step in self.good else 0.0 for step in STEPS.values()}
        parts["no_broken_calls"] = parts["return_made"] if not (self.mistyped or self.in_prose) else 0.0
        reward = 0.1 * (parts["user_found"] + parts["user_read"] + parts["order_read"]) + 0.5 * parts["return_made"]
        reason = "%d of 4 calls well formed; %d mistyped, %d as text" % (len(self.good), self.mistyped, self.in_prose)
        return {"reward": round(reward + 0.2 * parts["no_broken_calls"], 4), "components": parts, "reason": reason}

    def oracle(self):
        user, order_id, name = self.user, self.order["order_id"], self.user["name"]
        calls = [{"first_name": name["first_name"], "last_name": name["last_name"], "zip": user["address"]["zip"]},
                 {"user_id": user["user_id"]}, {"order_id": order_id},
                 {"order_id": order_id, "item_ids": self.wanted, "payment_method_id": list(user["payment_methods"])[0]}]
        done = {"type": "message", "content": "Your return is requested; the refund goes to your card."}
        return [{"type": "tool_call", "name": n, "arguments": a} for n, a in zip(TOOLS, calls)] + [done]
