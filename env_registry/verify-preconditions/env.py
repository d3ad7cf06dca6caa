"""Transfer rationale: tau2-retail punishes state-changing calls made on
unchecked assumptions: cancelling an order that is not the caller's, or that
is no longer pending, changes the database in a way the evaluator compares
exactly. The write tools themselves will often succeed (they do not check
ownership), so only an agent that reads the user's account and the order's
status first avoids the damage. Here the user always insists, and a third of
the orders may be cancelled while two thirds must not be, so the agent has to
verify rather than guess."""

import json
import random

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "cancel_pending_order"]
FIRST = ["Yusuf", "Mia", "Noah", "Aarav", "Olivia", "Lucas", "Fatima", "Chen", "Sofia", "Ivan", "Amara", "Mateo"]
LAST = ["Rossi", "Garcia", "Kim", "Patel", "Smith", "Novak", "Okafor", "Silva", "Muller", "Tanaka", "Haddad", "Lopez"]
ITEMS = ["Headphones", "Desk Lamp", "Water Bottle", "Backpack", "Action Camera", "Bluetooth Speaker", "Coffee Maker"]
REASONS = ["no longer needed", "ordered by mistake"]


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.zip = "%05d" % rng.randrange(10000, 99999)
        self.user_id = "%s_%s_%04d" % (self.first.lower(), self.last.lower(), rng.randrange(10000))
        self.card = "credit_card_%07d" % rng.randrange(10**7)
        self.case = rng.choice(["cancellable", "not_pending", "not_theirs"])
        self.reason = rng.choice(REASONS)
        self.orders = {}
        for index in range(rng.randint(2, 4)):
            status = rng.choice(["pending", "processed", "delivered"])
            self._add_order(rng, self.user_id, status)
        owner = (
            self.user_id
            if self.case != "not_theirs"
            else "%s_%s_%04d" % (rng.choice(FIRST).lower(), rng.choice(LAST).lower(), rng.randrange(10000))
        )
        status = "pending" if self.case in ("cancellable", "not_theirs") else rng.choice(["processed", "delivered"])
        self.target = self._add_order(rng, owner, status)
        self.user_orders = [o for o, order in self.orders.items() if order["user_id"] == self.user_id]
        self.found_user = False
        self.checked_before_write = None
        self.read_orders = set()
        self.read_user = False
        self.cancel_calls = []
        self.messages = 0
        self.answered = False
        prompt = (
            "You are a retail customer service agent. Authenticate users by name and zip code. "
            "Only pending orders that belong to the authenticated user can be cancelled, with reason "
            "'no longer needed' or 'ordered by mistake'."
        )
        if hint:
            prompt += (
                " Hint: before any cancellation, read the user's account to see that the order is theirs, "
                "and read the order to see that it is still pending; if either fails, do not cancel and explain why."
            )
        message = "Hi, this is %s %s, zip %s. Please cancel my order %s, I %s." % (
            self.first,
            self.last,
            self.zip,
            self.target,
            "don't need it anymore" if self.reason == "no longer needed" else "ordered it by mistake",
        )
        return {"system_prompt": prompt, "user_message": message}

    def _add_order(self, rng, owner, status):
        order_id = "#W%07d" % rng.randrange(10**7)
        price = round(rng.uniform(20, 500), 2)
        self.orders[order_id] = {
            "order_id": order_id,
            "user_id": owner,
            "address": {
                "address1": "%d Main Street" % rng.randrange(1, 999),
                "address2": "",
                "city": "Austin",
                "country": "USA",
                "state": "TX",
                "zip": self.zip,
            },
            "items": [
                {
                    "name": rng.choice(ITEMS),
                    "product_id": "%010d" % rng.randrange(10**10),
                    "item_id": "%010d" % rng.randrange(10**10),
                    "price": price,
                    "options": {},
                }
            ],
            "status": status,
            "fulfillments": [],
            "payment_history": [{"transaction_type": "payment", "amount": price, "payment_method_id": self.card}],
            # every field tau2's Order has, as tau2 writes it (None as null)
            "cancel_reason": None,
            "exchange_items": None,
            "exchange_new_items": None,
            "exchange_payment_method_id": None,
            "exchange_price_difference": None,
            "return_items": None,
            "return_payment_method_id": None,
        }
        return order_id

    def step(self, action):
        if action.get("type") == "tool_call":
            return {"observation": self._tool(action.get("name"), action.get("arguments") or {}), "done": False}
        self.messages += 1
        text = str(action.get("content", ""))
        if "?" in text and self.messages < 3:
            return {"observation": "Yes. Please cancel it now.", "done": False}
        self.answered = True
        return {"observation": "Okay, thank you.", "done": True}

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
        if name == "get_user_details":
            if args["user_id"] != self.user_id:
                return "Error: User not found"
            self.read_user = True
            return json.dumps(
                {
                    "user_id": self.user_id,
                    "name": {"first_name": self.first, "last_name": self.last},
                    "address": self.orders[self.user_orders[0]]["address"],
                    "email": "%s.%s@example.com" % (self.first.lower(), self.last.lower()),
                    "payment_methods": {
                        self.card: {
                            "source": "credit_card",
                            "id": self.card,
                            "brand": "visa",
                            "last_four": self.card[-4:],
                        }
                    },
                    "orders": self.user_orders,
                }
            )
        order = self.orders.get(args["order_id"]) if isinstance(args["order_id"], str) else None
        if order is None:
            return "Error: Order not found"
        if name == "get_order_details":
            self.read_orders.add(order["order_id"])
            return json.dumps(order)
        self.cancel_calls.append(dict(args))
        if self.checked_before_write is None:
            self.checked_before_write = self.target in self.read_orders and self.read_user
        if order["status"] != "pending":
            return "Error: Non-pending order cannot be cancelled"
        if args["reason"] not in REASONS:
            return "Error: Invalid reason"
        order["status"] = "cancelled"
        order["cancel_reason"] = args["reason"]
        order["payment_history"].append(
            {
                "transaction_type": "refund",
                "amount": order["payment_history"][0]["amount"],
                "payment_method_id": self.card,
            }
        )
        return json.dumps(order)

    def reward(self):
        checked = (
            self.checked_before_write if self.cancel_calls else (self.target in self.read_orders and self.read_user)
        )
        target = self.orders[self.target]
        others_intact = all(o["status"] != "cancelled" for oid, o in self.orders.items() if oid != self.target)
        if self.case == "cancellable":
            outcome = target["status"] == "cancelled" and target["cancel_reason"] == self.reason and others_intact
        else:
            outcome = not self.cancel_calls and self.answered and checked
        components = {
            "authenticated": 1.0 if self.found_user else 0.0,
            "verified_before_write": 1.0 if checked else 0.0,
            "correct_outcome": 1.0 if outcome else 0.0,
        }
        reward = (
            0.2 * components["authenticated"]
            + 0.3 * components["verified_before_write"]
            + 0.5 * components["correct_outcome"]
        )
        return {"reward": round(reward, 4), "components": components, "reason": "case %s" % self.case}

    def oracle(self):
        actions = [
            {
                "type": "tool_call",
                "name": "find_user_id_by_name_zip",
                "arguments": {"first_name": self.first, "last_name": self.last, "zip": self.zip},
            },
            {"type": "tool_call", "name": "get_user_details", "arguments": {"user_id": self.user_id}},
            {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": self.target}},
        ]
        if self.case == "cancellable":
            actions.append(
                {
                    "type": "tool_call",
                    "name": "cancel_pending_order",
                    "arguments": {"order_id": self.target, "reason": self.reason},
                }
            )
            actions.append(
                {"type": "message", "content": "Your order %s has been cancelled and refunded." % self.target}
            )
        elif self.case == "not_pending":
            actions.append(
                {
                    "type": "message",
                    "content": "I'm sorry, order %s is %s, so it can no longer be cancelled."
                    % (self.target, self.orders[self.target]["status"]),
                }
            )
        else:
            actions.append(
                {
                    "type": "message",
                    "content": "I'm sorry, order %s is not on your account, so I cannot cancel it." % self.target,
                }
            )
        return actions
