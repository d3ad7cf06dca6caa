"""Transfer rationale: in tau2-retail most answers live inside nested JSON that the agent must read across several
calls (a user's order list, then each order's items and payment history) and then aggregate exactly. Agents fail by
answering from the first record, skipping orders, or doing arithmetic in their head. Here every question needs the
user's whole order list, read with the target's own tools and formats, and one exact aggregate."""

import random
import re
import world

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "calculate"]
LEVELS = 2  # 0: one or two orders to read; 1 (default): three to five
PROMPT = ("You are a retail customer service agent. Authenticate the user by name and zip code, then answer their "
          "question from the store's records using the tools.")
HINT = (" Hint: questions about several orders need every order: list them with get_user_details, read each with "
        "get_order_details, and use calculate for sums before you answer.")
ASK = {"delivered_total": "How much did I pay in total for all my orders that have been delivered?",
       "priciest_item": "Which of my orders contains my single most expensive item, and what is that item?",
       "count_product": "How many %s items have I ordered in total, across all my orders?"}
WEIGHTS = {"found_user": 0.15, "read_orders": 0.35, "correct_answer": 0.5}
SAY = {"delivered_total": "You paid %.2f in total for your delivered orders.",
       "priciest_item": "Order %s contains your most expensive item, the %s.",
       "count_product": "You have ordered %d {product} items in total."}


class Environment:
    max_steps = 20

    def reset(self, seed, hint=False, level=1):
        rng = random.Random(seed)
        self.user = world.retail_user(rng.randrange(2**31), payment=["credit_card"])
        stock, self.orders, self.kind = world.retail_stock(), [], rng.choice(sorted(ASK))
        count = rng.randint(1, 2) if level == 0 else rng.randint(3, 5)
        statuses = rng.choices(["pending", "processed", "delivered", "cancelled"], k=count)
        statuses[0] = "delivered" if self.kind == "delivered_total" and "delivered" not in statuses else statuses[0]
        for status in statuses:
            items = rng.sample(stock, rng.randint(1, 4))
            self.orders.append(world.retail_order(rng.randrange(2**31), self.user, items, status))
        self.product = rng.choice(sorted({i["name"] for o in self.orders for i in o["items"]}))
        self.log, self.answer, self.messages = [], "", 0
        message = "Hi, I'm {first_name} {last_name}, zip code {zip}. ".format(**world.retail_login(self.user)[1])
        message += ASK[self.kind].replace("%s", self.product)
        return {"system_prompt": PROMPT + (HINT if hint else ""), "user_message": message}

    def truth(self):
        if self.kind == "delivered_total":
            return round(sum(o["payment_history"][0]["amount"] for o in self.orders if o["status"] == "delivered"), 2)
        if self.kind == "priciest_item":  # every order holding an item at the top price (the kit's items repeat)
            top = max(i["price"] for o in self.orders for i in o["items"])
            return sorted((o["order_id"], i["name"]) for o in self.orders for i in o["items"] if i["price"] == top)
        return sum(i["name"] == self.product for o in self.orders for i in o["items"])

    def step(self, action):
        if action.get("type") == "tool_call":
            return world.retail_step(self.log, [self.user], self.orders, action)
        self.messages, text = self.messages + 1, str(action.get("content", ""))
        if any(ch.isdigit() for ch in text) or self.messages >= 3:
            self.answer = text
            return {"observation": "Thanks, that's all I needed.", "done": True}
        return {"observation": "Please look it up and tell me the answer.", "done": False}

    def reward(self):
        truth, numbers = self.truth(), [float(n) for n in re.findall(r"\d+(?:\.\d+)?", self.answer.replace(",", ""))]
        if self.kind == "priciest_item":
            correct = any(order in self.answer and item.lower() in self.answer.lower() for order, item in truth)
        else:
            correct = any(abs(n - truth) < 0.011 for n in numbers)
        read = {a["order_id"] for a in world.called(self.log, "get_order_details")}
        found = world.called(self.log, "find_user_id_by_name_zip")
        parts = {"found_user": bool(found), "read_orders": len(read) / len(self.orders), "correct_answer": correct}
        return world.graded(parts, WEIGHTS, "%s; expected %s" % (self.kind, truth))

    def oracle(self):
        truth = self.truth()
        calls = [world.retail_login(self.user), ("get_user_details", {"user_id": self.user["user_id"]})]
        calls += [("get_order_details", {"order_id": o["order_id"]}) for o in self.orders]
        amounts = [str(o["payment_history"][0]["amount"]) for o in self.orders if o["status"] == "delivered"]
        calls += [("calculate", {"expression": " + ".join(amounts)})] if self.kind == "delivered_total" else []
        say = SAY[self.kind].replace("{product}", self.product) % (truth[0] if self.kind == "priciest_item" else truth)
        return world.script(*calls, say)
