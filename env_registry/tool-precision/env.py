"""Transfer rationale: tau2-retail's write tools take exact identifiers
(order ids with their '#', 10-digit item ids, payment method ids such as
'credit_card_1234567') and its evaluator compares the resulting database
exactly, so a near-miss argument is a failed task. Users describe things
loosely ('order W1234567', 'the blue headphones', 'my Visa'), and the agent
must map those descriptions to the exact ids found in tool output. Here an
order holds look-alike items (same product, other options) and the user has
several payment methods, so only exact reading and copying succeeds."""

import json
import random

TOOLS = ["find_user_id_by_email", "get_user_details", "get_order_details", "return_delivered_order_items"]
LEVELS = 3  # 0: one item, the '#' given, refund to the original method; 1 (default): look-alikes; 2: every look-alike, two items
FIRST = ["Yusuf", "Mia", "Noah", "Aarav", "Olivia", "Lucas", "Fatima", "Chen", "Sofia", "Ivan", "Amara", "Mateo"]
LAST = ["Rossi", "Garcia", "Kim", "Patel", "Smith", "Novak", "Okafor", "Silva", "Muller", "Tanaka", "Haddad", "Lopez"]
PRODUCTS = {
    "Headphones": ("color", ["black", "blue", "red", "white"]),
    "T-Shirt": ("size", ["S", "M", "L", "XL"]),
    "Water Bottle": ("capacity", ["500ml", "750ml", "1000ml"]),
    "Sneakers": ("size", ["8", "9", "10", "11"]),
    "Desk Lamp": ("color", ["black", "silver", "white"]),
}


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False, level=1):
        rng = random.Random(seed)
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.email = "%s.%s%d@example.com" % (self.first.lower(), self.last.lower(), rng.randrange(1000, 9999))
        self.user_id = "%s_%s_%04d" % (self.first.lower(), self.last.lower(), rng.randrange(10000))
        card = "credit_card_%07d" % rng.randrange(10**7)
        paypal = "paypal_%07d" % rng.randrange(10**7)
        gift = "gift_card_%07d" % rng.randrange(10**7)
        brand = rng.choice(["visa", "mastercard"])
        self.payment_methods = {
            card: {"source": "credit_card", "id": card, "brand": brand, "last_four": "%04d" % rng.randrange(10**4)},
            paypal: {"source": "paypal", "id": paypal},
            gift: {"source": "gift_card", "id": gift, "balance": round(rng.uniform(0, 200), 2)},
        }
        original = rng.choice([card, paypal])
        self.refund_to = rng.choice([original, gift]) if level else original
        self.described = {card: "my %s card" % brand.capitalize(), paypal: "my PayPal", gift: "my gift card"}[
            self.refund_to
        ]
        self.order_id = "#W%07d" % rng.randrange(10**7)
        product = rng.choice(sorted(PRODUCTS))
        option, values = PRODUCTS[product]
        picked = rng.sample(values, [1, rng.randint(2, len(values)), len(values)][level])
        items = [
            {
                "name": product,
                "product_id": "%010d" % (sum(map(ord, product)) * 7919),
                "item_id": "%010d" % rng.randrange(10**10),
                "price": round(rng.uniform(15, 300), 2),
                "options": {option: value},
            }
            for value in picked
        ]
        other = rng.choice([p for p in sorted(PRODUCTS) if p != product])
        items.append(
            {
                "name": other,
                "product_id": "%010d" % (sum(map(ord, other)) * 7919),
                "item_id": "%010d" % rng.randrange(10**10),
                "price": round(rng.uniform(15, 300), 2),
                "options": {PRODUCTS[other][0]: rng.choice(PRODUCTS[other][1])},
            }
        )
        rng.shuffle(items)
        self.wanted = [i for i in items if i["name"] == product][: [1, rng.randint(1, 2), 2][level]]
        total = round(sum(i["price"] for i in items), 2)
        self.order = {
            "order_id": self.order_id,
            "user_id": self.user_id,
            "address": {
                "address1": "%d Oak Avenue" % rng.randrange(1, 999),
                "address2": "",
                "city": "Denver",
                "country": "USA",
                "state": "CO",
                "zip": "%05d" % rng.randrange(10000, 99999),
            },
            "items": items,
            "status": "delivered",
            "fulfillments": [
                {"tracking_id": ["%012d" % rng.randrange(10**12)], "item_ids": [i["item_id"] for i in items]}
            ],
            "payment_history": [{"transaction_type": "payment", "amount": total, "payment_method_id": original}],
            # every field tau2's Order has, as tau2 writes it (None as null)
            "cancel_reason": None,
            "exchange_items": None,
            "exchange_new_items": None,
            "exchange_payment_method_id": None,
            "exchange_price_difference": None,
            "return_items": None,
            "return_payment_method_id": None,
        }
        self.return_calls = []
        self.found_user = False
        self.read_order = False
        self.messages = 0
        prompt = "You are a retail customer service agent. Authenticate users by email. Delivered orders can be returned; the refund goes to the original payment method or a gift card."
        if hint:
            prompt += (
                " Hint: order ids start with '#'; copy item ids and payment method ids character for character "
                "from get_order_details and get_user_details, and match each item by its options."
            )
        wanted = " and the ".join("%s %s" % (i["options"][option], product) for i in self.wanted)
        message = "Hello, my email is %s. I'd like to return the %s from order %s and get the refund on %s." % (
            self.email,
            wanted,
            self.order_id if level == 0 else self.order_id[1:],
            self.described,
        )
        return {"system_prompt": prompt, "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return {"observation": self._tool(action.get("name"), action.get("arguments") or {}), "done": False}
        self.messages += 1
        if self.return_calls or self.messages >= 3:
            return {"observation": "Great, thanks.", "done": True}
        return {"observation": "Yes, please go ahead with the return.", "done": False}

    def _tool(self, name, args):
        if name == "find_user_id_by_email":
            if args["email"] != self.email:
                return "Error: User not found"
            self.found_user = True
            return self.user_id
        if name == "get_user_details":
            if args["user_id"] != self.user_id:
                return "Error: User not found"
            return json.dumps(
                {
                    "user_id": self.user_id,
                    "name": {"first_name": self.first, "last_name": self.last},
                    "address": self.order["address"],
                    "email": self.email,
                    "payment_methods": self.payment_methods,
                    "orders": [self.order_id],
                }
            )
        if args["order_id"] != self.order_id:
            return "Error: Order not found"
        if name == "get_order_details":
            self.read_order = True
            return json.dumps(self.order)
        self.return_calls.append(dict(args))
        if self.order["status"] != "delivered":
            return "Error: Non-delivered order cannot be returned"
        method = args["payment_method_id"]
        if method not in self.payment_methods:
            return "Error: Payment method not found"
        if (
            self.payment_methods[method]["source"] != "gift_card"
            and method != self.order["payment_history"][0]["payment_method_id"]
        ):
            return "Error: Payment method should be the original payment method"
        ids = args["item_ids"] if isinstance(args["item_ids"], list) else []
        known = [i["item_id"] for i in self.order["items"]]
        if not ids or any(i not in known for i in ids):
            return "Error: Some item not found"
        self.order["status"] = "return requested"
        self.order["return_items"] = sorted(ids)
        self.order["return_payment_method_id"] = method
        return json.dumps(self.order)

    def reward(self):
        call = self.return_calls[-1] if self.return_calls else {}
        ids = call.get("item_ids") if isinstance(call.get("item_ids"), list) else []
        components = {
            "found_user": 1.0 if self.found_user else 0.0,
            "read_order": 1.0 if self.read_order else 0.0,
            "write_called": 1.0 if call else 0.0,
            "order_id_exact": 1.0 if call.get("order_id") == self.order_id else 0.0,
            "item_ids_exact": 1.0 if sorted(map(str, ids)) == sorted(i["item_id"] for i in self.wanted) else 0.0,
            "payment_method_exact": 1.0 if call.get("payment_method_id") == self.refund_to else 0.0,
        }
        weights = {
            "found_user": 0.1,
            "read_order": 0.1,
            "write_called": 0.1,
            "order_id_exact": 0.1,
            "item_ids_exact": 0.35,
            "payment_method_exact": 0.25,
        }
        reward = sum(weights[k] * v for k, v in components.items())
        return {"reward": round(reward, 4), "components": components, "reason": "graded on the last return call"}

    def oracle(self):
        return [
            {"type": "tool_call", "name": "find_user_id_by_email", "arguments": {"email": self.email}},
            {"type": "tool_call", "name": "get_user_details", "arguments": {"user_id": self.user_id}},
            {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": self.order_id}},
            {
                "type": "tool_call",
                "name": "return_delivered_order_items",
                "arguments": {
                    "order_id": self.order_id,
                    "item_ids": [i["item_id"] for i in self.wanted],
                    "payment_method_id": self.refund_to,
                },
            },
            {
                "type": "message",
                "content": "Your return has been requested; the refund will go to %s."
                % self.described.replace("my ", "your "),
            },
        ]
