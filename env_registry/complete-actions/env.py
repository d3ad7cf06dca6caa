"""Transfer rationale: tau2-retail requests often bundle several changes (cancel one order, move another's shipping
address, pay a third with a gift card), and its evaluator compares the final database, so an agent that handles the
first request and closes the call fails the task although every call it made was right. Here one message asks for
several independent changes and the reward counts each that reached the database: keep a list, finish all of it."""

import json
import random
import world

TOOLS = ["find_user_id_by_email", "get_user_details", "get_order_details", "cancel_pending_order",
         "modify_pending_order_address", "modify_pending_order_payment"]
LEVELS = 3  # changes asked for: 0: one (and the steps to it pay); 1: two; 2 (default): two to four
PROMPT = ("You are a retail customer service agent. Authenticate the user by email before any change. Pending orders "
          "can be cancelled (reason 'no longer needed' or 'ordered by mistake'), get a new shipping address, or be "
          "paid with another of the user's payment methods.")
HINT = (" Hint: the user asks for several changes at once; list every one of them, carry each out with its own tool "
        "call, and only then tell the user that everything is done.")
ASK = {"cancel": "please cancel order %s, %s", "address": "order %s should ship to %s instead",
       "payment": "I'd like to pay for order %s with my gift card instead of my credit card%s"}
WRITE = dict(zip(ASK, TOOLS[3:]))
WEIGHTS = {"requests_completed": 0.85, "requests_attempted_wrongly": 0.25, "found_user": 0.1, "order_read": 0.1,
           "closed_after_all": 0.15}


class Environment:
    max_steps = 20

    def reset(self, seed, hint=False, level=2):
        rng = random.Random(seed)
        self.user = world.retail_user(rng.randrange(2**31), payment=["credit_card", "gift_card"])
        card, gift = sorted(self.user["payment_methods"])
        self.user["payment_methods"][gift]["balance"] = 1000.0  # pays for any order
        kinds = rng.sample(["cancel", "address", "payment", "cancel"], [1, 2, rng.randint(2, 4)][level])
        self.orders = [world.retail_order(rng.randrange(2**31), self.user, [world.retail_item(rng.randrange(2**31))],
                                          "pending", card) for _ in range(len(kinds) + rng.randint(0, 2))]
        self.before, self.wanted, asks, self.log, self.messages = json.dumps(self.orders), [], [], [], 0
        self.level, self.closed = level, False
        for order, kind in zip(self.orders, kinds):
            a, reason = world.retail_address(rng.randrange(2**31)), rng.choice(sorted(world.CANCEL_SAID))
            self.wanted.append((order, kind, {"cancel": reason, "address": a, "payment": gift}[kind]))
            said = {"cancel": world.CANCEL_SAID[reason], "address": world.retail_spelled(a), "payment": ""}[kind]
            asks.append(ASK[kind] % (order["order_id"], said))
        message = "Hi, my email is %s. I have a few things today: %s. Thanks!" % (self.user["email"], "; also, ".join(asks))
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def _made(self):
        return [v == {"cancel": o["cancel_reason"], "address": o["address"],
                      "payment": (o["payment_history"] + [{}])[1].get("payment_method_id")}[k] for o, k, v in self.wanted]

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], self.orders, action)
        made, self.messages = sum(self._made()), self.messages + 1
        self.closed = made == len(self.wanted)
        done = self.closed or made > 0 or self.messages >= 3
        bye = "Great, that's everything. Bye!" if self.closed else "Okay, thanks. Bye!"
        return {"observation": bye if done else "Yes, I confirm all of that. Please go ahead.", "done": done}

    def reward(self):
        made, n = self._made(), len(self.wanted)
        changed = [json.dumps(o) != json.dumps(b) for o, b in zip(self.orders, json.loads(self.before))]
        parts = {"requests_completed": sum(made) / n, "closed_after_all": self.closed,
                 "requests_attempted_wrongly": sum(c and not m for m, c in zip(made, changed)) / n}
        if self.level == 0:  # the easiest level also pays for the steps towards the change
            read = [a["order_id"] for a in world.called(self.log, "get_order_details")]
            found = world.called(self.log, "find_user_id_by_email")
            parts.update(found_user=bool(found), order_read=self.orders[0]["order_id"] in read)
        return world.graded(parts, WEIGHTS, "%d of %d requested changes made" % (sum(made), n))

    def oracle(self):
        writes = [(WRITE[k], dict({"cancel": {"reason": v}, "address": v, "payment": {"payment_method_id": v}}[k],
                                  order_id=o["order_id"])) for o, k, v in self.wanted]
        done = "All %d changes are done. Is there anything else?" % len(self.wanted)
        return world.script(world.retail_login(self.user, "email"), *writes, done)
