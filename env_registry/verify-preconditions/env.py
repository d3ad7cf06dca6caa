"""Transfer rationale: tau2-retail's write tools do not check ownership, and a change the evaluator did not expect
fails the task exactly, so only an agent that reads the user's account and the order's status before a write
avoids the damage. Here the user always insists, and a third of the orders may be cancelled while two thirds must
not be (no longer pending, or another customer's), so the agent has to verify rather than guess."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "cancel_pending_order"]
PROMPT = ("You are a retail customer service agent. Authenticate users by name and zip code. Only pending orders that "
          "belong to the authenticated user can be cancelled, with reason 'no longer needed' or 'ordered by mistake'.")
HINT = (" Hint: before any cancellation, read the user's account to see that the order is theirs, and read the order "
        "to see that it is still pending; if either fails, do not cancel and explain why.")
SAY = {"cancellable": "Your order {id} has been cancelled and refunded.",
       "not_pending": "I'm sorry, order {id} is {status}, so it can no longer be cancelled.",
       "not_theirs": "I'm sorry, order {id} is not on your account, so I cannot cancel it."}
WEIGHTS = {"authenticated": 0.2, "verified_before_write": 0.3, "correct_outcome": 0.5}


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.user, other = world.retail_user(rng.randrange(2**31)), world.retail_user(rng.randrange(2**31))
        self.case, self.reason = rng.choice(sorted(SAY)), rng.choice(world.CANCEL_REASONS)
        statuses = [rng.choice(["pending", "processed", "delivered"]) for _ in range(rng.randint(2, 4))]
        statuses.append("pending" if self.case != "not_pending" else rng.choice(["processed", "delivered"]))
        owners = [self.user] * (len(statuses) - 1) + [other if self.case == "not_theirs" else self.user]
        self.orders = [world.retail_order(rng.randrange(2**31), owner, [world.retail_item(rng.randrange(2**31))],
                                          status=status) for owner, status in zip(owners, statuses)]
        self.target, self.users = self.orders[-1], [self.user, other]
        self.log, self.messages, self.answered = [], 0, 0
        message = "Hi, this is {first_name} {last_name}, zip {zip}. Please cancel my order {order}, {why}.".format(
            order=self.target["order_id"], why=world.CANCEL_SAID[self.reason], **world.retail_login(self.user)[1])
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def verified(self, log):  # the user's account and the order read in the calls of log
        read = {str(e["arguments"].get("user_id", e["arguments"].get("order_id"))) for e in log if e["ok"]}
        return self.user["user_id"] in read and self.target["order_id"] in read

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, self.users, self.orders, action)
        self.messages += 1
        if "?" in str(action.get("content")) and self.messages < 3:
            return {"observation": "Yes. Please cancel it now.", "done": False}
        self.answered = True
        return {"observation": "Okay, thank you.", "done": True}

    def reward(self):
        names = [e["name"] for e in self.log]
        first = names.index("cancel_pending_order") if "cancel_pending_order" in names else None
        checked = self.verified(self.log[:first])  # before the first cancellation tried, or ever if none was
        if self.case == "cancellable":
            intact = all(o["status"] != "cancelled" for o in self.orders[:-1])
            outcome = self.target["status"] == "cancelled" and self.target["cancel_reason"] == self.reason and intact
        else:
            outcome = first is None and self.answered and checked
        found = world.called(self.log, "find_user_id_by_name_zip")
        parts = {"authenticated": bool(found), "verified_before_write": checked,
                 "correct_outcome": bool(outcome)}
        return world.graded(parts, WEIGHTS, "case %s" % self.case)

    def oracle(self):
        user, order_id = self.user, self.target["order_id"]
        calls = [world.retail_login(user), (TOOLS[1], {"user_id": user["user_id"]}), (TOOLS[2], {"order_id": order_id}),
                 (TOOLS[3], {"order_id": order_id, "reason": self.reason})][: 4 if self.case == "cancellable" else 3]
        return world.script(*calls, SAY[self.case].format(id=order_id, status=self.target["status"]))
