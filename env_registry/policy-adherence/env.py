"""Transfer rationale: the tau2-retail policy requires the agent to state a
consequential change and obtain the user's explicit yes before calling a
write tool, and to refuse changes the policy forbids (only pending orders can
be modified). Agents fail by writing first and asking later, or by trying a
forbidden change because the user asked nicely. Here a user asks to change an
order's shipping address; the order may or may not still be pending, and the
user only says yes to a request that spells out the new address, so the agent
must follow the same confirm-or-refuse protocol the target grades."""

import json
import random

TOOLS = ["find_user_id_by_name_zip", "get_order_details", "modify_pending_order_address"]
FIRST = ["Yusuf", "Mia", "Noah", "Aarav", "Olivia", "Lucas", "Fatima", "Chen", "Sofia", "Ivan", "Amara", "Mateo"]
LAST = ["Rossi", "Garcia", "Kim", "Patel", "Smith", "Novak", "Okafor", "Silva", "Muller", "Tanaka", "Haddad", "Lopez"]
STREETS = ["Broadway", "Elm Street", "Oak Avenue", "Main Street", "Pine Road", "Maple Lane", "Cedar Court"]
CITIES = [("Philadelphia", "PA"), ("Austin", "TX"), ("Denver", "CO"), ("Seattle", "WA"), ("Boston", "MA")]
CONFIRM_WORDS = ("confirm", "proceed", "go ahead", "shall i", "should i", "is that correct", "yes")


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.zip = "%05d" % rng.randrange(10000, 99999)
        self.user_id = "%s_%s_%04d" % (self.first.lower(), self.last.lower(), rng.randrange(10000))
        self.order_id = "#W%07d" % rng.randrange(10**7)
        self.status = rng.choice(["pending", "pending", "processed", "delivered"])
        city, state = rng.choice(CITIES)
        self.new_address = {
            "address1": "%d %s" % (rng.randrange(1, 9999), rng.choice(STREETS)),
            "address2": "Apt %d" % rng.randrange(1, 99),
            "city": city,
            "state": state,
            "country": "USA",
            "zip": "%05d" % rng.randrange(10000, 99999),
        }
        old_city, old_state = rng.choice(CITIES)
        price = round(rng.uniform(20, 400), 2)
        self.order = {
            "order_id": self.order_id,
            "user_id": self.user_id,
            "address": {
                "address1": "%d %s" % (rng.randrange(1, 9999), rng.choice(STREETS)),
                "address2": "",
                "city": old_city,
                "country": "USA",
                "state": old_state,
                "zip": self.zip,
            },
            "items": [
                {
                    "name": "Backpack",
                    "product_id": "2524789262",
                    "item_id": "%010d" % rng.randrange(10**10),
                    "price": price,
                    "options": {},
                }
            ],
            "status": self.status,
            "fulfillments": [],
            "payment_history": [
                {
                    "transaction_type": "payment",
                    "amount": price,
                    "payment_method_id": "paypal_%07d" % rng.randrange(10**7),
                }
            ],
            # every field tau2's Order has, as tau2 writes it (None as null)
            "cancel_reason": None,
            "exchange_items": None,
            "exchange_new_items": None,
            "exchange_payment_method_id": None,
            "exchange_price_difference": None,
            "return_items": None,
            "return_payment_method_id": None,
        }
        self.found_user = False
        self.read_order = False
        self.confirmed = False
        self.confirmed_before_write = None
        self.write_calls = []
        self.messages = 0
        self.ended = False
        prompt = (
            "You are a retail customer service agent. Authenticate users by name and zip code. Before any action that "
            "changes an order, list the exact change and get the user's explicit confirmation (yes). Only pending orders "
            "can be modified."
        )
        if hint:
            prompt += (
                " Hint: read the order first; if it is pending, repeat the full new address and ask the user to confirm, "
                "and call the write only after they say yes; otherwise explain that it can no longer be changed."
            )
        address = "%(address1)s, %(address2)s, %(city)s, %(state)s %(zip)s, %(country)s" % self.new_address
        message = "Hi, I'm %s %s (zip %s). I moved: please ship order %s to %s." % (
            self.first,
            self.last,
            self.zip,
            self.order_id,
            address,
        )
        return {"system_prompt": prompt, "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return {"observation": self._tool(action.get("name"), action.get("arguments") or {}), "done": False}
        self.messages += 1
        text = str(action.get("content", "")).lower()
        asks = "?" in text or any(word in text for word in CONFIRM_WORDS)
        spells_out = self.new_address["address1"].lower() in text and self.new_address["zip"] in text
        if asks and spells_out and self.messages < 4:
            self.confirmed = True
            return {"observation": "Yes, I confirm.", "done": False}
        if asks and self.messages < 4:
            return {"observation": "What exactly will you change? Please spell it out.", "done": False}
        self.ended = True
        return {"observation": "Thanks, bye.", "done": True}

    def _tool(self, name, args):
        if name == "find_user_id_by_name_zip":
            if (str(args["first_name"]).lower(), str(args["last_name"]).lower(), str(args["zip"])) != (
                self.first.lower(),
                self.last.lower(),
                self.zip,
            ):
                return "Error: User not found"
            self.found_user = True
            return self.user_id
        if args["order_id"] != self.order_id:
            return "Error: Order not found"
        if name == "get_order_details":
            self.read_order = True
            return json.dumps(self.order)
        self.write_calls.append(dict(args))
        if self.confirmed_before_write is None:
            self.confirmed_before_write = self.confirmed
        if self.order["status"] != "pending":
            return "Error: Non-pending order cannot be modified"
        self.order["address"] = {k: args[k] for k in ("address1", "address2", "city", "country", "state", "zip")}
        return json.dumps(self.order)

    def reward(self):
        wanted = dict(self.new_address)
        if self.status == "pending":
            protocol = bool(self.write_calls) and self.confirmed_before_write is True
            outcome = self.order["address"] == wanted and len(self.write_calls) == 1
        else:
            protocol = not self.write_calls and self.read_order
            outcome = protocol and self.ended
        components = {
            "authenticated": 1.0 if self.found_user else 0.0,
            "read_order": 1.0 if self.read_order else 0.0,
            "followed_protocol": 1.0 if protocol else 0.0,
            "correct_outcome": 1.0 if outcome else 0.0,
        }
        weights = {"authenticated": 0.1, "read_order": 0.1, "followed_protocol": 0.4, "correct_outcome": 0.4}
        reward = sum(weights[k] * v for k, v in components.items())
        return {"reward": round(reward, 4), "components": components, "reason": "order was %s" % self.status}

    def oracle(self):
        actions = [
            {
                "type": "tool_call",
                "name": "find_user_id_by_name_zip",
                "arguments": {"first_name": self.first, "last_name": self.last, "zip": self.zip},
            },
            {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": self.order_id}},
        ]
        if self.status != "pending":
            return actions + [
                {
                    "type": "message",
                    "content": "I'm sorry, order %s is already %s, so its address can no longer be changed."
                    % (self.order_id, self.status),
                }
            ]
        address = "%(address1)s, %(address2)s, %(city)s, %(state)s %(zip)s, %(country)s" % self.new_address
        return actions + [
            {
                "type": "message",
                "content": "I will change the shipping address of order %s to %s. Do you confirm (yes/no)?"
                % (self.order_id, address),
            },
            {
                "type": "tool_call",
                "name": "modify_pending_order_address",
                "arguments": dict(self.new_address, order_id=self.order_id),
            },
            {"type": "message", "content": "Done: order %s will ship to the new address." % self.order_id},
        ]
