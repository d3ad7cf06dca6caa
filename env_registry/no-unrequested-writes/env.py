"""Transfer rationale: tau2-retail's evaluator compares the final database with the one the request implies, so a
write nobody asked for (cancelling an order the user only mentioned, moving every order to a new address when one
was asked for) fails the task as surely as a missing one. Here the user asks for exactly one change and mentions a
second order that must stay as it is; the reward pays for the requested change only when no other write was made."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "cancel_pending_order",
         "modify_pending_order_address", "modify_user_address"]
DECOYS = ["I also thought about cancelling order %s, but I've decided to keep it",
          "my other order %s still has the old address, and that's fine, it can go there",
          "order %s is a gift for my sister, so please don't touch that one",
          "you may see order %s on my account too; nothing to do there"]
PROMPT = ("You are a retail customer service agent. Authenticate the user by name and zip code before any change. "
          "Pending orders can be cancelled (reason 'no longer needed' or 'ordered by mistake') or get a new shipping "
          "address; a user's default address can be changed too.")
WEIGHTS = {"read_order": 0.1, "requested_change": 0.5, "no_unrequested_writes": 0.4}
HINT = (" Hint: change exactly what the user asks for; other orders they mention are context, not requests, unless "
        "they ask for a change to them.")


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.user = world.retail_user(rng.randrange(2**31), payment=["credit_card"])
        self.orders = [world.retail_order(rng.randrange(2**31), self.user, [world.retail_item(rng.randrange(2**31))],
                                          status="pending") for _ in range(rng.randint(2, 4))]
        self.order, decoy = rng.sample(self.orders, 2)
        self.kind, self.reason = rng.choice(["cancel", "address"]), rng.choice(sorted(world.CANCEL_SAID))
        self.new_address = world.retail_address(rng.randrange(2**31))
        self.log, self.messages, order_id = [], 0, self.order["order_id"]
        ask = ("please cancel order %s, %s" % (order_id, world.CANCEL_SAID[self.reason]) if self.kind == "cancel" else
               "please send order %s to %s" % (order_id, world.retail_spelled(self.new_address)))
        parts = [ask, rng.choice(DECOYS) % decoy["order_id"]]
        rng.shuffle(parts)
        message = "Hello, I'm {first_name} {last_name}, zip code {zip}. {0}. {1}.".format(
            *[p[0].upper() + p[1:] for p in parts], **world.retail_login(self.user)[1])
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], self.orders, action)
        self.messages += 1
        done = bool(self.writes()) or self.messages >= 3
        reply = "Thanks, that's all I needed. Bye!" if done else "Yes, that's right, please go ahead."
        return {"observation": reply, "done": done}

    def writes(self):  # every call that went through but a read's (TOOLS[:3] are the reads)
        return [e for e in self.log if e["ok"] and e["name"] not in TOOLS[:3]]

    def reward(self):
        tool, order_id = TOOLS[3 if self.kind == "cancel" else 4], self.order["order_id"]
        wanted = self.reason if self.kind == "cancel" else self.new_address
        requested = [a for a in world.called(self.log, tool) if a.get("order_id") == order_id]
        extra = len(self.writes()) - len(requested)  # the requested writes are among writes()
        correct = any(a.get("reason", {f: a.get(f) for f in world.ADDRESS_FIELDS}) == wanted for a in requested)
        read_order = order_id in [a["order_id"] for a in world.called(self.log, "get_order_details")]
        parts = {"read_order": read_order, "no_unrequested_writes": correct and not extra,
                 "requested_change": 1.0 if correct else 0.3 if requested else 0.0}
        return world.graded(parts, WEIGHTS, "%d requested write(s), %d unrequested" % (len(requested), extra))

    def oracle(self):
        order_id = self.order["order_id"]
        write = ((TOOLS[3], {"order_id": order_id, "reason": self.reason}) if self.kind == "cancel" else
                 (TOOLS[4], dict(self.new_address, order_id=order_id)))
        calls = [world.retail_login(self.user), (TOOLS[2], {"order_id": order_id}), write]
        return world.script(*calls, "Done: only the order you asked about was changed.")
