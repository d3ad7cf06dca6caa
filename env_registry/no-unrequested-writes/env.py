"""Transfer rationale: tau2-retail's evaluator compares the final database with the one the request implies, so a
write nobody asked for fails the task as surely as a missing one. Here the user asks for exactly one change and
mentions a second order that must stay as it is; the requested change pays fully only when no other write was made."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "cancel_pending_order",
         "modify_pending_order_address", "modify_user_address"]  # fmt: skip
ASK = dict(zip(TOOLS[3:5], ["Please cancel order %s, %s", "Please send order %s to %s"]))  # the change asked for
DECOYS = ["I also thought about cancelling order %s, but I've decided to keep it",
          "My other order %s still has the old address, and that's fine, it can go there",
          "Order %s is a gift for my sister, so please don't touch that one",
          "You may see order %s on my account too; nothing to do there"]  # fmt: skip
PROMPT = ("You are a retail customer service agent. Authenticate the user by name and zip code before any change. "
          "Pending orders can be cancelled (reason 'no longer needed' or 'ordered by mistake') or get a new shipping "
          "address; a user's default address can be changed too.")  # fmt: skip
WEIGHTS = {"read_order": 0.1, "requested_change": 0.5, "no_unrequested_writes": 0.4}
HINT = (" Hint: change exactly what the user asks for; other orders they mention are context, not requests, unless "
        "they ask for a change to them.")  # fmt: skip


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng, self.log, self.messages = random.Random(seed), [], 0
        self.user = world.retail_user(rng.randrange(2**31), payment=["credit_card"])
        self.orders = world.retail_orders(rng.randrange(2**31), self.user, ["pending"] * rng.randint(2, 4))
        order, decoy = rng.sample(self.orders, 2)
        name, reason = rng.choice(TOOLS[3:5]), rng.choice(world.CANCEL_REASONS)  # a cancellation or a new address
        a, order_id, cancel = world.retail_address(rng.randrange(2**31)), order["order_id"], name == TOOLS[3]
        self.write = (name, dict({"reason": reason} if cancel else a, order_id=order_id))  # the one change asked for
        said = world.CANCEL_SAID[reason] if cancel else world.retail_spelled(a)
        parts = [ASK[name] % (order_id, said), rng.choice(DECOYS) % decoy["order_id"]]
        rng.shuffle(parts)
        hello = world.retail_login(self.user)[1]
        message = "Hello, I'm {first_name} {last_name}, zip code {zip}. {0}. {1}.".format(*parts, **hello)
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], self.orders, action)
        self.messages += 1
        done = bool(world.called(self.log, *TOOLS[3:])) or self.messages >= 3  # a write went through
        reply = "Thanks, that's all I needed. Bye!" if done else "Yes, that's right, please go ahead."
        return {"observation": reply, "done": done}

    def reward(self):
        (name, wanted), [correct] = self.write, world.retail_made([self.user], self.orders, [self.write])
        requested = [a for a in world.called(self.log, name) if a.get("order_id") == wanted["order_id"]]
        extra = len(world.called(self.log, *TOOLS[3:])) - len(requested)  # writes that went through, unrequested
        read = wanted["order_id"] in world.read_ids(self.log)
        paid = 1.0 if correct else 0.3 if requested else 0.0  # a request tried but not made: partial credit
        parts = dict(read_order=read, no_unrequested_writes=correct and not extra, requested_change=paid)
        return world.graded(parts, WEIGHTS, "%d requested write(s), %d unrequested" % (len(requested), extra))

    def oracle(self):
        read = (TOOLS[2], {"order_id": self.write[1]["order_id"]})
        return world.script(world.retail_login(self.user), read, self.write, "Done: only that order was changed.")
