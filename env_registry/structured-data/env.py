"""Transfer rationale: in tau2-retail most answers live inside nested JSON that
the agent must read across several calls (a user's order list, then each
order's items and payment history) and then aggregate exactly. Agents fail by
answering from the first record, skipping orders, or doing arithmetic in their
head. Here every question needs the user's whole order list, read with the
target's own tools and formats, and one exact aggregate, so the skill is the
same one the target rewards."""

import json
import random

TOOLS = ["find_user_id_by_name_zip", "get_user_details", "get_order_details", "calculate"]
LEVELS = 2  # 0: one or two orders to read; 1 (default): three to five
FIRST = ["Yusuf", "Mia", "Noah", "Aarav", "Olivia", "Lucas", "Fatima", "Chen", "Sofia", "Ivan", "Amara", "Mateo"]
LAST = ["Rossi", "Garcia", "Kim", "Patel", "Smith", "Novak", "Okafor", "Silva", "Muller", "Tanaka", "Haddad", "Lopez"]
PRODUCTS = {
    "Headphones": [("type", ["over-ear", "in-ear"]), ("color", ["black", "blue", "red"])],
    "Mechanical Keyboard": [("switch type", ["linear", "clicky", "tactile"]), ("size", ["full size", "80%"])],
    "Smart Thermostat": [("compatibility", ["Apple HomeKit", "Google Home"]), ("color", ["white", "black"])],
    "Water Bottle": [("capacity", ["500ml", "1000ml"]), ("material", ["glass", "stainless steel"])],
    "Desk Lamp": [("brightness", ["low", "high"]), ("power source", ["USB", "AC adapter"])],
    "Running Shoes": [("size", ["8", "9", "10"]), ("material", ["mesh", "leather"])],
}
STATUSES = ["pending", "processed", "delivered", "cancelled"]


