"""The world kit: target-shaped records and the target's own answers, for env code.

Runs inside the jail beside the worker, as an allowed module (``import world``;
``language.MODULES`` lists what env code may call). An env states its scenario,
its reward and its oracle; the kit builds the records the target's tools return,
with every field the target writes, and answers the target's tools over them as
the target does (its checks, its changes, its error texts). What it hands env
code is plain JSON data only (dicts, lists, strings, numbers), never an object
of its own, so it adds nothing to what the language layer must guard.

τ²-retail (``retail_*``): a customer with payment methods, orders of items, and
``retail_answer`` for the read tools, ``calculate``, and the return, cancel and
modify-address and -payment write tools (``RETAIL_TOOLS``), checked call by
call against tau2-bench's own ``RetailTools`` by the test suite.

τ²-airline (``airline_*``): a traveller with payment methods and saved
passengers, flights with a status per date, reservations of them, and
``airline_answer`` for the read tools, ``calculate``, the cancel, baggage,
passenger and certificate write tools (``AIRLINE_TOOLS``), checked against
``AirlineTools`` the same way; booking and changing flights it leaves to the
env. For both targets, a value of the
wrong JSON type gets Python's own error where tau2's pydantic would word it its
way; so does a malformed expression, which tau2 hands to ``eval`` (the kit
walks Python's parse of it instead, and refuses ``**``, which tau2 computes).

Standard library only, like the worker.
"""

import ast
import json
import operator
import random
import re
import types

FIRST = ["Yusuf", "Mia", "Noah", "Aarav", "Olivia", "Lucas", "Fatima", "Chen", "Sofia", "Ivan", "Amara", "Mateo"]
LAST = ["Rossi", "Garcia", "Kim", "Patel", "Smith", "Novak", "Okafor", "Silva", "Muller", "Tanaka", "Haddad", "Lopez"]
STREETS = ["Oak Avenue", "Maple Drive", "Cedar Lane", "Elm Street", "Pine Road", "Lake View"]
CITIES = [("Denver", "CO"), ("Austin", "TX"), ("Seattle", "WA"), ("Columbus", "OH"), ("Phoenix", "AZ")]
PRODUCTS = {
    "Headphones": ("color", ["black", "blue", "red", "white"]),
    "T-Shirt": ("size", ["S", "M", "L", "XL"]),
    "Water Bottle": ("capacity", ["500ml", "750ml", "1000ml"]),
    "Sneakers": ("size", ["8", "9", "10", "11"]),
    "Desk Lamp": ("color", ["black", "silver", "white"]),
    "Backpack": ("color", ["black", "green", "grey"]),
    "Yoga Mat": ("thickness", ["4mm", "6mm", "8mm"]),
    "Coffee Maker": ("capacity", ["4 cups", "8 cups", "12 cups"]),
}
PAYMENT_SOURCES = ("credit_card", "paypal", "gift_card")
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
ORDER_STATUSES = ("pending", "processed", "delivered", "cancelled", "return requested")
# read-only: env code shares the kit's module across resets
CANCEL_SAID = types.MappingProxyType(
    {"no longer needed": "I don't need it anymore", "ordered by mistake": "I ordered it by mistake"}
)


def _seeded(seed):
    if type(seed) is not int:
        raise TypeError("world: a seed is an int (draw one with rng.randrange(2**31))")
    return random.Random(seed)


def _digits(rng, n):
    return "%0*d" % (n, rng.randrange(10**n))


def _id(text, n=10):
    """A stable id of ``n`` digits for a name: the same product or option is the same id in every order."""
    value = 0
    for ch in text:
        value = (value * 131 + ord(ch)) % 10**n
    return "%0*d" % (n, value)


def _payment_methods(rng, payment, sources, funds):
    """One payment method per source in ``payment`` (each one of ``sources``), keyed by id:
    a card's brand and last four digits, or what ``funds(rng, source)`` puts on it."""
    methods = {}
    for source in payment:
        if source not in sources:
            raise ValueError("world: payment sources are %s" % ", ".join(sources))
        method = {"source": source, "id": "%s_%s" % (source, _digits(rng, 7))}
        if source == "credit_card":
            method.update(brand=rng.choice(["visa", "mastercard"]), last_four=_digits(rng, 4))
        else:
            method.update(funds(rng, source))
        methods[method["id"]] = method
    return methods


def _retail_funds(rng, source):
    return {"balance": round(rng.uniform(0, 200), 2)} if source == "gift_card" else {}


def _airline_funds(rng, source):
    return {"amount": float(rng.choice([50, 100, 150, 250]) if source == "certificate" else rng.randrange(300))}


