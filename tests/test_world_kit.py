"""The world kit (``sandbox/world.py``, ``import world`` in env code): its records have
the target's shapes, its answers are tau2-bench's own, it hands env code plain data
only, and its insides stay out of env code's reach."""

import json
import random
import subprocess
import sys

import pytest

from conftest import REPO
from trace_gym.result_shapes import load_result_shapes, result_problems
from trace_gym.sandbox import SandboxEnvError, SandboxWorker, check_source
from trace_gym.sandbox import world

KIT_ENV = """
import json
import random
import world

TOOLS = ["get_order_details"]


class Environment:
    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.user = world.retail_user(rng.randrange(2**31))
        items = [world.retail_item(rng.randrange(2**31)) for _ in range(2)]
        self.order = world.retail_order(rng.randrange(2**31), self.user, items)
        return {"system_prompt": "s", "user_message": "my order is " + self.order["order_id"]}

    def step(self, action):
        answer = world.retail_answer([self.user], [self.order], action["name"], action["arguments"])
        return {"observation": answer, "done": False}

    def reward(self):
        return {"reward": 1.0 if self.order["status"] == "delivered" else 0.0, "components": {}, "reason": ""}
"""


def shop(seed: int, status: str = "delivered", n: int = 3):
    rng = random.Random(seed)
    user = world.retail_user(rng.randrange(2**31))
    items = [world.retail_item(rng.randrange(2**31)) for _ in range(n)]
    order = world.retail_order(rng.randrange(2**31), user, items, status=status)
    return user, order


def test_an_env_on_the_kit_runs_in_the_jail_and_gets_plain_data(sandbox_backend):
    assert check_source(KIT_ENV) == []
    with SandboxWorker(KIT_ENV, backend=sandbox_backend) as worker:
        opening = worker.call("reset", seed=3, hint=False)
        order_id = opening["user_message"].split()[-1]
        answer = worker.call(
            "step", action={"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": order_id}}
        )
        assert json.loads(answer["observation"])["order_id"] == order_id
        missing = {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": "#W0"}}
        assert worker.call("step", action=missing)["observation"] == "Error: Order not found"


AIRLINE_KIT_ENV = """
import random
import world


class Environment:
    def reset(self, seed, hint=False):
        rng = random.Random(seed)
        self.user = world.airline_user(rng.randrange(2**31))
        self.flight = world.airline_flight(rng.randrange(2**31), "JFK", "LAX", number="HAT001")
        self.booked = world.airline_reservation(rng.randrange(2**31), self.user, [(self.flight, "2024-05-16")])
        self.log = []
        return {"system_prompt": "s", "user_message": "cancel " + self.booked["reservation_id"]}

    def step(self, action):
        return world.airline_step(self.log, [self.user], [self.booked], [self.flight], action)

    def reward(self):
        done = world.called(self.log, "cancel_reservation")
        return {"reward": float(bool(done)), "components": {}, "reason": ""}
"""


def test_an_env_on_the_airline_kit_runs_in_the_jail(sandbox_backend):
    assert check_source(AIRLINE_KIT_ENV) == []
    with SandboxWorker(AIRLINE_KIT_ENV, backend=sandbox_backend) as worker:
        booked = worker.call("reset", seed=5, hint=False)["user_message"].split()[-1]
        cancel = {"type": "tool_call", "name": "cancel_reservation", "arguments": {"reservation_id": booked}}
        assert json.loads(worker.call("step", action=cancel)["observation"])["status"] == "cancelled"
        assert worker.call("reward")["reward"] == 1.0


@pytest.mark.parametrize(
    "line, refused_by",
    [
        ("world._retail_call([], [], 'x', {})", "static gate"),  # a private name of a module
        ("world.PRODUCTS", "static gate"),  # the kit's own mutable table: not on the allowlist
        ("'{0._first}'.format(world)", "refused by the language layer"),  # a format field walking into it
        ("[world][0].PRODUCTS", "not on the sandbox's allowlist"),
        ("[world][0].json", "not on the sandbox's allowlist"),  # no module the kit imports
        ("[world.retail_user][0].__globals__", "static gate"),
        ("world.CANCEL_SAID.update(x='y')", "no attribute 'update'"),  # shared by every reset: read-only
    ],
)
def test_the_kits_insides_are_out_of_reach(sandbox_backend, line, refused_by):
    source = KIT_ENV.replace("        answer = world", f"        out = {line}\n        answer = world")
    findings = check_source(source)
    if refused_by == "static gate":
        assert findings, line
        return
    assert findings == [], findings
    with SandboxWorker(source, backend=sandbox_backend) as worker:
        worker.call("reset", seed=0, hint=False)
        with pytest.raises(SandboxEnvError, match=refused_by):
            worker.call(
                "step", action={"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": "x"}}
            )


