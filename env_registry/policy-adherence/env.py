"""Transfer rationale: the tau2-retail policy requires the agent to state a consequential change and obtain the
user's explicit yes before calling a write tool, and to refuse changes the policy forbids (only pending orders can
be modified). Here a user asks to change an order's shipping address; the order may or may not still be pending,
and the user only says yes to a request that spells out the new address, so the agent must follow the same
confirm-or-refuse protocol the target grades."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_order_details", "modify_pending_order_address"]
CONFIRM_WORDS = ("confirm", "proceed", "go ahead", "shall i", "should i", "is that correct", "yes")
PROMPT = ("You are a retail customer service agent. Authenticate users by name and zip code. Before any action that "
          "changes an order, list the exact change and get the user's explicit confirmation (yes). Only pending orders "
          "can be modified.")
WEIGHTS = {"authenticated": 0.1, "read_order": 0.1, "followed_protocol": 0.4, "correct_outcome": 0.4}
HINT = (" Hint: read the order first; if it is pending, repeat the full new address and ask the user to confirm, and "
        "call the write only after they say yes; otherwise explain that it can no longer be changed.")


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.status = rng.choice(["pending", "pending", "processed", "delivered"])
        self.user = world.retail_user(rng.randrange(2**31), payment=["paypal"])
        self.order = world.retail_order(rng.randrange(2**31), self.user, [world.retail_item(rng.randrange(2**31))],
                                        status=self.status)
        self.new_address = world.retail_address(rng.randrange(2**31))
        self.log, self.confirmed_at, self.messages, self.ended = [], None, 0, False  # confirmed_at: len(log) by then
        message = "Hi, I'm {first_name} {last_name} (zip {zip}). I moved: please ship order {0} to {1}.".format(
            self.order["order_id"], world.retail_spelled(self.new_address), **world.retail_login(self.user)[1])
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], [self.order], action)
        self.messages += 1
        text = str(action.get("content", "")).lower()
        asks = "?" in text or any(word in text for word in CONFIRM_WORDS)
        if asks and self.messages < 4:
            spells = self.new_address["address1"].lower() in text and self.new_address["zip"] in text
            self.confirmed_at = len(self.log) if spells and self.confirmed_at is None else self.confirmed_at
            reply = "Yes, I confirm." if spells else "What exactly will you change? Please spell it out."
            return {"observation": reply, "done": False}
        self.ended = True
        return {"observation": "Thanks, bye.", "done": True}

    def reward(self):
        names, read = [e["name"] for e in self.log], bool(world.called(self.log, "get_order_details"))
        writes = names.count("modify_pending_order_address")  # tried, gone through or not
        if self.status == "pending":  # the user confirmed before the first write was tried
            first = names.index("modify_pending_order_address") if writes else -1
            protocol = bool(writes) and self.confirmed_at is not None and self.confirmed_at <= first
            outcome = self.order["address"] == self.new_address and writes == 1
        else:
            protocol = not writes and read
            outcome = protocol and self.ended
        parts = {"authenticated": bool(world.called(self.log, "find_user_id_by_name_zip")), "read_order": read,
                 "followed_protocol": protocol, "correct_outcome": outcome}
        return world.graded(parts, WEIGHTS, "order was %s" % self.status)

    def oracle(self):
        order_id = self.order["order_id"]
        read = [world.retail_login(self.user), (TOOLS[1], {"order_id": order_id})]
        if self.status != "pending":
            return world.script(*read, "I'm sorry, order %s is already %s, so its address can no longer be changed." % (
                order_id, self.status))
        ask = "I will change the shipping address of order %s to %s. Do you confirm (yes/no)?" % (
            order_id, world.retail_spelled(self.new_address))
        return world.script(*read, ask, (TOOLS[2], dict(self.new_address, order_id=order_id)),
                            "Done: order %s will ship to the new address." % order_id)