def retail_products():
    """The products the kit sells: {name: (option, [values])}, a fresh copy."""
    return {name: (kind, list(values)) for name, (kind, values) in PRODUCTS.items()}


def retail_stock():
    """Every item the kit sells, one ``retail_item`` per product and option value."""
    return [retail_item(0, product, value) for product, (_, values) in sorted(PRODUCTS.items()) for value in values]


def retail_address(seed):
    """A τ²-retail address (UserAddress: address1, address2, city, country, state, zip)."""
    rng = _seeded(seed)
    city, state = rng.choice(CITIES)
    return {
        "address1": "%d %s" % (rng.randrange(1, 999), rng.choice(STREETS)),
        "address2": rng.choice(["", "Suite %d" % rng.randrange(100, 999)]),
        "city": city,
        "country": "USA",
        "state": state,
        "zip": _digits(rng, 5),
    }


def retail_user(seed, payment=PAYMENT_SOURCES):
    """A τ²-retail User: name, address, email, one payment method per source in
    ``payment`` (credit_card, paypal, gift_card) and, so far, no orders."""
    rng = _seeded(seed)
    first, last = rng.choice(FIRST), rng.choice(LAST)
    methods = _payment_methods(rng, payment, PAYMENT_SOURCES, _retail_funds)
    return {
        "user_id": "%s_%s_%s" % (first.lower(), last.lower(), _digits(rng, 4)),
        "name": {"first_name": first, "last_name": last},
        "address": retail_address(rng.randrange(2**31)),
        "email": "%s.%s%s@example.com" % (first.lower(), last.lower(), _digits(rng, 4)),
        "payment_methods": methods,
        "orders": [],
    }


def retail_item(seed, product=None, option=None):
    """A τ²-retail OrderItem of ``product`` (a name from ``retail_products()``, drawn when None)
    with its option set to ``option`` (drawn when None). One product has one
    product_id; each option value is its own item_id, at one price in every order."""
    rng = _seeded(seed)
    product = product if product is not None else rng.choice(sorted(PRODUCTS))
    if product not in PRODUCTS:
        raise ValueError("world: products are %s" % ", ".join(sorted(PRODUCTS)))
    kind, values = PRODUCTS[product]
    value = option if option is not None else rng.choice(values)
    if value not in values:
        raise ValueError("world: %s comes in %s %s" % (product, kind, ", ".join(values)))
    return {
        "name": product,
        "product_id": _id(product),
        "item_id": _id(product + "/" + value),
        "price": round(15 + int(_id(product + "/" + value + "/price", 5)) % 28500 / 100, 2),  # one price per item
        "options": {kind: value},
    }


def retail_order(seed, user, items, status="delivered", paid_with=None):
    """A τ²-retail Order of ``user`` for ``items`` (``retail_item`` records), with every
    field tau2's Order has (unset ones as null), paid in full with ``paid_with`` (a
    payment method id of the user; its first one when None). The order id is added
    to ``user["orders"]``. A cancelled order is a pending one cancelled as tau2
    cancels it: reason 'no longer needed', every payment refunded."""
    rng = _seeded(seed)
    paid_with = paid_with if paid_with is not None else sorted(user["payment_methods"])[0]
    if paid_with not in user["payment_methods"]:
        raise ValueError("world: %s is not a payment method of the user" % paid_with)
    order = {
        "order_id": "#W%s" % _digits(rng, 7),
        "user_id": user["user_id"],
        "address": dict(user["address"]),
        "items": [dict(item, options=dict(item["options"])) for item in items],
        "status": status,
        "fulfillments": [],
        "payment_history": [
            {
                "transaction_type": "payment",
                "amount": round(sum(item["price"] for item in items), 2),
                "payment_method_id": paid_with,
            }
        ],
        "cancel_reason": None,
        "exchange_items": None,
        "exchange_new_items": None,
        "exchange_payment_method_id": None,
        "exchange_price_difference": None,
        "return_items": None,
        "return_payment_method_id": None,
    }
    if status not in ("pending", "cancelled"):  # shipped: one parcel with every item
        order["fulfillments"] = [{"tracking_id": [_digits(rng, 12)], "item_ids": [i["item_id"] for i in items]}]
    user["orders"].append(order["order_id"])
    if status == "cancelled":
        order["status"] = "pending"
        _retail_call(
            [user], [order], "cancel_pending_order", {"order_id": order["order_id"], "reason": CANCEL_REASONS[0]}
        )
    return order