def test_a_seed_must_be_an_int_and_names_must_be_the_kits():
    with pytest.raises(TypeError, match="a seed is an int"):
        world.retail_user("1")
    with pytest.raises(ValueError, match="products are"):
        world.retail_item(1, product="Spaceship")
    with pytest.raises(ValueError, match="comes in color"):
        world.retail_item(1, product="Headphones", option="XL")
    with pytest.raises(ValueError, match="payment sources are"):
        world.retail_user(1, payment=("bitcoin",))


def test_records_and_answers_have_the_targets_frozen_shapes():
    shapes = load_result_shapes(REPO / "env_registry" / "tau2-retail")
    for seed in range(20):
        user, order = shop(seed, status=["delivered", "pending", "processed"][seed % 3])
        calls = [
            ("find_user_id_by_email", {"email": user["email"]}),
            ("get_user_details", {"user_id": user["user_id"]}),
            ("get_order_details", {"order_id": order["order_id"]}),
            ("get_order_details", {"order_id": "#W1"}),
            ("cancel_pending_order", {"order_id": order["order_id"], "reason": "no longer needed"}),
        ]
        for name, args in calls:
            answer = world.retail_answer([user], [order], name, args)
            assert result_problems(shapes, name, answer) == [], (name, answer)


def tau2_answer(db, name: str, args: dict) -> str:
    """What τ²-retail itself answers: its tool on a RetailDB, as its environment writes the message."""
    from tau2.domains.retail.tools import RetailTools
    from tau2.environment.environment import Environment

    try:
        return Environment.to_json_str(getattr(RetailTools(db), name)(**args))
    except ValueError as exc:
        return f"Error: {exc}"


def tau2_db(users: list, orders: list):
    from tau2.domains.retail.data_model import RetailDB

    products: dict = {}
    for order in orders:
        for item in order["items"]:
            product = products.setdefault(
                item["product_id"], {"name": item["name"], "product_id": item["product_id"], "variants": {}}
            )
            variant = {
                "item_id": item["item_id"],
                "options": item["options"],
                "available": True,
                "price": item["price"],
            }
            product["variants"][item["item_id"]] = variant
    return RetailDB.model_validate(
        {"products": products, "users": {u["user_id"]: u for u in users}, "orders": {o["order_id"]: o for o in orders}}
    )


def scripted_calls(user: dict, order: dict, rng: random.Random) -> list[tuple[str, dict]]:
    items = [i["item_id"] for i in order["items"]]
    methods = sorted(user["payment_methods"])
    first, last, zip_code = user["name"]["first_name"], user["name"]["last_name"], user["address"]["zip"]
    address = {
        "address1": "1 New Street",
        "address2": "",
        "city": "Reno",
        "country": "USA",
        "state": "NV",
        "zip": "89501",
    }
    return [
        ("find_user_id_by_email", {"email": user["email"].upper()}),  # tau2 ignores case
        ("find_user_id_by_email", {"email": "nobody@example.com"}),
        ("find_user_id_by_name_zip", {"first_name": first.lower(), "last_name": last, "zip": zip_code}),
        ("find_user_id_by_name_zip", {"first_name": first, "last_name": last, "zip": "00000"}),
        ("get_user_details", {"user_id": user["user_id"]}),
        ("get_user_details", {"user_id": "nobody_1"}),
        ("get_order_details", {"order_id": order["order_id"].lstrip("#")}),  # the '#' matters
        ("modify_pending_order_address", {"order_id": order["order_id"], **address}),
        ("modify_user_address", {"user_id": user["user_id"], **address}),
        ("modify_user_address", {"user_id": "nobody_1", **address}),
        *[
            ("modify_pending_order_payment", {"order_id": order["order_id"], "payment_method_id": method})
            for method in [*rng.sample(methods, len(methods)), "paypal_0"]  # the same one, others, a gift card
        ],
        ("cancel_pending_order", {"order_id": order["order_id"], "reason": "changed my mind"}),
        (
            "cancel_pending_order",
            {"order_id": order["order_id"], "reason": rng.choice(["no longer needed", "ordered by mistake"])},
        ),
        (
            "return_delivered_order_items",
            {"order_id": order["order_id"], "item_ids": items[:1] * 2, "payment_method_id": methods[0]},
        ),
        (
            "return_delivered_order_items",
            {"order_id": order["order_id"], "item_ids": ["123"], "payment_method_id": methods[0]},
        ),
        (
            "return_delivered_order_items",
            {"order_id": order["order_id"], "item_ids": items[:2], "payment_method_id": rng.choice(methods)},
        ),
        (
            "return_delivered_order_items",
            {"order_id": order["order_id"], "item_ids": items[:1], "payment_method_id": "paypal_0"},
        ),
        ("get_order_details", {"order_id": order["order_id"]}),
        ("get_user_details", {"user_id": user["user_id"]}),
        *[
            ("calculate", {"expression": expression})  # (a malformed one: tau2's eval raises, test below)
            for expression in [
                "2 + 2",
                "(12.5 + 7.25) * 3 / 4",
                "-3 + 1",
                "10 / 3",
                "2 ^ 3",
                "1 + x",
                "1.5 + 2.25",
                "0 * -1",
                "7 // 2",
                "9007199254740993 - 9007199254740992",  # integers exact, as eval's
            ]
        ],
    ]