class Environment:
    max_steps = 20

    def reset(self, seed, hint=False, level=1):
        rng = random.Random(seed)
        self.first, self.last = rng.choice(FIRST), rng.choice(LAST)
        self.zip = "%05d" % rng.randrange(10000, 99999)
        self.user_id = "%s_%s_%04d" % (self.first.lower(), self.last.lower(), rng.randrange(10000))
        card = "credit_card_%07d" % rng.randrange(10**7)
        self.payment = {
            card: {
                "source": "credit_card",
                "id": card,
                "brand": rng.choice(["visa", "mastercard"]),
                "last_four": "%04d" % rng.randrange(10**4),
            }
        }
        self.orders = {}
        for _ in range(rng.randint(3, 5) if level else rng.randint(1, 2)):
            order_id = "#W%07d" % rng.randrange(10**7)
            items = []
            for _ in range(rng.randint(1, 4)):
                name = rng.choice(sorted(PRODUCTS))
                options = {key: rng.choice(values) for key, values in PRODUCTS[name]}
                items.append(
                    {
                        "name": name,
                        "product_id": "%010d" % (sum(map(ord, name)) * 7919),
                        "item_id": "%010d" % rng.randrange(10**10),
                        "price": round(rng.uniform(10, 600), 2),
                        "options": options,
                    }
                )
            status = rng.choice(STATUSES)
            total = round(sum(i["price"] for i in items), 2)
            history = [{"transaction_type": "payment", "amount": total, "payment_method_id": card}]
            if status == "cancelled":
                history.append({"transaction_type": "refund", "amount": total, "payment_method_id": card})
            self.orders[order_id] = {
                "order_id": order_id,
                "user_id": self.user_id,
                "address": self._address(rng),
                "items": items,
                "status": status,
                "fulfillments": [],
                "payment_history": history,
                "cancel_reason": "no longer needed" if status == "cancelled" else None,
                # the other fields tau2's Order has, as tau2 writes them (None as null)
                "exchange_items": None,
                "exchange_new_items": None,
                "exchange_payment_method_id": None,
                "exchange_price_difference": None,
                "return_items": None,
                "return_payment_method_id": None,
            }
        self.kind = rng.choice(["delivered_total", "priciest_item", "count_product"])
        if self.kind == "delivered_total" and not any(o["status"] == "delivered" for o in self.orders.values()):
            next(iter(self.orders.values()))["status"] = "delivered"
        if self.kind == "count_product":
            self.product = rng.choice(sorted({i["name"] for o in self.orders.values() for i in o["items"]}))
        self.found_user = False
        self.read = set()
        self.answer = None
        self.messages = 0
        prompt = (
            "You are a retail customer service agent. Authenticate the user by name and zip code, "
            "then answer their question from the store's records using the tools."
        )
        if hint:
            prompt += (
                " Hint: questions about several orders need every order: list them with get_user_details, "
                "read each with get_order_details, and use calculate for sums before you answer."
            )
        return {
            "system_prompt": prompt,
            "user_message": "Hi, I'm %s %s, zip code %s. %s" % (self.first, self.last, self.zip, self._question()),
        }

    def _address(self, rng):
        return {
            "address1": "%d %s"
            % (rng.randrange(1, 999), rng.choice(["Broadway", "Elm Street", "Oak Avenue", "Main Street"])),
            "address2": "Suite %d" % rng.randrange(100, 999),
            "city": rng.choice(["Philadelphia", "Austin", "Denver", "Seattle"]),
            "country": "USA",
            "state": rng.choice(["PA", "TX", "CO", "WA"]),
            "zip": self.zip,
        }

    def _question(self):
        if self.kind == "delivered_total":
            return "How much did I pay in total for all my orders that have been delivered?"
        if self.kind == "priciest_item":
            return "Which of my orders contains my single most expensive item, and what is that item?"
        return "How many %s items have I ordered in total, across all my orders?" % self.product

    def _truth(self):
        if self.kind == "delivered_total":
            return round(
                sum(o["payment_history"][0]["amount"] for o in self.orders.values() if o["status"] == "delivered"), 2
            )
        if self.kind == "priciest_item":
            order, item = max(
                ((o, i) for o in self.orders.values() for i in o["items"]), key=lambda pair: pair[1]["price"]
            )
            return (order["order_id"], item["name"])
        return sum(1 for o in self.orders.values() for i in o["items"] if i["name"] == self.product)

    def step(self, action):
        if action.get("type") == "tool_call":
            return {"observation": self._tool(action.get("name"), action.get("arguments") or {}), "done": False}
        self.messages += 1
        text = str(action.get("content", ""))
        if any(ch.isdigit() for ch in text) or self.messages >= 3:
            self.answer = text
            return {"observation": "Thanks, that's all I needed.", "done": True}
        return {"observation": "Please look it up and tell me the answer.", "done": False}

    def _tool(self, name, args):
        if name == "find_user_id_by_name_zip":
            match = (str(args["first_name"]).lower(), str(args["last_name"]).lower(), str(args["zip"])) == (
                self.first.lower(),
                self.last.lower(),
                self.zip,
            )
            if not match:
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
                    "address": next(iter(self.orders.values()))["address"],
                    "email": "%s.%s@example.com" % (self.first.lower(), self.last.lower()),
                    "payment_methods": self.payment,
                    "orders": list(self.orders),
                }
            )
        if name == "get_order_details":
            order = self.orders.get(args["order_id"]) if isinstance(args["order_id"], str) else None
            if order is None:
                return "Error: Order not found"
            self.read.add(order["order_id"])
            return json.dumps(order)
        return calculate(str(args["expression"]))

    def reward(self):
        truth = self._truth()
        text = (self.answer or "").replace(",", "")
        if self.kind == "delivered_total":
            correct = any(abs(value - truth) < 0.011 for value in numbers(text))
        elif self.kind == "priciest_item":
            correct = truth[0] in text and truth[1].lower() in text.lower()
        else:
            correct = truth in [int(v) for v in numbers(text) if v == int(v)]
        components = {
            "found_user": 1.0 if self.found_user else 0.0,
            "read_orders": len(self.read) / len(self.orders),
            "correct_answer": 1.0 if correct else 0.0,
        }
        reward = 0.15 * components["found_user"] + 0.35 * components["read_orders"] + 0.5 * components["correct_answer"]
        return {"reward": round(reward, 4), "components": components, "reason": "%s; expected %s" % (self.kind, truth)}

    def oracle(self):
        actions = [
            {
                "type": "tool_call",
                "name": "find_user_id_by_name_zip",
                "arguments": {"first_name": self.first, "last_name": self.last, "zip": self.zip},
            },
            {"type": "tool_call", "name": "get_user_details", "arguments": {"user_id": self.user_id}},
        ]
        actions += [
            {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": o}} for o in self.orders
        ]
        truth = self._truth()
        if self.kind == "delivered_total":
            amounts = [
                str(o["payment_history"][0]["amount"]) for o in self.orders.values() if o["status"] == "delivered"
            ]
            actions.append({"type": "tool_call", "name": "calculate", "arguments": {"expression": " + ".join(amounts)}})
            answer = "You paid %.2f in total for your delivered orders." % truth
        elif self.kind == "priciest_item":
            answer = "Order %s contains your most expensive item, the %s." % truth
        else:
            answer = "You have ordered %d %s items in total." % (truth, self.product)
        return actions + [{"type": "message", "content": answer}]


def numbers(text):
    out, current = [], ""
    for ch in text + " ":
        if ch.isdigit() or (ch == "." and current and "." not in current):
            current += ch
        else:
            if current.strip("."):
                out.append(float(current.strip(".")))
            current = ""
    return out


def calculate(expression):
    """tau2's calculate: + - * / and parentheses on numbers, rounded to 2 places."""
    tokens, i = [], 0
    expression = expression.replace(" ", "")
    if not expression or any(ch not in "0123456789.+-*/()" for ch in expression):
        return "Error: Invalid characters in expression"
    while i < len(expression):
        if expression[i] in "+-*/()":
            tokens.append(expression[i])
            i += 1
        else:
            j = i
            while j < len(expression) and (expression[j].isdigit() or expression[j] == "."):
                j += 1
            tokens.append(float(expression[i:j]))
            i = j
    try:
        value, rest = _sum(tokens)
        if rest:
            raise ValueError("trailing tokens")
    except (ValueError, IndexError, ZeroDivisionError) as exc:
        return "Error: %s" % exc
    return str(round(value, 2))


def _sum(tokens):
    value, tokens = _product(tokens)
    while tokens and tokens[0] in ("+", "-"):
        op, (rhs, tokens) = tokens[0], _product(tokens[1:])
        value = value + rhs if op == "+" else value - rhs
    return value, tokens


def _product(tokens):
    value, tokens = _atom(tokens)
    while tokens and tokens[0] in ("*", "/"):
        op, (rhs, tokens) = tokens[0], _atom(tokens[1:])
        value = value * rhs if op == "*" else value / rhs
    return value, tokens


def _atom(tokens):
    head = tokens[0]
    if head == "(":
        value, rest = _sum(tokens[1:])
        if not rest or rest[0] != ")":
            raise ValueError("unbalanced parentheses")
        return value, rest[1:]
    if head == "-":
        value, rest = _atom(tokens[1:])
        return -value, rest
    if isinstance(head, float):
        return head, tokens[1:]
    raise ValueError("unexpected token %r" % head)
