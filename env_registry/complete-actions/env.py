"""Transfer rationale: tau2-retail requests often bundle several changes and its evaluator compares the final
database, so an agent that closes the call after the first change fails. The reward counts each change made."""

import random
import world

TOOLS = ["find_user_id_by_email", "get_user_details", "get_order_details", "cancel_pending_order",
         "modify_pending_order_address", "modify_pending_order_payment"]  # fmt: skip
LEVELS = 3  # changes asked for: 0: one (and the steps to it pay); 1: two; 2 (default): two to four
PROMPT = ("You are a retail customer service agent. Authenticate the user by email before any change. Pending orders "
          "can be cancelled (reason 'no longer needed' or 'ordered by mistake'), get a new shipping address, or be "
          "paid with another of the user's payment methods.")  # fmt: skip
HINT = (" Hint: the user asks for several changes at once; list every one of them, carry each out with its own tool "
        "call, and only then tell the user that everything is done.")  # fmt: skip
ASK = dict(zip(TOOLS[3:], ["please cancel order %s, %s", "order %s should ship to %s instead",
                           "I'd like to pay for order %s with my gift card instead of my credit card%s"]))  # fmt: skip
WEIGHTS = {"requests_completed": 0.85, "requests_attempted_wrongly": 0.25, "closed_after_all": 0.15}
STEPS = {"found_user": 0.1, "order_read": 0.1}  # paid at level 0 only: the steps towards its one change


class Environment:
    max_steps = 20

    def reset(self, seed, hint=False, level=2):
        rng, self.level, self.closed, self.log, self.messages = random.Random(seed), level, False, [], 0
        self.user = world.retail_user(rng.randrange(2**31), payment=["credit_card", "gift_card"])
        gift = sorted(self.user["payment_methods"])[1]  # the orders are paid with the first, the credit card
        self.user["payment_methods"][gift]["balance"] = 1000.0  # pays for any order
        kinds = rng.sample(TOOLS[3:] + TOOLS[3:4], [1, 2, rng.randint(2, 4)][level])  # cancel twice as likely
        statuses = ["pending"] * (len(kinds) + rng.randint(0, 2))  # up to two orders nobody asks about
        self.orders, self.writes, asks = world.retail_orders(rng.randrange(2**31), self.user, statuses), [], []
        for order, name in zip(self.orders, kinds):  # each request as the write that makes it
            a, reason = world.retail_address(rng.randrange(2**31)), rng.choice(world.CANCEL_REASONS)
            said = {TOOLS[3]: world.CANCEL_SAID[reason], TOOLS[4]: world.retail_spelled(a), TOOLS[5]: ""}[name]
            args = {TOOLS[3]: {"reason": reason}, TOOLS[4]: a, TOOLS[5]: {"payment_method_id": gift}}[name]
            self.writes.append((name, dict(args, order_id=order["order_id"])))
            asks.append(ASK[name] % (order["order_id"], said))
        message = "Hi, my email is %s. I have a few things: %s. Thanks!" % (self.user["email"], "; also, ".join(asks))
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], self.orders, action)
        made, self.messages = world.retail_made([self.user], self.orders, self.writes), self.messages + 1
        self.closed, done = all(made), any(made) or self.messages >= 3
        bye = "Great, that's everything. Bye!" if self.closed else "Okay, thanks. Bye!"
        return {"observation": bye if done else "Yes, I confirm all of that. Please go ahead.", "done": done}

    def reward(self):
        made = world.retail_made([self.user], self.orders, self.writes)  # per request, whether the database holds it
        written = {a.get("order_id") for a in world.called(self.log, *TOOLS[3:])}
        wrong = [args["order_id"] in written and not m for (_, args), m in zip(self.writes, made)]  # went through
        n, read = len(made), self.writes[0][1]["order_id"] in world.read_ids(self.log)
        parts = dict(requests_completed=sum(made) / n, requests_attempted_wrongly=sum(wrong) / n)
        parts.update(closed_after_all=self.closed, found_user=world.logged_in(self.log), order_read=read)
        weights = dict(WEIGHTS, **STEPS) if self.level == 0 else WEIGHTS
        return world.graded(parts, weights, "%d of %d requested changes made" % (sum(made), len(made)))

    def oracle(self):
        return world.script(world.retail_login(self.user, "email"), *self.writes, "Everything you asked for is done.")
