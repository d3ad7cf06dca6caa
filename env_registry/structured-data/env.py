"""Transfer rationale: in tau2-retail most answers live in nested JSON read across several calls (a user's order
list, then each order) and aggregated exactly. Here every question needs the whole order list and one exact figure."""

import random
import world

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "calculate"]
LEVELS = 2  # 0: one or two orders to read; 1 (default): three to five
PROMPT = ("You are a retail customer service agent. Authenticate the user by name and zip code, then answer their "
          "question from the store's records using the tools.")  # fmt: skip
HINT = (" Hint: questions about several orders need every order: list them with get_user_details, read each with "
        "get_order_details, and use calculate for sums before you answer.")  # fmt: skip
ASK = {"delivered_total": "How much did I pay in total for all my orders that have been delivered?",
       "priciest_item": "Which of my orders contains my single most expensive item, and what is that item?",
       "count_product": "How many {product} items have I ordered in total, across all my orders?"}  # fmt: skip
SAY = {"delivered_total": "You paid %.2f in total.", "priciest_item": "Order %s: the %s.", "count_product": "%d."}
WEIGHTS = {"found_user": 0.15, "read_orders": 0.35, "correct_answer": 0.5}


class Environment:
    max_steps = 20

    def reset(self, seed, hint=False, level=1):
        rng, self.log, self.answer, self.messages = random.Random(seed), [], "", 0
        self.user, self.kind = world.retail_user(rng.randrange(2**31), payment=["credit_card"]), rng.choice(sorted(ASK))
        count = rng.randint(1, 2) if level == 0 else rng.randint(3, 5)
        statuses = rng.choices(["pending", "processed", "delivered", "cancelled"], k=count)
        statuses[0] = "delivered" if self.kind == "delivered_total" and "delivered" not in statuses else statuses[0]
        self.orders = world.retail_orders(rng.randrange(2**31), self.user, statuses, items=(1, 4))
        self.product = rng.choice(sorted({i["name"] for o in self.orders for i in o["items"]}))
        items = [(o["order_id"], i["name"], i["price"]) for o in self.orders for i in o["items"]]
        self.paid = [o["payment_history"][0]["amount"] for o in self.orders if o["status"] == "delivered"]
        priciest = sorted(i[:2] for i in items if i[2] == max(p for _, _, p in items))  # orders with a top-price item
        total, bought = round(sum(self.paid), 2), [name for _, name, _ in items].count(self.product)
        self.truth = dict(delivered_total=total, priciest_item=priciest, count_product=bought)[self.kind]
        hello = "Hi, I'm {first_name} {last_name}, zip code {zip}. " + ASK[self.kind]
        message = hello.format(product=self.product, **world.retail_login(self.user)[1])
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], self.orders, action)
        self.messages, self.answer = self.messages + 1, str(action.get("content", ""))
        done = any(ch.isdigit() for ch in self.answer) or self.messages >= 3  # an answer holds a figure or an order id
        return {"observation": "Thanks, that's all I needed." if done else "Please look it up for me.", "done": done}

    def reward(self):
        if self.kind == "priciest_item":  # an order holding a top-price item, and that item, named
            correct = any(order in self.answer and item.lower() in self.answer.lower() for order, item in self.truth)
        else:  # the figure, to the cent
            correct = any(abs(n - self.truth) < 0.011 for n in world.figures(self.answer))
        read = len({o["order_id"] for o in self.orders}.intersection(world.read_ids(self.log))) / len(self.orders)
        parts = {"found_user": world.logged_in(self.log), "read_orders": read, "correct_answer": correct}
        return world.graded(parts, WEIGHTS, "%s; expected %s" % (self.kind, self.truth))

    def oracle(self):
        calls = [world.retail_login(self.user), (TOOLS[1], {"user_id": self.user["user_id"]})]
        calls += [(TOOLS[2], {"order_id": o["order_id"]}) for o in self.orders]
        calls += [(TOOLS[3], {"expression": " + ".join(map(str, self.paid))})] if self.kind == "delivered_total" else []
        return world.script(*calls, SAY[self.kind] % (self.truth[0] if self.kind == "priciest_item" else self.truth))