def retail_orders(seed, user, statuses, paid_with=None, items=(1, 1)):
    """One ``retail_order`` of ``user`` per status in ``statuses`` (a list of strings), in
    that order, each paid with ``paid_with`` and holding between ``items[0]`` and
    ``items[1]`` distinct items of ``retail_stock()``, drawn."""
    rng, stock = _seeded(seed), retail_stock()
    for status in statuses:
        if status not in ORDER_STATUSES:
            raise ValueError("world: an order's status is one of %s, got %r" % (", ".join(ORDER_STATUSES), status))
    low, high = items
    if not 1 <= low <= high <= len(stock):
        raise ValueError("world: items is (fewest, most), 1 <= fewest <= most <= %d" % len(stock))
    return [
        retail_order(rng.randrange(2**31), user, rng.sample(stock, rng.randint(low, high)), s, paid_with)
        for s in statuses
    ]


RETAIL_TOOLS = (
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_user_details",
    "get_order_details",
    "return_delivered_order_items",
    "cancel_pending_order",
    "modify_pending_order_address",
    "modify_pending_order_payment",
    "modify_user_address",
    "calculate",
)
ADDRESS_FIELDS = ("address1", "address2", "city", "country", "state", "zip")


def retail_answer(users, orders, name, arguments):
    """τ²-retail's answer to the call ``name(**arguments)`` over ``users`` and
    ``orders`` (lists of ``retail_user`` and ``retail_order`` records), as the
    target's tool message reads: the record as JSON, an id, or ``Error: <why>`` in
    tau2's words. A write changes the records (an order, a user's address, a gift
    card's balance) as tau2 does. None for a tool the kit does not play
    (``RETAIL_TOOLS`` lists those it does)."""
    return _answer(_retail_call, (users, orders), name, arguments)


def _answer(call, records, name, arguments):
    try:
        result = call(*records, name, arguments)
    except ValueError as exc:
        return "Error: %s" % exc
    return result if result is None or isinstance(result, str) else json.dumps(result)


RETAIL_ID_LISTS = ("item_ids", "new_item_ids")  # the retail arguments that are JSON arrays (of strings)


def retail_typed(arguments):
    """Whether every argument of a retail call has the JSON type τ²-retail's schemas give it:
    an array of strings for ``RETAIL_ID_LISTS``, a string for every other argument."""
    return all(
        isinstance(v, list) and all(isinstance(i, str) for i in v) if k in RETAIL_ID_LISTS else isinstance(v, str)
        for k, v in arguments.items()
    )


def retail_made(users, orders, writes):
    """Per write in ``writes`` (``(name, arguments)`` pairs, as ``script`` takes them),
    whether the records hold what it makes: the order cancelled with that reason, or
    still open (not cancelled) and shipping to that address or paid with that method,
    or returned with those items to that method; the user at that address. False for
    a read, an unknown id or a tool the kit does not play."""
    made = []
    for write in writes:
        if not isinstance(write, (list, tuple)) or len(write) != 2:
            raise ValueError("world: each write is a (name, arguments) pair, got %r" % (write,))
        made.append(_made(users, orders, write[0], write[1] if isinstance(write[1], dict) else {}))
    return made


def _made(users, orders, name, arguments):
    order_id, user_id = arguments.get("order_id"), arguments.get("user_id")
    order = {o["order_id"]: o for o in orders}.get(order_id) if isinstance(order_id, str) else None
    user = {u["user_id"]: u for u in users}.get(user_id) if isinstance(user_id, str) else None
    address = {field: arguments.get(field) for field in ADDRESS_FIELDS}
    if name == "modify_user_address":
        return user is not None and user["address"] == address
    if order is None:
        return False
    if name == "cancel_pending_order":
        return order["status"] == "cancelled" and order["cancel_reason"] == arguments.get("reason")
    if order["status"] == "cancelled":  # a change to an order cancelled since is not in the final records
        return False
    if name == "modify_pending_order_address":
        return order["address"] == address
    if name == "modify_pending_order_payment":
        paid = [p["payment_method_id"] for p in order["payment_history"][1:] if p["transaction_type"] == "payment"]
        return arguments.get("payment_method_id") in paid
    if name == "return_delivered_order_items":
        items = arguments.get("item_ids")
        return (
            order["status"] == "return requested"
            and isinstance(items, (list, tuple))
            and order["return_items"] == sorted(items, key=str)
            and order["return_payment_method_id"] == arguments.get("payment_method_id")
        )
    return False


def retail_login(user, by="name_zip"):
    """The call that authenticates ``user``, as (tool, arguments): find_user_id_by_name_zip
    with {first_name, last_name, zip}, or with ``by="email"`` find_user_id_by_email with
    {email}. The arguments also fill a greeting: "I'm {first_name} {last_name}".format(**arguments)."""
    if by == "email":
        return "find_user_id_by_email", {"email": user["email"]}
    if by != "name_zip":
        raise ValueError("world: a user logs in by 'name_zip' or 'email'")
    return "find_user_id_by_name_zip", dict(user["name"], zip=user["address"]["zip"])


