"""Transfer rationale: tau2-retail's write tools take exact identifiers (order ids with their '#', 10-digit item ids,
payment method ids such as 'credit_card_1234567') and its evaluator compares the resulting database exactly, so a
near-miss argument is a failed task. Users describe things loosely ('order W1234567', 'the blue headphones', 'my
Visa'), and the agent must map those descriptions to the exact ids found in tool output. Here an order holds
look-alike items (same product, other options) and the user has several payment methods, so only exact reading and
copying succeeds."""

import random
import world

TOOLS = ["find_user_id_by_email", "get_user_details", "get_order_details", "return_delivered_order_items"]
LEVELS = 3  # 0: one item, the '#' given, refund to the original method; 1 (default): look-alikes; 2: every look-alike, two items
PROMPT = ("You are a retail customer service agent. Authenticate users by email. Delivered orders can be returned; "
          "the refund goes to the original payment method or a gift card.")
HINT = (" Hint: order ids start with '#'; copy item ids and payment method ids character for character from "
        "get_order_details and get_user_details, and match each item by its options.")
WEIGHTS = {"found_user": 0.1, "read_order": 0.1, "write_called": 0.1, "order_id_exact": 0.1, "item_ids_exact": 0.35,
           "payment_method_exact": 0.25}


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False, level=1):
        rng = random.Random(seed)
        self.user = world.retail_user(rng.randrange(2**31))
        card, gift, paypal = sorted(self.user["payment_methods"])
        original = rng.choice([card, paypal])
        self.refund_to = rng.choice([original, gift]) if level else original
        products = world.retail_products()
        product = rng.choice(sorted(products))
        option, values = products[product]
        other = rng.choice([p for p in sorted(products) if p != product])
        picked = rng.sample(values, [1, rng.randint(2, len(values)), len(values)][level])
        items = [world.retail_item(rng.randrange(2**31), product, v) for v in picked]
        items.append(world.retail_item(rng.randrange(2**31), other))
        rng.shuffle(items)
        self.wanted = [i for i in items if i["name"] == product][: [1, rng.randint(1, 2), 2][level]]
        self.order = world.retail_order(rng.randrange(2**31), self.user, items, "delivered", original)
        self.log, self.messages = [], 0
        method = self.user["payment_methods"][self.refund_to]
        self.described = {"credit_card": "my %s card" % method.get("brand", "").capitalize(), "paypal": "my PayPal",
                          "gift_card": "my gift card"}[method["source"]]
        wanted = " and the ".join("%s %s" % (i["options"][option], product) for i in self.wanted)
        order_id = self.order["order_id"] if level == 0 else self.order["order_id"][1:]
        message = "Hello, my email is %s. I'd like to return the %s from order %s and get the refund on %s." % (
            self.user["email"], wanted, order_id, self.described)
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], [self.order], action)
        self.messages += 1
        if world.called(self.log, "return_delivered_order_items", ok=None) or self.messages >= 3:
            return {"observation": "Great, thanks.", "done": True}
        return {"observation": "Yes, please go ahead with the return.", "done": False}

    def reward(self):
        call = (world.called(self.log, "return_delivered_order_items", ok=None) or [{}])[-1]  # tried: through or not
        ids = call.get("item_ids") if isinstance(call.get("item_ids"), list) else []
        found, read = world.called(self.log, "find_user_id_by_email"), world.called(self.log, "get_order_details")
        parts = {"found_user": bool(found), "read_order": bool(read), "write_called": bool(call),
                 "order_id_exact": call.get("order_id") == self.order["order_id"],
                 "item_ids_exact": sorted(map(str, ids)) == sorted(i["item_id"] for i in self.wanted),
                 "payment_method_exact": call.get("payment_method_id") == self.refund_to}
        return world.graded(parts, WEIGHTS, "graded on the last return call")

    def oracle(self):
        user, order_id, items = self.user, self.order["order_id"], [i["item_id"] for i in self.wanted]
        calls = [world.retail_login(user, "email"), (TOOLS[1], {"user_id": user["user_id"]}),
                 (TOOLS[2], {"order_id": order_id}),
                 (TOOLS[3], {"order_id": order_id, "item_ids": items, "payment_method_id": self.refund_to})]
        done = "Your return has been requested; the refund will go to %s." % self.described.replace("my ", "your ")
        return world.script(*calls, done)