@pytest.mark.parametrize("status", ["delivered", "pending", "processed"])
def test_the_kit_answers_every_call_as_tau2_bench_does(status):
    for seed in range(15):
        user, order = shop(seed, status=status)
        paid = sorted(user["payment_methods"])[seed % 3]  # paid by card, PayPal or gift card
        order["payment_history"][0]["payment_method_id"] = paid
        db = tau2_db([json.loads(json.dumps(user))], [json.loads(json.dumps(order))])
        for name, args in scripted_calls(user, order, random.Random(seed)):
            ours = world.retail_answer([user], [order], name, args)
            theirs = tau2_answer(db, name, args)
            if theirs.startswith("{"):  # a record: the same fields and values (tau2 writes floats its own way)
                assert json.loads(ours) == json.loads(theirs), (name, args)
            else:  # an id or an error, word for word
                assert ours == theirs, (name, args)


def test_calculate_refuses_what_it_cannot_parse_in_one_error_line():
    """tau2 hands the expression to ``eval`` (a malformed one raises Python's error, ``**``
    is computed); the kit walks Python's parse of it and answers an error."""
    deep = ["(" * 400 + "1" + ")" * 400, "-" * 1200 + "1"]
    for expression in ["2 +", "", "(1 + 2", "3)", "1..2", "2 ** 3", "1 / 0", "()", "1 2 + 3", "01 + 1", *deep]:
        answer = world.retail_answer([], [], "calculate", {"expression": expression})
        assert answer.startswith("Error: ") and "\n" not in answer, (expression, answer)
    assert world.retail_answer([], [], "calculate", {"expression": "1 / 0"}) == "Error: division by zero"


def test_one_item_is_one_id_at_one_price_in_every_order():
    items = [world.retail_item(seed) for seed in range(300)]
    by_id: dict = {}
    for item in items:
        by_id.setdefault(item["item_id"], set()).add((item["name"], json.dumps(item["options"]), item["price"]))
    assert len(by_id) > 20 and all(len(seen) == 1 for seen in by_id.values())
    assert all(15 <= item["price"] <= 300 for item in items)


def test_a_cancelled_order_is_a_pending_one_cancelled_as_tau2_cancels_it():
    for seed in range(10):
        user, order = shop(seed, status="cancelled")
        pending_user, pending = shop(seed, status="pending")
        db = tau2_db([pending_user], [pending])
        theirs = json.loads(
            tau2_answer(db, "cancel_pending_order", {"order_id": pending["order_id"], "reason": "no longer needed"})
        )
        assert order == theirs and order["payment_history"][-1]["transaction_type"] == "refund"