def retail_spelled(address):
    """``address`` as a user writes it: "12 Oak Avenue, Suite 301, Denver, CO 80202, USA"."""
    parts = [address["address1"], address["address2"], address["city"], address["state"] + " " + address["zip"]]
    return ", ".join([part for part in parts if part] + [address["country"]])


def retail_play(users, orders, action):
    """A tool-call action ({"type": "tool_call", "name", "arguments"}) played over the records
    as ``retail_answer`` plays it: (name, arguments, answer, ok), where ``ok`` is false
    for an ``Error: ...`` answer and for a tool the kit does not play (answer None)."""
    return _play(retail_answer, (users, orders), action)


def retail_step(log, users, orders, action):
    """``step()``'s result for a tool-call action: the call played over the records as
    ``retail_play`` plays it, and logged. ``log`` (a list the env keeps) gains
    {"name", "arguments", "ok"} before the kit answers, so a call whose value makes the
    kit raise is logged too, its ok left None; ``called`` reads the log. A tool the kit
    does not play gets the observation None: answer that one yourself."""
    return _step(log, retail_answer, (users, orders), action)


def _play(answer, records, action):
    name, arguments = action["name"], action.get("arguments") or {}
    text = answer(*records, name, arguments)
    return name, arguments, text, text is not None and not text.startswith("Error")


def _step(log, answer, records, action):
    entry = {"name": action["name"], "arguments": action.get("arguments") or {}, "ok": None}
    log.append(entry)
    _, _, text, entry["ok"] = _play(answer, records, action)
    return {"observation": text, "done": False}


def called(log, *names, ok=True):
    """The arguments of the calls in ``log`` (kept by the kit's step function) to any of ``names``
    (to any tool when none is named), in order: with ``ok=True`` the calls that went
    through, with ``ok=False`` those answered with an error, with ``ok=None`` every call
    tried (those the kit raised on too)."""
    return [e["arguments"] for e in log if (not names or e["name"] in names) and (ok is None or e["ok"] is ok)]


def before(log, *names):
    """The calls in ``log`` before the first call tried to any of ``names``, gone through or
    not (every call when none was tried): what an agent had done before it first wrote."""
    first = next((n for n, e in enumerate(log) if e["name"] in names), len(log))
    return log[:first]


def logged_in(log):
    """Whether a call in ``log`` authenticated a user: find_user_id_by_email or
    find_user_id_by_name_zip went through."""
    return bool(called(log, "find_user_id_by_email", "find_user_id_by_name_zip"))


def read_ids(log):
    """The ids the calls in ``log`` read and got, sorted, each once: the user id of each
    get_user_details and the order id of each get_order_details that went through."""
    users, orders = called(log, "get_user_details"), called(log, "get_order_details")
    return sorted({str(a.get("user_id")) for a in users} | {str(a.get("order_id")) for a in orders})


def figures(text):
    """The numbers written in ``text`` (an agent's answer), in order, read after every comma is
    dropped (a thousands separator, as answers write them): "1,204.50, then 3" gives
    [1204.5, 3.0], and "2,5" gives [25.0]: a decimal comma is not read as one."""
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", str(text).replace(",", ""))]


def script(*steps):
    """An oracle's actions, in order: each (name, arguments) pair a tool call, each string a
    message to the user."""
    return [
        {"type": "message", "content": step}
        if isinstance(step, str)
        else {"type": "tool_call", "name": step[0], "arguments": step[1]}
        for step in steps
    ]


def graded(parts, weights, reason):
    """What ``reward()`` returns for the components ``parts`` (numbers in [0, 1]; a bool
    counts 1 or 0): the reward is the sum of ``weights[name] * parts[name]``, at most 1,
    rounded to 4 places; every part is reported, weighted or not, and a weight whose
    part is absent (a level that does not pay for it) counts nothing."""
    parts = {name: float(value) for name, value in parts.items()}
    reward = sum(weights.get(name, 0.0) * value for name, value in parts.items())
    return {"reward": round(min(reward, 1.0), 4), "components": parts, "reason": reason}


