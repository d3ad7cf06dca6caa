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
        self.found, self.read, self.cancels, self.checked, self.messages, self.answered = 0, set(), [], None, 0, 0
        name = self.user["name"]
        wish = "don't need it anymore" if self.reason == "no longer needed" else "ordered it by mistake"
        message = "Hi, this is %s %s, zip %s. Please cancel my order %s, I %s." % (
            name["first_name"], name["last_name"], self.user["address"]["zip"], self.target["order_id"], wish)
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def verified(self):
        return self.user["user_id"] in self.read and self.target["order_id"] in self.read

    def step(self, action):
        if action.get("type") == "tool_call":
            name, args = action["name"], action.get("arguments") or {}
            if name == "cancel_pending_order":
                self.cancels.append(args)
                self.checked = self.verified() if self.checked is None else self.checked  # at the first write
            answer = world.retail_answer(self.users, self.orders, name, args)
            if not answer.startswith("Error") and name != "cancel_pending_order":
                self.found = self.found or name == "find_user_id_by_name_zip"
                self.read.add(str(args.get("user_id", args.get("order_id"))))
            return {"observation": answer, "done": False}
        self.messages += 1
        if "?" in str(action.get("content")) and self.messages < 3:
            return {"observation": "Yes. Please cancel it now.", "done": False}
        self.answered = True
        return {"observation": "Okay, thank you.", "done": True}

    def reward(self):
        checked = self.checked if self.cancels else self.verified()
        intact = all(o["status"] != "cancelled" for o in self.orders[:-1])
        if self.case == "cancellable":
            outcome = self.target["status"] == "cancelled" and self.target["cancel_reason"] == self.reason and intact
        else:
            outcome = not self.cancels and self.answered and checked
        parts = {"authenticated": float(self.found), "verified_before_write": float(bool(checked))}
        parts["correct_outcome"] = float(bool(outcome))
        reward = 0.2 * parts["authenticated"] + 0.3 * parts["verified_before_write"] + 0.5 * parts["correct_outcome"]
        return {"reward": round(reward, 4), "components": parts, "reason": "case %s" % self.case}

    def oracle(self):
        name, order_id = self.user["name"], self.target["order_id"]
        calls = [{"first_name": name["first_name"], "last_name": name["last_name"], "zip": self.user["address"]["zip"]},
                 {"user_id": self.user["user_id"]}, {"order_id": order_id},
                 {"order_id": order_id, "reason": self.reason}]
        say = SAY[self.case].format(id=order_id, status=self.target["status"])
        actions = [{"type": "tool_call", "name": n, "arguments": a} for n, a in zip(TOOLS, calls)]
        return actions[: 4 if self.case == "cancellable" else 3] + [{"type": "message", "content": say}]
