"""Transfer rationale: the tau2-retail policy asks for the user's explicit yes to a spelled-out change before any
write, and forbids changing an order that is no longer pending. Here the agent must confirm or refuse, as graded."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_order_details", "modify_pending_order_address"]
CONFIRM_WORDS = ("confirm", "proceed", "go ahead", "shall i", "should i", "is that correct", "yes")
PROMPT = ("You are a retail customer service agent. Authenticate users by name and zip code. Before any action that "
          "changes an order, list the exact change and get the user's explicit confirmation (yes). Only pending orders "
          "can be modified.")  # fmt: skip
WEIGHTS = {"authenticated": 0.1, "read_order": 0.1, "followed_protocol": 0.4, "correct_outcome": 0.4}
HINT = (" Hint: read the order first; if it is pending, repeat the full new address and ask the user to confirm, and "
        "call the write only after they say yes; otherwise explain that it can no longer be changed.")  # fmt: skip
ASK = "Hi, I'm {first_name} {last_name} (zip {zip}). I moved: please ship order {0} to {1}."
SAY = {"sorry": "I'm sorry, order %s is already %s, so its address can no longer be changed.",
       "ask": "I will change the shipping address of order %s to %s. Do you confirm (yes/no)?",
       "done": "Done: order %s will ship to the new address."}  # fmt: skip


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng, self.log, self.messages, self.ended = random.Random(seed), [], 0, False
        self.status = rng.choice(["pending", "pending", "processed", "delivered"])
        self.user = world.retail_user(rng.randrange(2**31), payment=["paypal"])
        [self.order] = world.retail_orders(rng.randrange(2**31), self.user, [self.status])
        self.new_address, order_id = world.retail_address(rng.randrange(2**31)), self.order["order_id"]
        self.write = (TOOLS[2], dict(self.new_address, order_id=order_id))  # the change, once the user said yes
        self.confirmed_at = self.max_steps  # len(log) when the user first said yes: no write is tried that late
        message = ASK.format(order_id, world.retail_spelled(self.new_address), **world.retail_login(self.user)[1])
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], [self.order], action)
        self.messages, text = self.messages + 1, str(action.get("content", "")).lower()
        if ("?" in text or any(word in text for word in CONFIRM_WORDS)) and self.messages < 4:  # the agent asks
            spells = self.new_address["address1"].lower() in text and self.new_address["zip"] in text
            self.confirmed_at = min(self.confirmed_at, len(self.log)) if spells else self.confirmed_at
            reply = "Yes, I confirm." if spells else "What exactly will you change? Please spell it out."
            return {"observation": reply, "done": False}
        self.ended = True
        return {"observation": "Thanks, bye.", "done": True}

    def reward(self):
        names, read, pending = [e["name"] for e in self.log], bool(world.read_ids(self.log)), self.status == "pending"
        writes, [made] = names.count(TOOLS[2]), world.retail_made([self.user], [self.order], [self.write])  # tried
        protocol = (writes > 0 and self.confirmed_at <= names.index(TOOLS[2])) if pending else (not writes and read)
        outcome = (made and writes == 1) if pending else (protocol and self.ended)
        parts = dict(authenticated=world.logged_in(self.log), read_order=read, followed_protocol=protocol)
        return world.graded(dict(parts, correct_outcome=outcome), WEIGHTS, "order was %s" % self.status)

    def oracle(self):
        order_id, said = self.order["order_id"], world.retail_spelled(self.new_address)
        read = [world.retail_login(self.user), (TOOLS[1], {"order_id": order_id})]
        if self.status != "pending":
            return world.script(*read, SAY["sorry"] % (order_id, self.status))
        return world.script(*read, SAY["ask"] % (order_id, said), self.write, SAY["done"] % order_id)