def _retail_call(users, orders, name, args):
    by_user = {u["user_id"]: u for u in users}
    by_order = {o["order_id"]: o for o in orders}
    if name == "find_user_id_by_email":
        found = [u for u in users if u["email"].lower() == args["email"].lower()]
        return _first(found, "User not found")["user_id"]
    if name == "find_user_id_by_name_zip":
        found = [
            u
            for u in users
            if u["name"]["first_name"].lower() == args["first_name"].lower()
            and u["name"]["last_name"].lower() == args["last_name"].lower()
            and u["address"]["zip"] == args["zip"]
        ]
        return _first(found, "User not found")["user_id"]
    if name in ("get_user_details", "modify_user_address"):
        user = _first([by_user.get(args["user_id"])], "User not found")
        if name == "modify_user_address":
            user["address"] = {field: args[field] for field in ADDRESS_FIELDS}
        return user
    if name == "calculate":
        return _calculate(args["expression"])
    if name not in RETAIL_TOOLS:
        return None
    order = _first([by_order.get(args["order_id"])], "Order not found")
    if name == "get_order_details":
        return order
    if name.startswith("modify_pending_order_") and "pending" not in order["status"]:
        raise ValueError("Non-pending order cannot be modified")
    if name == "modify_pending_order_address":
        order["address"] = {field: args[field] for field in ADDRESS_FIELDS}
        return order
    methods = _first([by_user.get(order["user_id"])], "User not found")["payment_methods"]
    if name == "modify_pending_order_payment":
        return _change_payment(order, methods, args["payment_method_id"])
    if name == "cancel_pending_order":
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if args["reason"] not in CANCEL_REASONS:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order["payment_history"]:
            refunds.append(dict(payment, transaction_type="refund"))
            method = _first([methods.get(payment["payment_method_id"])], "Payment method not found")
            if method["source"] == "gift_card":  # refunded at once
                method["balance"] = round(method["balance"] + payment["amount"], 2)
        order.update(status="cancelled", cancel_reason=args["reason"])
        order["payment_history"].extend(refunds)
        return order
    if order["status"] != "delivered":
        raise ValueError("Non-delivered order cannot be returned")
    method = _first([methods.get(args["payment_method_id"])], "Payment method not found")
    if method["source"] != "gift_card" and method["id"] != order["payment_history"][0]["payment_method_id"]:
        raise ValueError("Payment method should be the original payment method")
    bought = [item["item_id"] for item in order["items"]]
    if any(args["item_ids"].count(i) > bought.count(i) for i in args["item_ids"]):
        raise ValueError("Some item not found")
    order.update(
        status="return requested",
        return_items=sorted(args["item_ids"]),
        return_payment_method_id=args["payment_method_id"],
    )
    return order


AIRPORTS = (
    ("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"), ("DFW", "Dallas"),
    ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"), ("BOS", "Boston"),
    ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"), ("EWR", "Newark"),
    ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"), ("PHL", "Philadelphia"), ("LGA", "LaGuardia"),
)  # fmt: skip
CABINS = ("business", "economy", "basic_economy")
MEMBERSHIPS = ("gold", "silver", "regular")
AIRLINE_PAYMENT_SOURCES = ("credit_card", "gift_card", "certificate")
FLIGHT_STATUSES = ("available", "landed", "cancelled", "delayed", "flying", "on time")
FARES = {"basic_economy": (50, 100), "economy": (100, 200), "business": (200, 500)}  # dollars, whole
AIRLINE_TODAY = "2024-05-15T15:00:00"  # τ²-airline's clock: every task happens at this time
AIRLINE_TOOLS = (
    "get_user_details",
    "get_reservation_details",
    "get_flight_status",
    "search_direct_flight",
    "list_all_airports",
    "cancel_reservation",
    "update_reservation_baggages",
    "update_reservation_passengers",
    "send_certificate",
    "calculate",
)


def _person(rng):
    return {
        "first_name": rng.choice(FIRST),
        "last_name": rng.choice(LAST),
        "dob": "19%02d-%02d-%02d" % (rng.randrange(40, 100), rng.randrange(1, 13), rng.randrange(1, 29)),
    }


def airline_user(seed, payment=AIRLINE_PAYMENT_SOURCES, membership=None):
    """A τ²-airline User: name, address, email, dob, one payment method per source in
    ``payment`` (credit_card, gift_card, certificate; a gift card's and a
    certificate's ``amount`` in dollars), one or two saved passengers, a membership
    (gold, silver, regular; drawn when None) and, so far, no reservations."""
    rng = _seeded(seed)
    me = _person(rng)
    methods = _payment_methods(rng, payment, AIRLINE_PAYMENT_SOURCES, _airline_funds)
    if membership is not None and membership not in MEMBERSHIPS:
        raise ValueError("world: a membership is one of %s" % ", ".join(MEMBERSHIPS))
    return {
        "user_id": "%s_%s_%s" % (me["first_name"].lower(), me["last_name"].lower(), _digits(rng, 4)),
        "name": {"first_name": me["first_name"], "last_name": me["last_name"]},
        "address": retail_address(rng.randrange(2**31)),
        "email": "%s.%s%s@example.com" % (me["first_name"].lower(), me["last_name"].lower(), _digits(rng, 4)),
        "dob": me["dob"],
        "payment_methods": methods,
        "saved_passengers": [_person(rng) for _ in range(rng.randint(1, 2))],
        "membership": membership if membership is not None else rng.choice(MEMBERSHIPS),
        "reservations": [],
    }