def test_the_kits_helpers_write_what_env_code_would_spell_out():
    user, order = shop(3, status="pending")
    for by in ("name_zip", "email"):
        name, arguments = world.retail_login(user, by)
        assert world.retail_answer([user], [order], name, arguments) == user["user_id"]
    with pytest.raises(ValueError, match="logs in by"):
        world.retail_login(user, "phone")
    address = {
        "address1": "1 Oak Avenue",
        "address2": "",
        "city": "Reno",
        "country": "USA",
        "state": "NV",
        "zip": "89501",
    }
    assert world.retail_spelled(address) == "1 Oak Avenue, Reno, NV 89501, USA"
    assert world.retail_spelled(dict(address, address2="Suite 2")) == "1 Oak Avenue, Suite 2, Reno, NV 89501, USA"
    read = {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": order["order_id"]}}
    assert world.retail_play([user], [order], read)[2:] == (json.dumps(order), True)
    missing = dict(read, arguments={"order_id": "#W0"})
    assert world.retail_play([user], [order], missing)[2:] == ("Error: Order not found", False)
    assert world.script(("get_order_details", {"order_id": "#W1"}), "Done.") == [
        {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": "#W1"}},
        {"type": "message", "content": "Done."},
    ]
    with pytest.raises(TypeError, match="does not support item assignment"):
        world.CANCEL_SAID["no longer needed"] = "whatever"  # type: ignore[index]
    stock = world.retail_stock()
    assert len({i["item_id"] for i in stock}) == len(stock) == sum(len(v) for _, v in world.retail_products().values())


def test_retail_step_logs_every_call_and_called_reads_the_log():
    user = world.retail_user(1)
    order = world.retail_order(2, user, [world.retail_item(3)], status="pending")
    log = []
    read = {"type": "tool_call", "name": "get_order_details", "arguments": {"order_id": order["order_id"]}}
    assert world.retail_step(log, [user], [order], read) == {"observation": json.dumps(order), "done": False}
    assert world.retail_step(log, [user], [order], dict(read, arguments={"order_id": "#W0"}))["observation"] == (
        "Error: Order not found"
    )
    cancel = {"type": "tool_call", "name": "cancel_pending_order", "arguments": {"order_id": [order["order_id"]]}}
    with pytest.raises(TypeError):  # a list is no order id: the kit raises, as tau2's pydantic refuses it
        world.retail_step(log, [user], [order], cancel)
    assert [(e["name"], e["ok"]) for e in log] == [
        ("get_order_details", True),
        ("get_order_details", False),
        ("cancel_pending_order", None),  # logged before the kit answered: an env still counts the attempt
    ]
    assert world.called(log, "get_order_details") == [{"order_id": order["order_id"]}]  # a refused call is not in
    assert world.called(log, "get_order_details", ok=False) == [{"order_id": "#W0"}]
    assert world.called(log, "cancel_pending_order") == []
    assert world.called(log, "cancel_pending_order", ok=None) == [{"order_id": [order["order_id"]]}]
    assert len(world.called(log, ok=None)) == 3 and world.called(log, "calculate", ok=None) == []


def test_graded_weighs_the_parts_and_caps_the_reward_at_one():
    graded = world.graded({"found": True, "answer": 0.5, "unweighted": 1}, {"found": 0.3, "answer": 0.4}, "why")
    assert graded == {"reward": 0.5, "components": {"found": 1.0, "answer": 0.5, "unweighted": 1.0}, "reason": "why"}
    assert world.graded({"a": 1, "b": 1}, {"a": 0.8, "b": 0.7}, "")["reward"] == 1.0


def test_retail_orders_builds_one_order_per_status_from_the_stock():
    user = world.retail_user(4, payment=["credit_card", "paypal"])
    paypal = sorted(user["payment_methods"])[1]
    orders = world.retail_orders(5, user, ["pending", "delivered", "cancelled"], paypal, items=(2, 3))
    assert [o["status"] for o in orders] == ["pending", "delivered", "cancelled"]
    assert user["orders"] == [o["order_id"] for o in orders]
    stock = {i["item_id"] for i in world.retail_stock()}
    for order in orders:
        ids = [i["item_id"] for i in order["items"]]
        assert 2 <= len(ids) <= 3 and len(set(ids)) == len(ids) and set(ids) <= stock
        assert order["payment_history"][0]["payment_method_id"] == paypal
    assert [len(o["items"]) for o in world.retail_orders(5, world.retail_user(4), ["pending"] * 4)] == [1] * 4
    again = world.retail_orders(5, world.retail_user(4, payment=["credit_card", "paypal"]), ["pending"], paypal, (2, 3))
    assert again[0] == orders[0]  # one seed, one scenario
    with pytest.raises(ValueError, match="not a payment method"):
        world.retail_orders(5, user, ["pending"], "paypal_0000000")
    with pytest.raises(ValueError, match="an order's status is one of"):
        world.retail_orders(5, user, ["canceled"])
    with pytest.raises(ValueError, match="fewest, most"):
        world.retail_orders(5, user, ["pending"], items=(3, 2))


def test_retail_made_finds_a_write_in_the_records_and_nothing_near_it():
    user = world.retail_user(6, payment=["credit_card", "gift_card"])
    card, gift = sorted(user["payment_methods"])
    user["payment_methods"][gift]["balance"] = 1000.0
    pending, other, delivered = world.retail_orders(7, user, ["pending", "pending", "delivered"])
    orders, new = [pending, other, delivered], world.retail_address(8)
    item = delivered["items"][0]["item_id"]
    writes = [
        ("cancel_pending_order", {"order_id": pending["order_id"], "reason": "ordered by mistake"}),
        ("modify_pending_order_address", dict(new, order_id=other["order_id"])),
        ("modify_pending_order_payment", {"order_id": other["order_id"], "payment_method_id": gift}),
        (
            "return_delivered_order_items",
            {"order_id": delivered["order_id"], "item_ids": [item], "payment_method_id": card},
        ),
        ("modify_user_address", dict(new, user_id=user["user_id"])),
    ]
    near = [  # one value off each: the records never hold these
        ("cancel_pending_order", {"order_id": pending["order_id"], "reason": "no longer needed"}),
        ("modify_pending_order_address", dict(new, order_id=other["order_id"], zip="00000")),
        ("modify_pending_order_payment", {"order_id": other["order_id"], "payment_method_id": card}),
        (
            "return_delivered_order_items",
            {"order_id": delivered["order_id"], "item_ids": [], "payment_method_id": card},
        ),
        ("modify_user_address", dict(new, user_id=user["user_id"], city="Elsewhere")),
        ("cancel_pending_order", {"order_id": "#W0000000", "reason": "ordered by mistake"}),
        ("get_order_details", {"order_id": pending["order_id"]}),
        (
            "return_delivered_order_items",
            {"order_id": delivered["order_id"], "item_ids": item, "payment_method_id": card},
        ),
    ]
    assert world.retail_made([user], orders, writes) == [False] * 5
    for name, arguments in writes:
        assert not world.retail_answer([user], orders, name, arguments).startswith("Error"), name
    assert world.retail_made([user], orders, writes) == [True] * 5
    assert world.retail_made([user], orders, near) == [False] * len(near)
    assert world.retail_made([user], orders, [("cancel_pending_order", "not arguments")]) == [False]
    assert world.retail_made([user], orders, [("cancel_pending_order", {"order_id": [pending["order_id"]]})]) == [False]
    with pytest.raises(ValueError, match="a \\(name, arguments\\) pair"):
        world.retail_made([user], orders, ["ok"])  # a script's message is no write
    # a change to an order cancelled since is not in the final records
    world.retail_answer(
        [user], orders, "cancel_pending_order", {"order_id": other["order_id"], "reason": "no longer needed"}
    )
    assert world.retail_made([user], orders, writes[1:3]) == [False, False]


def test_logged_in_and_read_ids_read_only_the_calls_that_went_through():
    user = world.retail_user(9)
    [order] = world.retail_orders(10, user, ["delivered"])
    log = []

    def call(name, **arguments):
        world.retail_step(log, [user], [order], {"type": "tool_call", "name": name, "arguments": arguments})

    call("find_user_id_by_email", email="nobody@example.com")
    call("get_order_details", order_id="#W0000000")
    call("get_user_details", user_id="nobody_1234")
    assert not world.logged_in(log) and world.read_ids(log) == []
    call("find_user_id_by_name_zip", **world.retail_login(user)[1])
    call("get_order_details", order_id=order["order_id"])
    assert world.logged_in(log) and world.read_ids(log) == [order["order_id"]]
    call("get_user_details", user_id=user["user_id"])
    call("get_order_details", order_id=order["order_id"])  # read twice, listed once
    assert world.read_ids(log) == sorted([order["order_id"], user["user_id"]])
    assert world.before(log, "get_user_details") == log[:2] and world.before(log, "cancel_pending_order") == log
    assert world.before(log, "get_order_details", "get_user_details") == log[:1]  # the first call to any of them


def test_every_reference_env_on_the_kit_keeps_to_sixty_formatted_lines():
    """CONTRIBUTING's budget for an env on the world kit: its scenario, reward and oracle, in
    60 lines as the formatter lays them out (not packed to fit)."""
    envs = sorted((REPO / "env_registry").glob("*/env.py"))
    assert len(envs) >= 7 and all("import world" in p.read_text(encoding="utf-8") for p in envs)
    formatted = {}
    for path in envs:
        out = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--config", str(REPO / "pyproject.toml"), "-"],
            input=path.read_text(encoding="utf-8"),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        formatted[path.parent.name] = len(out.splitlines())
    assert {name: n for name, n in formatted.items() if n > 60} == {}


def test_figures_reads_the_numbers_of_an_answer():
    assert world.figures("You paid 1,204.50 in total, over 3 orders.") == [1204.5, 3.0]
    assert world.figures("Order #W0000007: the lamp.") == [7.0] and world.figures(None) == []
    assert world.figures("2,5") == [25.0]  # every comma is a thousands separator to it


def test_retail_typed_follows_the_frozen_schemas():
    tools = json.loads((REPO / "env_registry" / "tau2-retail" / "tools.json").read_text(encoding="utf-8"))
    for tool in tools:
        properties = tool["function"]["parameters"].get("properties", {})
        arrays = {k for k, v in properties.items() if v["type"] == "array"}
        assert arrays <= set(world.RETAIL_ID_LISTS), tool["function"]["name"]
        assert all(properties[k]["items"]["type"] == "string" for k in arrays)
        assert all(v["type"] == "string" for k, v in properties.items() if k not in arrays)
        right = {k: ["#1"] if k in arrays else "x" for k in properties}
        assert world.retail_typed(right), tool["function"]["name"]
        for k in properties:  # each argument mistyped in turn: refused
            wrong = dict(right, **{k: "#1" if k in arrays else 7})
            assert not world.retail_typed(wrong), (tool["function"]["name"], k)
    assert not world.retail_typed({"item_ids": [1, 2]}) and not world.retail_typed({"order_id": ["#W1"]})


def trip(seed: int, passengers: int = 2, cabin: str = "economy"):
    """A traveller with a round trip booked, and flights on sale beside it (each its own number)."""
    rng = random.Random(seed)
    user = world.airline_user(rng.randrange(2**31))
    out = world.airline_flight(rng.randrange(2**31), "JFK", "LAX", dates=("2024-05-20", "2024-05-21"), number="HAT010")
    back = world.airline_flight(rng.randrange(2**31), "LAX", "JFK", dates=("2024-05-24",), number="HAT011")
    gone = world.airline_flight(rng.randrange(2**31), "JFK", "LAX", ("2024-05-10",), status="landed", number="HAT012")
    flights = [out, back, gone]
    flights += [
        world.airline_flight(rng.randrange(2**31), "JFK", "LAX", ("2024-05-20",), status, number="HAT%03d" % (20 + i))
        for i, status in enumerate(world.FLIGHT_STATUSES)
    ]
    legs = [(out, "2024-05-20"), (back, "2024-05-24")]
    booked = world.airline_reservation(rng.randrange(2**31), user, legs, cabin, passengers, "yes", (3, 1))
    past = world.airline_reservation(rng.randrange(2**31), user, [(gone, "2024-05-10")], "business")
    # a round trip of four legs through Denver, on flights of mixed states by date
    hops = [("JFK", "DEN"), ("DEN", "SEA"), ("SEA", "DEN"), ("DEN", "JFK")]
    mixed = {"2024-05-12": "landed", "2024-05-18": "cancelled", "2024-05-19": "delayed"}
    via = [
        world.airline_flight(rng.randrange(2**31), a, b, ("2024-05-17",), mixed, number="HAT%03d" % (40 + i))
        for i, (a, b) in enumerate(hops)
    ]
    dates = ["2024-05-17", "2024-05-17", "2024-05-12", "2024-05-12"]
    far = world.airline_reservation(rng.randrange(2**31), user, list(zip(via, dates)), cabin, 1, "no", (0, 0))
    return user, [booked, past, far], [*flights, *via]


def tau2_airline(users: list, reservations: list, flights: list):
    from tau2.domains.airline.data_model import FlightDB
    from tau2.domains.airline.tools import AirlineTools

    data = json.loads(json.dumps({"users": users, "reservations": reservations, "flights": flights}))
    by = {"users": "user_id", "reservations": "reservation_id", "flights": "flight_number"}
    return AirlineTools(FlightDB.model_validate({k: {r[by[k]]: r for r in v} for k, v in data.items()}))


def airline_calls(user: dict, reservations: list, rng: random.Random) -> list[tuple[str, dict]]:
    booked, past, far = (r["reservation_id"] for r in reservations)
    methods = sorted(user["payment_methods"])
    [gift] = [m for m in methods if m.startswith("gift_card")]  # $350 of bags: more than any gift card holds
    people = [dict(p, first_name=p["first_name"] + "e") for p in reservations[0]["passengers"]]
    return [
        ("get_user_details", {"user_id": user["user_id"]}),
        ("get_user_details", {"user_id": "nobody_1"}),
        ("get_reservation_details", {"reservation_id": booked}),
        ("get_reservation_details", {"reservation_id": "ZZZZZZ"}),
        ("list_all_airports", {}),
        *[("get_flight_status", {"flight_number": "HAT%03d" % n, "date": "2024-05-20"}) for n in range(20, 26)],
        ("get_flight_status", {"flight_number": "HAT012", "date": "2024-05-20"}),  # not on that date
        ("get_flight_status", {"flight_number": "HAT999", "date": "2024-05-20"}),
        ("search_direct_flight", {"origin": "JFK", "destination": "LAX", "date": "2024-05-20"}),
        ("search_direct_flight", {"origin": "LAX", "destination": "JFK", "date": "2024-05-24"}),
        ("search_direct_flight", {"origin": "BOS", "destination": "LAX", "date": "2024-05-20"}),
        ("search_direct_flight", {"origin": None, "destination": "LAX", "date": "2024-05-20"}),  # None: any
        ("search_direct_flight", {"origin": "DEN", "destination": None, "date": "2024-05-17"}),
        ("get_flight_status", {"flight_number": "HAT041", "date": "2024-05-18"}),
        ("get_reservation_details", {"reservation_id": far}),
        (
            "update_reservation_baggages",
            {"reservation_id": far, "total_baggages": 1, "nonfree_baggages": 1, "payment_id": gift},
        ),
        (
            "update_reservation_passengers",
            {"reservation_id": far, "passengers": [{"first_name": "A", "last_name": "B"}]},
        ),
        (
            "update_reservation_passengers",
            {"reservation_id": far, "passengers": [{"first_name": "A", "last_name": "B", "dob": 1}]},
        ),
        ("update_reservation_passengers", {"reservation_id": booked, "passengers": people[:1]}),
        ("update_reservation_passengers", {"reservation_id": booked, "passengers": people}),
        ("update_reservation_passengers", {"reservation_id": "ZZZZZZ", "passengers": people}),
        *[
            (
                "update_reservation_baggages",
                {"reservation_id": booked, "total_baggages": t, "nonfree_baggages": n, "payment_id": m},
            )
            for t, n, m in [
                (9, 9, gift),
                *[(4, 2, m) for m in rng.sample(methods, len(methods))],
                (5, 3, "paypal_0"),
                (1, 0, methods[0]),
            ]
        ],
        ("send_certificate", {"user_id": user["user_id"], "amount": 150}),
        ("send_certificate", {"user_id": user["user_id"], "amount": 50}),
        ("send_certificate", {"user_id": "nobody_1", "amount": 50}),
        ("cancel_reservation", {"reservation_id": booked}),
        ("cancel_reservation", {"reservation_id": booked}),  # tau2 refunds again: so does the kit
        ("cancel_reservation", {"reservation_id": "ZZZZZZ"}),
        ("get_reservation_details", {"reservation_id": past}),
        ("get_user_details", {"user_id": user["user_id"]}),
        ("calculate", {"expression": "(883 + 779) * 3 - 100"}),
    ]


@pytest.mark.parametrize("cabin", world.CABINS)
def test_the_kit_answers_every_airline_call_as_tau2_bench_does(cabin):
    from tau2.environment.environment import Environment

    for seed in range(12):
        user, reservations, flights = trip(seed, passengers=1 + seed % 3, cabin=cabin)
        tools = tau2_airline([user], reservations, flights)
        for name, args in airline_calls(user, reservations, random.Random(seed)):
            ours = world.airline_answer([user], reservations, flights, name, args)
            try:
                theirs = Environment.to_json_str(getattr(tools, name)(**args))
            except ValueError as exc:
                theirs = f"Error: {exc}"
            if "validation error for Passenger" in theirs:  # pydantic's words; the kit's are its own
                assert ours == "Error: a passenger has first_name, last_name and dob, each a string", ours
            elif theirs.startswith(("{", "[")):  # a record or a list: the same fields and values
                assert json.loads(ours) == json.loads(theirs), (name, args)
            else:  # a status, a message or an error, word for word
                assert ours == theirs, (name, args)
    assert world.airline_answer([user], reservations, flights, "book_reservation", {}) is None  # left to the env


def test_airline_records_and_answers_have_the_targets_frozen_shapes():
    shapes = load_result_shapes(REPO / "env_registry" / "tau2-airline")
    for seed in range(10):
        user, reservations, flights = trip(seed)
        for name, args in airline_calls(user, reservations, random.Random(seed)):
            answer = world.airline_answer([user], reservations, flights, name, args)
            assert result_problems(shapes, name, answer) == [], (name, answer)


def test_airline_records_refuse_what_tau2_would_not_hold():
    user = world.airline_user(1)
    with pytest.raises(ValueError, match="payment sources are"):
        world.airline_user(1, payment=("paypal",))  # retail's, not airline's
    with pytest.raises(ValueError, match="a membership is one of"):
        world.airline_user(1, membership="platinum")
    with pytest.raises(ValueError, match="two of the IATA codes"):
        world.airline_flight(1, "JFK", "JFK")
    with pytest.raises(ValueError, match="a flight's status is one of"):
        world.airline_flight(1, status="boarding")
    with pytest.raises(ValueError, match="a flight's status is one of"):
        world.airline_flight(1, status={"2024-05-20": "boarding"})
    flight = world.airline_flight(2)
    for bad, match in [
        ({"insurance": "maybe"}, "insurance is"),
        ({"passengers": 0}, "passengers is at least 1"),
        ({"bags": (1, 2)}, "non-free <= total"),
        ({"back": 1}, "back is the index"),  # (not a round trip)
    ]:
        with pytest.raises(ValueError, match=match):
            world.airline_reservation(3, user, [(flight, "2024-05-16"), (flight, "2024-05-17")], **bad)
    rng = random.Random(4)
    there = world.airline_flight(rng.randrange(2**31), "BOS", "MIA", number="HAT100")
    home = world.airline_flight(rng.randrange(2**31), "MIA", "BOS", number="HAT101")
    trip_back = world.airline_reservation(5, user, [(there, "2024-05-16"), (home, "2024-05-16")])
    assert (trip_back["flight_type"], trip_back["destination"]) == ("round_trip", "MIA")
    with pytest.raises(ValueError, match="back is the index"):
        world.airline_reservation(5, user, [(there, "2024-05-16"), (home, "2024-05-16")], back=2)
    paid = user["payment_methods"][trip_back["payment_history"][0]["payment_id"]]
    assert paid["source"] == "credit_card"  # by default a card or gift card pays, as tau2's bookings are paid
    with pytest.raises(ValueError, match="a cabin is one of"):
        world.airline_reservation(3, user, [(flight, "2024-05-16")], cabin="first")
    with pytest.raises(ValueError, match="not a payment method of the user"):
        world.airline_reservation(3, user, [(flight, "2024-05-16")], paid_with="credit_card_0")
    with pytest.raises(ValueError, match="at least one leg"):
        world.airline_reservation(3, user, [])
    log: list = []
    read = {"type": "tool_call", "name": "get_user_details", "arguments": {"user_id": user["user_id"]}}
    assert json.loads(world.airline_step(log, [user], [], [flight], read)["observation"]) == user
    assert world.airline_play([user], [], [flight], dict(read, arguments={"user_id": "x"}))[2:] == (
        "Error: User x not found",
        False,
    )
    assert world.called(log, "get_user_details") == [{"user_id": user["user_id"]}]
