"""Transfer rationale: on tau2-retail a tool call that does not parse (broken
JSON, a call described in prose, arguments that are not an object) does
nothing but cost a turn, and a value of the wrong JSON type (item ids as one
comma-separated string, a number where the schema wants a string) makes the
tool fail; a long task then runs out of turns. Here a return needs a chain of
calls with structured arguments (three strings to authenticate, an order id,
a list of item ids) within a tight step budget, and the reward counts each
call that arrived well formed and well typed, so the agent learns to write
every call as a JSON object the target accepts."""

import json
import random

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "return_delivered_order_items"]
FIRST = ["Yusuf", "Mia", "Noah", "Aarav", "Olivia", "Lucas", "Fatima", "Chen", "Sofia", "Ivan", "Amara", "Mateo"]
LAST = ["Rossi", "Garcia", "Kim", "Patel", "Smith", "Novak", "Okafor", "Silva", "Muller", "Tanaka", "Haddad", "Lopez"]
PRODUCTS = ["Headphones", "T-Shirt", "Water Bottle", "Sneakers", "Desk Lamp", "Backpack", "Yoga Mat", "Coffee Maker"]
COLORS = ["black", "blue", "red", "white", "green"]
STEPS = ["user_found", "user_read", "order_read", "return_made"]


class Environment:
    max_steps = 7

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.zip = "%05d" % rng.randrange(10000, 99999)
        self.user_id = "%s_%s_%04d" % (self.first.lower(), self.last.lower(), rng.randrange(10000))
        self.card = "credit_card_%07d" % rng.randrange(10**7)
        self.order_id = "#W%07d" % rng.randrange(10**7)
        names = rng.sample(PRODUCTS, rng.randint(3, 5))
        self.items = [
            {
                "name": n,
                "product_id": "%010d" % rng.randrange(10**10),
                "item_id": "%010d" % rng.randrange(10**10),
                "price": round(rng.uniform(15, 300), 2),
                "options": {"color": rng.choice(COLORS)},
            }
            for n in names
        ]
        self.wanted = sorted(rng.sample([i["item_id"] for i in self.items], rng.randint(2, 3)))
        self.order = {
            "order_id": self.order_id,
            "user_id": self.user_id,
            "address": {
                "address1": "%d Oak Avenue" % rng.randrange(1, 999),
                "address2": "",
                "city": "Denver",
                "country": "USA",
                "state": "CO",
                "zip": self.zip,
            },
            "items": self.items,
            "status": "delivered",
            "fulfillments": [
                {"tracking_id": ["%012d" % rng.randrange(10**12)], "item_ids": [i["item_id"] for i in self.items]}
            ],
            "payment_history": [
                {
                    "transaction_type": "payment",
                    "amount": round(sum(i["price"] for i in self.items), 2),
                    "payment_method_id": self.card,
                }
            ],
            # every field of tau2's Order, None as null
            "cancel_reason": None,
            "exchange_items": None,
            "exchange_new_items": None,
            "exchange_payment_method_id": None,
            "exchange_price_difference": None,
            "return_items": None,
            "return_payment_method_id": None,
        }
        self.good = set()
        self.mistyped = 0
        self.in_prose = 0
        self.messages = 0
        prompt = (
            "You are a retail customer service agent. Authenticate users by name and zip code. Delivered items "
            "can be returned to the original payment method. Keep the conversation short: you have few turns."
        )
        if hint:
            prompt += (
                " Hint: write each tool call as one JSON object with a name and an arguments object; give every "
                "argument the JSON type of its schema (lists as JSON arrays of strings), and never describe a "
                "call in prose instead of making it."
            )
        wanted_names = " and the ".join(i["name"] for i in self.items if i["item_id"] in self.wanted)
        message = "Hi, I'm %s %s, zip %s. I want to return the %s from my order %s, refund to my card please." % (
            self.first,
            self.last,
            self.zip,
            wanted_names,
            self.order_id,
        )
        return {"system_prompt": prompt, "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return {"observation": self._tool(action.get("name"), action.get("arguments") or {}), "done": False}
        content = action.get("content") if isinstance(action.get("content"), str) else ""
        self.messages += 1
        if "{" in content or '"name"' in content or "arguments" in content:
            self.in_prose += 1  # a call written as text reaches the user, who cannot run it
            return {
                "observation": "Sorry, I don't understand that. Can you just do the return?",
                "done": self.messages >= 3,
            }
        if "return_made" in self.good or self.messages >= 2:
            return {"observation": "Thanks, bye!", "done": True}
        return {"observation": "Yes, please return those items.", "done": False}

    def _typed(self, args, names, lists=()):
        ok = all(isinstance(args.get(n), str) for n in names if n not in lists)
        ok = ok and all(isinstance(args.get(n), list) and all(isinstance(v, str) for v in args.get(n)) for n in lists)
        if not ok:
            self.mistyped += 1
        return ok

    def _tool(self, name, args):
        if name == "find_user_id_by_name_zip":
            if not self._typed(args, ["first_name", "last_name", "zip"]):
                return "Error: User not found"
            if (args["first_name"], args["last_name"], args["zip"]) != (self.first, self.last, self.zip):
                return "Error: User not found"
            self.good.add("user_found")
            return self.user_id
        if name == "get_user_details":
            if not self._typed(args, ["user_id"]) or args["user_id"] != self.user_id:
                return "Error: User not found"
            self.good.add("user_read")
            return json.dumps(
                {
                    "user_id": self.user_id,
                    "name": {"first_name": self.first, "last_name": self.last},
                    "address": self.order["address"],
                    "email": "%s.%s@example.com" % (self.first.lower(), self.last.lower()),
                    "payment_methods": {
                        self.card: {
                            "source": "credit_card",
                            "id": self.card,
                            "brand": "visa",
                            "last_four": self.card[-4:],
                        }
                    },
                    "orders": [self.order_id],
                }
            )
        if name == "get_order_details":
            if not self._typed(args, ["order_id"]) or args["order_id"] != self.order_id:
                return "Error: Order not found"
            self.good.add("order_read")
            return json.dumps(self.order)
        if not self._typed(args, ["order_id", "item_ids", "payment_method_id"], lists=["item_ids"]):
            return "Error: Some item not found"
        if args["order_id"] != self.order_id:
            return "Error: Order not found"
        if self.order["status"] != "delivered":
            return "Error: Non-delivered order cannot be returned"
        if args["payment_method_id"] != self.card:
            return "Error: Payment method should be the original payment method"
        known = [i["item_id"] for i in self.items]
        if not args["item_ids"] or any(i not in known for i in args["item_ids"]):
            return "Error: Some item not found"
        self.order["status"] = "return requested"
        self.order["return_items"] = sorted(args["item_ids"])
        self.order["return_payment_method_id"] = self.card
        if sorted(args["item_ids"]) == self.wanted:
            self.good.add("return_made")
        return json.dumps(self.order)

    def reward(self):
        components = {step: 1.0 if step in self.good else 0.0 for step in STEPS}
        components["no_broken_calls"] = (
            1.0 if not (self.mistyped or self.in_prose) and "return_made" in self.good else 0.0
        )
        reward = (
            0.1 * (components["user_found"] + components["user_read"] + components["order_read"])
            + 0.5 * components["return_made"]
            + 0.2 * components["no_broken_calls"]
        )
        reason = "%d of %d calls made well formed; %d mistyped, %d written as text" % (
            len(self.good),
            len(STEPS),
            self.mistyped,
            self.in_prose,
        )
        return {"reward": round(reward, 4), "components": components, "reason": reason}

    def oracle(self):
        return [
            {
                "type": "tool_call",
                "name": "find_user_id_by_name_zip",
                "arguments": {"first_name": self.first, "last_name": self.last, "zip": self.zip},
            },
            {"type": "tool_call", "name": "get_user_details", "arguments": {"user_id": self.user_id}},
            {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": self.order_id}},
            {
                "type": "tool_call",
                "name": "return_delivered_order_items",
                "arguments": {"order_id": self.order_id, "item_ids": list(self.wanted), "payment_method_id": self.card},
            },
            {"type": "message", "content": "Your return is requested; the refund goes to your card."},
        ]