def airline_flight(seed, origin=None, destination=None, dates=("2024-05-16",), status="available", number=None):
    """A τ²-airline Flight from ``origin`` to ``destination`` (IATA codes of ``AIRPORTS``,
    drawn when None) with its scheduled times and, per date in ``dates``, its state as
    tau2 writes it: ``status`` "available" (seats and whole-dollar prices per cabin),
    "landed", "flying", "on time", "delayed" (their times) or "cancelled", for every
    date, or a dict of a status per date (its dates join ``dates``, which are available). Its
    flight number is ``number`` (drawn, "HAT001" to "HAT299", when None): give flights
    of one env numbers of their own, as tau2 keeps one flight per number."""
    rng = _seeded(seed)
    codes = [code for code, _ in AIRPORTS]
    origin = origin if origin is not None else rng.choice(codes)
    destination = destination if destination is not None else rng.choice([c for c in codes if c != origin])
    if origin not in codes or destination not in codes or origin == destination:
        raise ValueError("world: origin and destination are two of the IATA codes in AIRPORTS")
    if isinstance(status, dict):
        statuses = dict(sorted({**{d: "available" for d in dates}, **status}.items()))
    else:
        statuses = {d: status for d in dates}
    for value in statuses.values():
        if value not in FLIGHT_STATUSES:
            raise ValueError("world: a flight's status is one of %s, got %r" % (", ".join(FLIGHT_STATUSES), value))
    leave, hours = rng.randrange(5, 19), rng.randrange(1, 5)
    days = {}
    for date, state in statuses.items():
        day = {"status": state}
        at = lambda hour: "%sT%02d:%02d:00" % (date, hour, rng.randrange(60))  # noqa: E731
        if state == "available":
            day["available_seats"] = {cabin: rng.randrange(21) for cabin in CABINS}
            day["prices"] = {cabin: rng.randint(*FARES[cabin]) for cabin in CABINS}
        elif state != "cancelled":
            gone = "actual" if state in ("landed", "flying") else "estimated"
            day[gone + "_departure_time_est"] = at(leave)
            day[("actual" if state == "landed" else "estimated") + "_arrival_time_est"] = at(leave + hours)
        days[date] = day
    return {
        "flight_number": number if number is not None else "HAT%03d" % rng.randrange(1, 300),
        "origin": origin,
        "destination": destination,
        "scheduled_departure_time_est": "%02d:00:00" % leave,
        "scheduled_arrival_time_est": "%02d:00:00" % (leave + hours),
        "dates": days,
    }


