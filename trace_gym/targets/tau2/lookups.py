"""The reads an agent needs before τ²-retail's gold actions.

tau2's gold action lists are written for its evaluator, which compares the final
database: 31 of retail's 74 train tasks list their writes alone, with order and
item ids the agent was never shown (``cancel_pending_order`` of an order it never
looked up, an exchange into an item id from no product it read). Played as a
demonstration, such a list teaches a model to write ids out of nowhere.
``with_lookups`` puts in front of them what a careful agent does: authenticate
the user as the scenario allows (by email when the user knows it, else by name
and zip), read the user, then read each order before its first write and each
product whose item a write chooses. Reads change no state, so tau2 scores the
result exactly as it scores the gold list.

It reads the task's initial database, never the agent's episode, and it must not
drop or reorder a gold action.
"""

from __future__ import annotations

from typing import Any

from ...tools import changes_state, is_read

AUTHENTICATE = ("find_user_id_by_email", "find_user_id_by_name_zip")


def with_lookups(actions: list[tuple[str, dict[str, Any]]], db: Any, scenario: str) -> list[tuple[str, dict[str, Any]]]:
    """``actions`` ((name, arguments) pairs, tau2's gold order) with the reads their
    ids come from put in front; unchanged where no user can be told from them or
    from ``scenario`` (the user's instructions, as text)."""
    user = _user_of(actions, db, scenario)
    if user is None:
        return list(actions)
    out: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()

    def read(name: str, arguments: dict[str, Any]) -> None:
        key = f"{name}|{sorted(arguments.items())}"
        if key not in seen:
            seen.add(key)
            out.append((name, arguments))

    if not any(name in AUTHENTICATE for name, _ in actions):
        if user.email in scenario:
            read("find_user_id_by_email", {"email": user.email})
        else:
            name = user.name
            read(
                "find_user_id_by_name_zip",
                {"first_name": name.first_name, "last_name": name.last_name, "zip": user.address.zip},
            )
        read("get_user_details", {"user_id": user.user_id})
    for name, arguments in actions:
        if changes_state(name):
            order = arguments.get("order_id")
            if order in db.orders:
                read("get_order_details", {"order_id": order})
            for product in _products_of(arguments.get("new_item_ids") or [], db):
                read("get_product_details", {"product_id": product})
        if is_read(name):
            seen.add(f"{name}|{sorted(arguments.items())}")
        out.append((name, arguments))
    return out


def _user_of(actions: list[tuple[str, dict[str, Any]]], db: Any, scenario: str) -> Any:
    """The user the task is about: named by a gold action (a user id, or an order's
    owner), else the one the scenario names by user id, email, or name and zip."""
    for _, arguments in actions:
        if arguments.get("user_id") in db.users:
            return db.users[arguments["user_id"]]
        if arguments.get("order_id") in db.orders:
            return db.users.get(db.orders[arguments["order_id"]].user_id)
    for user in db.users.values():
        if user.user_id in scenario or user.email in scenario:
            return user
    named = [
        u
        for u in db.users.values()
        if f"{u.name.first_name} {u.name.last_name}" in scenario and u.address.zip in scenario
    ]
    return named[0] if len(named) == 1 else None


def _products_of(item_ids: list[str], db: Any) -> list[str]:
    """The products whose variants hold ``item_ids``, in first-mention order."""
    found: list[str] = []
    for item in item_ids:
        for product in db.products.values():
            if item in product.variants and product.product_id not in found:
                found.append(product.product_id)
    return found
