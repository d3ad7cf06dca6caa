"""Transfer rationale: on tau2-retail a call that does not parse, or a value of the wrong JSON type (item ids as one
string), fails and costs a turn. Here a return takes a chain of structured calls in few steps; well-typed ones pay."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "return_delivered_order_items"]
STEPS = dict(zip(TOOLS, ["user_found", "user_read", "order_read", "return_made"]))
WEIGHTS = {"user_found": 0.1, "user_read": 0.1, "order_read": 0.1, "return_made": 0.5, "no_broken_calls": 0.2}
PROMPT = ("You are a retail customer service agent. Authenticate users by name and zip code. Delivered items can be "
          "returned to the original payment method. Keep the conversation short: you have few turns.")  # fmt: skip
HINT = (" Hint: write each tool call as one JSON object with a name and an arguments object; give every argument the "
        "JSON type of its schema (lists as JSON arrays of strings), and never describe a call in prose "
        "instead.")  # fmt: skip
ASK = ("Hi, I'm {first_name} {last_name}, zip {zip}. I want to return the {wanted} from my order {order}, refund to "
       "my card please.")  # fmt: skip


class Environment:
    max_steps = 7  # tight: every broken call costs a turn the return needs

    def reset(self, seed, hint=False):
        rng, names = random.Random(seed), sorted(world.retail_products())
        self.user = world.retail_user(rng.randrange(2**31), payment=["credit_card"])
        items = [world.retail_item(rng.randrange(2**31), p) for p in rng.sample(names, rng.randint(3, 5))]
        self.order = world.retail_order(rng.randrange(2**31), self.user, items)
        self.wanted = sorted(rng.sample([i["item_id"] for i in items], rng.randint(2, 3)))
        self.log, self.in_prose, self.messages = [], 0, 0
        wanted = " and the ".join(i["name"] for i in items if i["item_id"] in self.wanted)
        message = ASK.format(wanted=wanted, order=self.order["order_id"], **world.retail_login(self.user)[1])
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":  # answered as the target would, mistyped or not
            return world.retail_step(self.log, [self.user], [self.order], action)
        content, self.messages = str(action.get("content")), self.messages + 1
        if "{" in content or '"name"' in content or "arguments" in content:
            self.in_prose += 1  # a call written as text reaches the user, who cannot run it
            return {"observation": "Sorry, I don't get that. Can you just do the return?", "done": self.messages >= 3}
        done = "return_made" in self.good() or self.messages >= 2
        return {"observation": "Thanks, bye!" if done else "Yes, please return those items.", "done": done}

    def good(self):  # the steps reached by a call that went through (naming the wanted items, if it names items)
        went = [e for e in self.log if e["ok"] and e["name"] in STEPS]
        return {STEPS[e["name"]] for e in went if sorted(e["arguments"].get("item_ids", self.wanted)) == self.wanted}

    def reward(self):
        mistyped = sum(not world.retail_typed(a) for a in world.called(self.log, ok=None))  # as the schemas type them
        parts = {step: step in self.good() for step in STEPS.values()}
        refused = len(world.called(self.log, ok=False))  # an id that names no record (the host refuses wrong names)
        parts["no_broken_calls"] = parts["return_made"] and not (mistyped or self.in_prose or refused)
        counts = (len(self.good()), mistyped, refused, self.in_prose)
        return world.graded(parts, WEIGHTS, "%d of 4 calls well formed; %d mistyped, %d refused, %d as text" % counts)

    def oracle(self):
        user, order_id, card = self.user, self.order["order_id"], list(self.user["payment_methods"])[0]
        reads = [world.retail_login(user), (TOOLS[1], {"user_id": user["user_id"]}), (TOOLS[2], {"order_id": order_id})]
        write = (TOOLS[3], {"order_id": order_id, "item_ids": self.wanted, "payment_method_id": card})
        return world.script(*reads, write, "Your return is requested; the refund goes to your card.")
