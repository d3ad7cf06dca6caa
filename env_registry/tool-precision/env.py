"""Transfer rationale: tau2-retail's writes take exact ids, compared exactly, while users describe things loosely
('order W1234567', 'the blue headphones', 'my visa card'). Here look-alike items and payment methods abound."""

import random
import world

TOOLS = ["find_user_id_by_email", "get_user_details", "get_order_details", "return_delivered_order_items"]
LEVELS = 3  # 0: one item, the '#' given, the original method; 1 (default): look-alikes; 2: all look-alikes, two items
PROMPT = ("You are a retail customer service agent. Authenticate users by email. Delivered orders can be returned; "
          "the refund goes to the original payment method or a gift card.")  # fmt: skip
HINT = (" Hint: order ids start with '#'; copy item ids and payment method ids character for character from "
        "get_order_details and get_user_details, and match each item by its options.")  # fmt: skip
WEIGHTS = {"found_user": 0.1, "read_order": 0.1, "write_called": 0.1, "order_id_exact": 0.1, "item_ids_exact": 0.35,
           "payment_method_id_exact": 0.25}  # fmt: skip
ASK = "Hello, my email is %s. I'd like to return the %s from order %s and get the refund on %s."
SAID = {"credit_card": "my {brand} card", "paypal": "my PayPal", "gift_card": "my gift card"}  # as the user says it


class Environment:
    max_steps = 15

    def reset(self, seed, hint=False, level=1):
        rng, self.log, self.messages, products = random.Random(seed), [], 0, world.retail_products()
        self.user = world.retail_user(rng.randrange(2**31))
        card, gift, paypal = [self.user["payment_methods"][k] for k in sorted(self.user["payment_methods"])]
        original = rng.choice([card, paypal])
        refund_to = rng.choice([original, gift]) if level else original
        product, other = rng.sample(sorted(products), 2)  # the look-alikes' product, and one other item's
        option, values = products[product]
        picked = [(product, v) for v in rng.sample(values, [1, rng.randint(2, len(values)), len(values)][level])]
        items = [world.retail_item(rng.randrange(2**31), p, v) for p, v in picked + [(other, None)]]
        rng.shuffle(items)
        wanted = [i for i in items if i["name"] == product][: [1, rng.randint(1, 2), 2][level]]
        self.order = world.retail_order(rng.randrange(2**31), self.user, items, "delivered", original["id"])
        args = dict(order_id=self.order["order_id"], item_ids=sorted(i["item_id"] for i in wanted))
        self.write = (TOOLS[3], dict(args, payment_method_id=refund_to["id"]))
        self.described = SAID[refund_to["source"]].format(**refund_to)
        asked = " and the ".join("%s %s" % (i["options"][option], product) for i in wanted)
        message = ASK % (self.user["email"], asked, self.order["order_id"][1 if level else 0 :], self.described)
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], [self.order], action)
        self.messages += 1
        done = bool(world.called(self.log, TOOLS[3], ok=None)) or self.messages >= 3  # a return tried
        return {"observation": "Great, thanks." if done else "Yes, please go ahead with the return.", "done": done}

    def reward(self):  # graded on the last return tried, gone through or not
        call = (world.called(self.log, TOOLS[3], ok=None) or [{}])[-1]
        got = dict(call, item_ids=sorted(map(str, call["item_ids"])) if isinstance(call.get("item_ids"), list) else [])
        parts = {k + "_exact": got.get(k) == v for k, v in self.write[1].items()}  # each argument of the right return
        read = bool(world.called(self.log, TOOLS[2]))
        parts.update(found_user=world.logged_in(self.log), read_order=read, write_called=bool(call))
        return world.graded(parts, WEIGHTS, "graded on the last return call")

    def oracle(self):
        reads = [(TOOLS[1], {"user_id": self.user["user_id"]}), (TOOLS[2], {"order_id": self.order["order_id"]})]
        done = "Your return has been requested; the refund goes to %s." % self.described.replace("my ", "your ")
        return world.script(world.retail_login(self.user, "email"), *reads, self.write, done)
