"""The dashboard's actions on dead letters, and a queue's messages as a page sees them.

Each action is one script, so all or nothing: ``requeue`` (retry: pending
in a target queue with the same IDs, delivery counts cleared;
``dead_letter_requeue.lua``), ``delete`` (named dead letters;
``delete_ids.lua``) and ``purge`` (every message of the dead-letter queue;
``delete_queues.lua``). Input is checked before anything runs; who may act
is :mod:`.access`'s to decide, before this module is reached.
"""

from __future__ import annotations

from typing import Any

from simplebroker_redis.calls import delete_ids, delete_queues
from simplebroker_redis.calls.operations import dead_letter_requeue
from simplebroker_redis.queue_names import shown_queue
from simplebroker_redis.runner import AsyncRedisRunner
from simplebroker_redis.types import QueueView
from simplebroker_redis.validation import validate_queue_name

from .tasks import source_of


async def perform(
    runner: AsyncRedisRunner, queue: str, action: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Run one action (one script); raise ValueError for bad input, before any change."""
    validate_queue_name(queue)
    if action == "purge":
        deleted = await runner.run(delete_queues([queue]))
        return {"action": "purge", "queue": queue, "deleted": deleted}
    if action == "delete":
        deleted = await runner.run(delete_ids(queue, message_ids(body.get("ids"))))
        return {"action": "delete", "queue": queue, "deleted": deleted}
    if action != "requeue":
        raise ValueError(f"unknown action {action!r}")
    target = body.get("target")
    if not isinstance(target, str):
        raise ValueError("requeue needs a target queue")
    validate_queue_name(target)
    raw = body.get("ids")
    selected = None if raw is None else message_ids(raw)
    moved = await runner.run(dead_letter_requeue(queue, target, selected))
    return {"action": "requeue", "queue": queue, "target": target, "moved": moved}


def message_ids(raw: object) -> list[int]:
    """Return the IDs of a request: digit strings, or integers.

    Pages send strings: JavaScript's numbers lose 19-digit IDs.
    """
    if not isinstance(raw, list) or not raw:
        raise ValueError("ids must be a non-empty list of message ids")
    ids = []
    for item in raw:
        if isinstance(item, str) and item.isdigit() and len(item) <= 19:
            ids.append(int(item))
        elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 2**63:
            ids.append(item)
        else:
            raise ValueError(f"not a message id: {item!r}")
    return ids


def queue_json(
    name: str, dead: bool, view: QueueView, holders: dict[str, str], now_us: int
) -> dict[str, Any]:
    """Return a queue's messages per state as the page shows them."""
    journal = {entry.id: entry for entry in view.journal}
    states = {}
    for part in view.states:
        messages = []
        for message in part.messages:
            item: dict[str, Any] = {
                # As a string too: JavaScript numbers lose IDs above 2**53.
                "id": str(message.id),
                "body": message.body,
                "size": message.size,
                "deliveries": message.deliveries,
            }
            if part.state == "delayed" and message.until_us is not None:
                item["due_in"] = (message.until_us - now_us) / 1e6
            if part.state == "reserved":
                item["holder"] = holders.get(message.token, "")
                item["token"] = message.token
                if message.until_us is not None:
                    item["lease_expires_in"] = (message.until_us - now_us) / 1e6
            if dead:
                entry = journal.get(message.id)
                if entry is not None:
                    item["reason"] = f"delivered {entry.deliveries} times (max deliveries)"
                    item["source"] = entry.queue
                    item["deliveries"] = max(message.deliveries, entry.deliveries)
                else:
                    # The journal keeps only unreported entries (a Taskiq worker
                    # reports each at once); a rejected message never had one.
                    item["reason"] = "rejected by its worker, or dead-lettered and reported"
            messages.append(item)
        states[part.state] = {"count": part.count, "messages": messages}
    requeue_to = source_of(name) if dead else ""
    return {
        "queue": name,
        "shown": shown_queue(name),
        "dead_letter": dead,
        "states": states,
        "requeue_to": requeue_to,
    }
