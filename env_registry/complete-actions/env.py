"""Transfer rationale: tau2-retail requests often bundle several changes in one
conversation (cancel one order, move another's shipping address, pay a third
with a gift card), and its evaluator compares the final database, so an agent
that handles the first request and then closes the call fails the task even
though every call it made was right. Here the user asks for two to four
independent changes in one message, in a random order and wording, and the
reward counts each one that reached the database, so the agent learns to keep
a list of what was asked and finish all of it before it says goodbye."""

import json
import random

TOOLS = [
    "find_user_id_by_email",
    "get_user_details",
    "get_order_details",
    "cancel_pending_order",
    "modify_pending_order_address",
    "modify_pending_order_payment",
]
FIRST = ["Yusuf", "Mia", "Noah", "Aarav", "Olivia", "Lucas", "Fatima", "Chen", "Sofia", "Ivan", "Amara", "Mateo"]
LAST = ["Rossi", "Garcia", "Kim", "Patel", "Smith", "Novak", "Okafor", "Silva", "Muller", "Tanaka", "Haddad", "Lopez"]
ITEMS = [
    "Headphones",
    "Desk Lamp",
    "Water Bottle",
    "Backpack",
    "Action Camera",
    "Bluetooth Speaker",
    "Coffee Maker",
    "Yoga Mat",
]
STREETS = ["Oak Avenue", "Maple Street", "Cedar Lane", "Elm Road", "Pine Court", "Lakeview Drive", "Hillcrest Way"]
CITIES = [
    ("Denver", "CO", "80"),
    ("Austin", "TX", "73"),
    ("Seattle", "WA", "98"),
    ("Boston", "MA", "02"),
    ("Phoenix", "AZ", "85"),
]
REASONS = {"no longer needed": "I don't need it anymore", "ordered by mistake": "I ordered it by mistake"}


