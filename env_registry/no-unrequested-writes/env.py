"""Transfer rationale: tau2-retail's evaluator compares the final database
with the one the request implies, so a write nobody asked for (cancelling an
order the user only mentioned, moving every order to a new address when one
was asked for) fails the task as surely as a missing one. Users often talk
about other orders in passing or say what they decided against. Here the user
asks for exactly one change and mentions a second order that must stay as it
is; the reward pays for the requested change only when no other write was
made, so the agent learns to change exactly what was asked."""

import json
import random

TOOLS = [
    "find_user_id_by_name_zip",
    "get_user_details",
    "get_order_details",
    "cancel_pending_order",
    "modify_pending_order_address",
    "modify_user_address",
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
FIELDS = ["address1", "address2", "city", "country", "state", "zip"]
REASONS = {"no longer needed": "I don't need it anymore", "ordered by mistake": "I ordered it by mistake"}
DECOYS = [
    "I also thought about cancelling order %s, but I've decided to keep it",
    "my other order %s still has the old address, and that's fine, it can go there",
    "order %s is a gift for my sister, so please don't touch that one",
    "you may see order %s on my account too; nothing to do there",
]


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.zip = "%05d" % rng.randrange(10000, 99999)
        self.user_id = "%s_%s_%04d" % (self.first.lower(), self.last.lower(), rng.randrange(10000))
        self.card = "credit_card_%07d" % rng.randrange(10**7)
        self.home = self._address(rng)
        self.home["zip"] = self.zip
        self.orders = {}
        ids = [self._order(rng) for _ in range(rng.randint(2, 4))]
        self.order_id, decoy = rng.sample(ids, 2)
        self.kind = rng.choice(["cancel", "address"])
        self.reason = rng.choice(sorted(REASONS))
        self.new_address = self._address(rng)
        self.writes = []
        self.read_order = False
        self.messages = 0
        prompt = (
            "You are a retail customer service agent. Authenticate the user by name and zip code before any "
            "change. Pending orders can be cancelled (reason 'no longer needed' or 'ordered by mistake') or get "
            "a new shipping address; a user's default address can be changed too."
        )
        if hint:
            prompt += (
                " Hint: change exactly what the user asks for; other orders they mention are context, "
                "not requests, unless they ask for a change to them."
            )
        if self.kind == "cancel":
            ask = "please cancel order %s, %s" % (self.order_id, REASONS[self.reason])
        else:
            a = self.new_address
            ask = "please send order %s to %s%s, %s, %s %s, USA" % (
                self.order_id,
                a["address1"],
                (", " + a["address2"]) if a["address2"] else "",
                a["city"],
                a["state"],
                a["zip"],
            )
        parts = [ask, rng.choice(DECOYS) % decoy]
        rng.shuffle(parts)
        message = "Hello, I'm %s %s, zip code %s. %s. %s." % (
            self.first,
            self.last,
            self.zip,
            parts[0][0].upper() + parts[0][1:],
            parts[1][0].upper() + parts[1][1:],
        )
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

    def step(self, action):
        if action.get("type") == "tool_call":
            return {"observation": self._tool(action.get("name"), action.get("arguments") or {}), "done": False}
        self.messages += 1
        if self.writes or self.messages >= 3:
            return {"observation": "Thanks, that's all I needed. Bye!", "done": True}
        return {"observation": "Yes, that's right, please go ahead.", "done": False}

    def _tool(self, name, args):
        if name == "find_user_id_by_name_zip":
            known = (
                args.get("first_name") == self.first
                and args.get("last_name") == self.last
                and args.get("zip") == self.zip
            )
            return self.user_id if known else "Error: User not found"
        if name == "get_user_details" or name == "modify_user_address":
            if args.get("user_id") != self.user_id:
                return "Error: User not found"
            if name == "modify_user_address":
                if not all(isinstance(args.get(f), str) for f in FIELDS):
                    return "Error: Invalid address"
                self.home = {f: args[f] for f in FIELDS}
                self.writes.append({"name": name, "order_id": None})
            return json.dumps(
                {
                    "user_id": self.user_id,
                    "name": {"first_name": self.first, "last_name": self.last},
                    "address": self.home,
                    "email": "%s.%s@example.com" % (self.first.lower(), self.last.lower()),
                    "payment_methods": {
                        self.card: {
                            "source": "credit_card",
                            "id": self.card,
                            "brand": "visa",
                            "last_four": self.card[-4:],
                        }
                    },
                    "orders": sorted(self.orders),
                }
            )
        order = self.orders.get(args.get("order_id")) if isinstance(args.get("order_id"), str) else None
        if order is None:
            return "Error: Order not found"
        if name == "get_order_details":
            self.read_order = self.read_order or order["order_id"] == self.order_id
            return json.dumps(order)
        if order["status"] != "pending":
            return "Error: Non-pending order cannot be modified"
        if name == "cancel_pending_order":
            if args.get("reason") not in REASONS:
                return "Error: Invalid reason"
            order["status"] = "cancelled"
            order["cancel_reason"] = args["reason"]
            value = args["reason"]
        else:
            if not all(isinstance(args.get(f), str) for f in FIELDS):
                return "Error: Invalid address"
            order["address"] = {f: args[f] for f in FIELDS}
            value = order["address"]
        self.writes.append({"name": name, "order_id": order["order_id"], "value": value})
        return json.dumps(order)

    def reward(self):
        tool = "cancel_pending_order" if self.kind == "cancel" else "modify_pending_order_address"
        wanted = self.reason if self.kind == "cancel" else self.new_address
        requested = [w for w in self.writes if w["name"] == tool and w["order_id"] == self.order_id]
        extra = [w for w in self.writes if not (w["name"] == tool and w["order_id"] == self.order_id)]
        correct = any(w.get("value") == wanted for w in requested)
        components = {
            "read_order": 1.0 if self.read_order else 0.0,
            "requested_change": 1.0 if correct else (0.3 if requested else 0.0),
            "no_unrequested_writes": 1.0 if correct and not extra else 0.0,
        }
        reward = (
            0.1 * components["read_order"]
            + 0.5 * components["requested_change"]
            + 0.4 * components["no_unrequested_writes"]
        )
        reason = "%d requested write(s), %d unrequested" % (len(requested), len(extra))
        return {"reward": round(reward, 4), "components": components, "reason": reason}

    def oracle(self):
        if self.kind == "cancel":
            write = {
                "type": "tool_call",
                "name": "cancel_pending_order",
                "arguments": {"order_id": self.order_id, "reason": self.reason},
            }
        else:
            write = {
                "type": "tool_call",
                "name": "modify_pending_order_address",
                "arguments": dict(self.new_address, order_id=self.order_id),
            }
        return [
            {
                "type": "tool_call",
                "name": "find_user_id_by_name_zip",
                "arguments": {"first_name": self.first, "last_name": self.last, "zip": self.zip},
            },
            {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": self.order_id}},
            write,
            {"type": "message", "content": "Done: only the order you asked about was changed."},
        ]