def airline_reservation(
    seed, user, legs, cabin="economy", passengers=1, insurance="no", bags=(0, 0), paid_with=None, back=None
):
    """A τ²-airline Reservation of ``user`` for ``legs`` ((``airline_flight`` record, date)
    pairs, in order) in ``cabin``, for ``passengers`` people (the user, then their saved
    passengers, then others), ``bags`` (total, non-free), paid in full with ``paid_with``
    (a payment method id of the user; when None their first card or gift card, as
    tau2's bookings are paid): each leg at its price on that date (drawn for a date
    with none), $30 a passenger for insurance "yes", $50 a non-free bag. Legs that end
    where the first began are a round trip whose way back starts at leg ``back``
    (half of the legs when None), its destination where the way out ends. Its id is
    added to ``user["reservations"]``; created before ``AIRLINE_TODAY``."""
    rng = _seeded(seed)
    if cabin not in CABINS:
        raise ValueError("world: a cabin is one of %s" % ", ".join(CABINS))
    if insurance not in ("yes", "no"):
        raise ValueError("world: insurance is 'yes' or 'no'")
    total, nonfree = bags
    if type(passengers) is not int or passengers < 1 or not 0 <= nonfree <= total:
        raise ValueError("world: passengers is at least 1, and bags is (total, non-free) with non-free <= total")
    methods = user["payment_methods"]
    if paid_with is None:
        paid_with = next((i for i, m in methods.items() if m["source"] != "certificate"), None)
    if paid_with not in methods:
        raise ValueError("world: %s is not a payment method of the user" % paid_with)
    flights = []
    for flight, date in legs:
        prices = flight["dates"].get(date, {}).get("prices") or {cabin: rng.randint(*FARES[cabin])}
        flights.append(
            {
                "flight_number": flight["flight_number"],
                "origin": flight["origin"],
                "destination": flight["destination"],
                "date": date,
                "price": prices[cabin],
            }
        )
    if not flights:
        raise ValueError("world: a reservation has at least one leg")
    round_trip = len(flights) > 1 and flights[-1]["destination"] == flights[0]["origin"]
    if back is not None and not (round_trip and 1 <= back < len(flights)):
        raise ValueError("world: back is the index of a round trip's first leg home, 1 to its legs less one")
    back = back if back is not None else max(1, len(flights) // 2)
    people = [dict(user["name"], dob=user["dob"]), *map(dict, user["saved_passengers"])]
    people += [_person(rng) for _ in range(passengers - len(people))]
    amount = sum(f["price"] for f in flights) * passengers + 30 * passengers * (insurance == "yes") + 50 * nonfree
    reservation = {
        "reservation_id": "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(6)),
        "user_id": user["user_id"],
        "origin": flights[0]["origin"],
        "destination": flights[back - 1]["destination"] if round_trip else flights[-1]["destination"],
        "flight_type": "round_trip" if round_trip else "one_way",
        "cabin": cabin,
        "flights": flights,
        "passengers": people[:passengers],
        "payment_history": [{"payment_id": paid_with, "amount": amount}],
        "created_at": "2024-05-%02dT%02d:%02d:%02d"
        % (rng.randrange(1, 15), rng.randrange(24), rng.randrange(60), rng.randrange(60)),
        "total_baggages": total,
        "nonfree_baggages": nonfree,
        "insurance": insurance,
        "status": None,
    }
    user["reservations"].append(reservation["reservation_id"])
    return reservation


def airline_answer(users, reservations, flights, name, arguments):
    """τ²-airline's answer to the call ``name(**arguments)`` over ``users``,
    ``reservations`` and ``flights`` (lists of ``airline_user``, ``airline_reservation``
    and ``airline_flight`` records), as the target's tool message reads: the record or
    list as JSON, a status or message, or ``Error: <why>`` in tau2's words. A write
    changes the records as tau2 does (a cancel refunds every payment and marks the
    reservation cancelled, a baggage change charges $50 a new non-free bag, a gift
    card pays from its amount). None for a tool the kit does not play
    (``AIRLINE_TOOLS`` lists those it does)."""
    return _answer(_airline_call, (users, reservations, flights), name, arguments)


def airline_play(users, reservations, flights, action):
    """A tool-call action ({"type": "tool_call", "name", "arguments"}) played over the records
    as ``airline_answer`` plays it: (name, arguments, answer, ok), where ``ok`` is false
    for an ``Error: ...`` answer and for a tool the kit does not play (answer None)."""
    return _play(airline_answer, (users, reservations, flights), action)


def airline_step(log, users, reservations, flights, action):
    """``step()``'s result for a tool-call action: the call played over the records as
    ``airline_play`` plays it, and logged. ``log`` (a list the env keeps) gains
    {"name", "arguments", "ok"} before the kit answers, so a call whose value makes the
    kit raise is logged too, its ok left None; ``called`` reads the log. A tool the kit
    does not play gets the observation None: answer that one yourself."""
    return _step(log, airline_answer, (users, reservations, flights), action)


def _airline_call(users, reservations, flights, name, args):
    by_user = {u["user_id"]: u for u in users}
    if name == "calculate":
        return _calculate(args["expression"])
    if name == "list_all_airports":
        return [{"iata": code, "city": city} for code, city in AIRPORTS]
    if name in ("get_user_details", "send_certificate"):
        user = _first([by_user.get(args["user_id"])], "User %s not found" % args["user_id"])
        if name == "get_user_details":
            return user
        for number in (3221322, 3221323, 3221324):
            payment_id = "certificate_%d" % number
            if payment_id not in user["payment_methods"]:
                certificate = {"source": "certificate", "id": payment_id, "amount": float(args["amount"])}
                user["payment_methods"][payment_id] = certificate
                return "Certificate %s added to user %s with amount %s." % (payment_id, args["user_id"], args["amount"])
        raise ValueError("Too many certificates")
    if name in ("get_flight_status", "search_direct_flight"):
        date = args["date"]
        if name == "get_flight_status":
            flight = _first(
                [f for f in flights if f["flight_number"] == args["flight_number"]],
                "Flight %s not found" % args["flight_number"],
            )
            return _first(
                [flight["dates"].get(date)], "Flight %s not found on date %s" % (args["flight_number"], date)
            )["status"]
        return [
            dict(
                {k: f[k] for k in ("flight_number", "origin", "destination")},
                status="available",
                scheduled_departure_time_est=f["scheduled_departure_time_est"],
                scheduled_arrival_time_est=f["scheduled_arrival_time_est"],
                date=None,
                available_seats=f["dates"][date]["available_seats"],
                prices=f["dates"][date]["prices"],
            )
            for f in flights
            if args["origin"] in (None, f["origin"])  # (None: any airport, as tau2 reads it)
            and args["destination"] in (None, f["destination"])
            and f["dates"].get(date, {}).get("status") == "available"
        ]
    if name not in AIRLINE_TOOLS:
        return None
    if name == "update_reservation_passengers":  # (tau2 reads the passengers before the reservation)
        passengers = [_passenger(p) for p in args["passengers"]]
    found = [r for r in reservations if r["reservation_id"] == args["reservation_id"]]
    reservation = _first(found, "Reservation %s not found" % args["reservation_id"])
    if name == "get_reservation_details":
        return reservation
    if name == "cancel_reservation":  # every payment refunded; tau2 does not check it was not cancelled already
        history = reservation["payment_history"]
        history.extend([{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in list(history)])
        reservation["status"] = "cancelled"
        return reservation
    if name == "update_reservation_passengers":
        if len(passengers) != len(reservation["passengers"]):
            raise ValueError("Number of passengers does not match")
        reservation["passengers"] = passengers
        return reservation
    user = _first([by_user.get(reservation["user_id"])], "User %s not found" % reservation["user_id"])
    price = 50 * max(0, args["nonfree_baggages"] - reservation["nonfree_baggages"])
    method = _first([user["payment_methods"].get(args["payment_id"])], "Payment method not found")
    if method["source"] == "certificate":
        raise ValueError("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card":
        if method["amount"] < price:
            raise ValueError("Gift card balance is not enough")
        method["amount"] -= price
    if price:
        reservation["payment_history"].append({"payment_id": args["payment_id"], "amount": price})
    reservation.update(total_baggages=args["total_baggages"], nonfree_baggages=args["nonfree_baggages"])
    return reservation


def _passenger(given):
    """A Passenger as tau2's pydantic takes it (its words are pydantic's; the kit's are its own)."""
    fields = ("first_name", "last_name", "dob")
    if not isinstance(given, dict) or not all(isinstance(given.get(k), str) for k in fields):
        raise ValueError("a passenger has first_name, last_name and dob, each a string")
    return {k: given[k] for k in fields}


def _change_payment(order, methods, new_id):
    method = _first([methods.get(new_id)], "Payment method not found")
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ValueError("There should be exactly one payment for a pending order")
    old_id, amount = history[0]["payment_method_id"], history[0]["amount"]
    if old_id == new_id:
        raise ValueError("The new payment method should be different from the current one")
    if method["source"] == "gift_card" and method["balance"] < amount:
        raise ValueError("Insufficient gift card balance to pay for the order")
    history.append({"transaction_type": "payment", "amount": amount, "payment_method_id": new_id})
    history.append({"transaction_type": "refund", "amount": amount, "payment_method_id": old_id})
    if method["source"] == "gift_card":
        method["balance"] = round(method["balance"] - amount, 2)
    old = _first([methods.get(old_id)], "Payment method not found")
    if old["source"] == "gift_card":  # refunded at once
        old["balance"] = round(old["balance"] + amount, 2)
    return order


def _calculate(expression):
    """tau2's calculate: Python's arithmetic on the expression (+ - * / // and
    parentheses, integers exact), the result rounded to 2 places. tau2 runs it
    through ``eval``; the kit walks Python's own parse of it and refuses ``**``
    (a power of a power runs for ever) and anything deeper than it can walk."""
    if not all(ch in "0123456789+-*/(). " for ch in expression):
        raise ValueError("Invalid characters in expression")
    try:
        return str(round(float(_arithmetic(ast.parse(expression.strip(), mode="eval").body)), 2))
    except SyntaxError as exc:
        raise ValueError(exc.msg) from None
    except (ZeroDivisionError, OverflowError) as exc:
        raise ValueError(str(exc)) from None
    except RecursionError:
        raise ValueError("expression nested too deeply") from None


ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arithmetic(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](_arithmetic(node.operand))
    raise ValueError("only + - * / // and parentheses on numbers")


def _first(found, error):
    found = [f for f in found if f is not None]
    if not found:
        raise ValueError(error)
    return found[0]