class Environment:
    max_steps = 20

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.email = "%s.%s%d@example.com" % (self.first.lower(), self.last.lower(), rng.randrange(1000, 9999))
        self.user_id = "%s_%s_%04d" % (self.first.lower(), self.last.lower(), rng.randrange(10000))
        self.card = "credit_card_%07d" % rng.randrange(10**7)
        self.gift = "gift_card_%07d" % rng.randrange(10**7)
        self.payment_methods = {
            self.card: {
                "source": "credit_card",
                "id": self.card,
                "brand": rng.choice(["visa", "mastercard"]),
                "last_four": "%04d" % rng.randrange(10**4),
            },
            self.gift: {"source": "gift_card", "id": self.gift, "balance": round(rng.uniform(600, 900), 2)},
        }
        self.home = self._address(rng)
        self.orders = {}
        kinds = rng.sample(["cancel", "address", "payment", "cancel2"], rng.randint(2, 4))
        self.requests = []
        for kind in kinds:
            order_id = self._order(rng)
            if kind.startswith("cancel"):
                self.requests.append({"kind": "cancel", "order_id": order_id, "reason": rng.choice(sorted(REASONS))})
            elif kind == "address":
                self.requests.append({"kind": "address", "order_id": order_id, "address": self._address(rng)})
            else:
                self.requests.append({"kind": "payment", "order_id": order_id, "payment_method_id": self.gift})
        for _ in range(rng.randint(0, 2)):
            self._order(rng)  # orders nobody asked about
        self.done_requests = set()
        self.attempted = set()
        self.messages = 0
        self.closed_after_all = False
        prompt = (
            "You are a retail customer service agent. Authenticate the user by email before any change. "
            "Pending orders can be cancelled (reason 'no longer needed' or 'ordered by mistake'), get a new "
            "shipping address, or be paid with another of the user's payment methods."
        )
        if hint:
            prompt += (
                " Hint: the user asks for several changes at once; list every one of them, carry each out with "
                "its own tool call, and only then tell the user that everything is done."
            )
        asks = [self._ask(r) for r in self.requests]
        message = "Hi, my email is %s. I have a few things today: %s. Thanks!" % (self.email, "; also, ".join(asks))
        return {"system_prompt": prompt, "user_message": message}

    def _address(self, rng):
        city, state, prefix = rng.choice(CITIES)
        return {
            "address1": "%d %s" % (rng.randrange(1, 9999), rng.choice(STREETS)),
            "address2": rng.choice(["", "Suite %d" % rng.randrange(100, 999), "Apt %d" % rng.randrange(1, 99)]),
            "city": city,
            "country": "USA",
            "state": state,
            "zip": prefix + "%03d" % rng.randrange(1000),
        }

    def _order(self, rng):
        order_id = "#W%07d" % rng.randrange(10**7)
        item = {
            "name": rng.choice(ITEMS),
            "product_id": "%010d" % rng.randrange(10**10),
            "item_id": "%010d" % rng.randrange(10**10),
            "price": round(rng.uniform(20, 400), 2),
            "options": {"color": rng.choice(["black", "white", "blue", "red"])},
        }
        self.orders[order_id] = {
            "order_id": order_id,
            "user_id": self.user_id,
            "address": dict(self.home),
            "items": [item],
            "status": "pending",
            "fulfillments": [],
            "payment_history": [
                {"transaction_type": "payment", "amount": item["price"], "payment_method_id": self.card}
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
        return order_id

    def _ask(self, request):
        order = request["order_id"]
        if request["kind"] == "cancel":
            return "please cancel order %s, %s" % (order, REASONS[request["reason"]])
        if request["kind"] == "address":
            a = request["address"]
            where = a["address1"] + (", " + a["address2"] if a["address2"] else "")
            return "order %s should ship to %s, %s, %s %s, USA instead" % (
                order,
                where,
                a["city"],
                a["state"],
                a["zip"],
            )
        return "I'd like to pay for order %s with my gift card instead of my credit card" % order

    def step(self, action):
        if action.get("type") == "tool_call":
            return {"observation": self._tool(action.get("name"), action.get("arguments") or {}), "done": False}
        self.messages += 1
        if len(self.done_requests) == len(self.requests):
            self.closed_after_all = True
            return {"observation": "Great, that's everything. Bye!", "done": True}
        if self.messages >= 3 or self.done_requests:
            return {"observation": "Okay, thanks. Bye!", "done": True}
        return {"observation": "Yes, I confirm all of that. Please go ahead.", "done": False}

    def _tool(self, name, args):
        if name == "find_user_id_by_email":
            return self.user_id if args.get("email") == self.email else "Error: User not found"
        if name == "get_user_details":
            if args.get("user_id") != self.user_id:
                return "Error: User not found"
            return json.dumps(
                {
                    "user_id": self.user_id,
                    "name": {"first_name": self.first, "last_name": self.last},
                    "address": self.home,
                    "email": self.email,
                    "payment_methods": self.payment_methods,
                    "orders": sorted(self.orders),
                }
            )
        order = self.orders.get(args.get("order_id")) if isinstance(args.get("order_id"), str) else None
        if order is None:
            return "Error: Order not found"
        if name == "get_order_details":
            return json.dumps(order)
        if order["status"] != "pending":
            return "Error: Non-pending order cannot be modified"
        if name == "cancel_pending_order":
            if args.get("reason") not in REASONS:
                return "Error: Invalid reason"
            order["status"] = "cancelled"
            order["cancel_reason"] = args["reason"]
            self._record("cancel", order["order_id"], args["reason"])
        elif name == "modify_pending_order_address":
            fields = ["address1", "address2", "city", "state", "country", "zip"]
            if not all(isinstance(args.get(f), str) for f in fields):
                return "Error: Invalid address"
            order["address"] = {f: args[f] for f in ["address1", "address2", "city", "country", "state", "zip"]}
            self._record("address", order["order_id"], order["address"])
        else:
            method = args.get("payment_method_id")
            if not isinstance(method, str) or method not in self.payment_methods:
                return "Error: Payment method not found"
            if method == order["payment_history"][0]["payment_method_id"]:
                return "Error: The new payment method should be different from the current one"
            order["payment_history"].append(
                {"transaction_type": "payment", "amount": order["items"][0]["price"], "payment_method_id": method}
            )
            order["payment_history"].append(
                {"transaction_type": "refund", "amount": order["items"][0]["price"], "payment_method_id": self.card}
            )
            self._record("payment", order["order_id"], method)
        return json.dumps(order)

    def _record(self, kind, order_id, value):
        for index, request in enumerate(self.requests):
            if request["kind"] != kind or request["order_id"] != order_id:
                continue
            self.attempted.add(index)
            wanted = {
                "cancel": request.get("reason"),
                "address": request.get("address"),
                "payment": request.get("payment_method_id"),
            }[kind]
            if value == wanted:
                self.done_requests.add(index)

    def reward(self):
        n = len(self.requests)
        partial = len(self.attempted - self.done_requests)
        components = {
            "requests_completed": len(self.done_requests) / n,
            "requests_attempted_wrongly": partial / n,
            "closed_after_all": 1.0 if self.closed_after_all else 0.0,
        }
        reward = (
            0.85 * components["requests_completed"]
            + 0.25 * components["requests_attempted_wrongly"]
            + 0.15 * components["closed_after_all"]
        )
        return {
            "reward": round(min(reward, 1.0), 4),
            "components": components,
            "reason": "%d of %d requested changes made" % (len(self.done_requests), n),
        }

    def oracle(self):
        actions = [{"type": "tool_call", "name": "find_user_id_by_email", "arguments": {"email": self.email}}]
        for r in self.requests:
            if r["kind"] == "cancel":
                actions.append(
                    {
                        "type": "tool_call",
                        "name": "cancel_pending_order",
                        "arguments": {"order_id": r["order_id"], "reason": r["reason"]},
                    }
                )
            elif r["kind"] == "address":
                actions.append(
                    {
                        "type": "tool_call",
                        "name": "modify_pending_order_address",
                        "arguments": dict(r["address"], order_id=r["order_id"]),
                    }
                )
            else:
                actions.append(
                    {
                        "type": "tool_call",
                        "name": "modify_pending_order_payment",
                        "arguments": {"order_id": r["order_id"], "payment_method_id": r["payment_method_id"]},
                    }
                )
        actions.append(
            {"type": "message", "content": "All %d changes are done. Is there anything else?" % len(self.requests)}
        )
        return actions
