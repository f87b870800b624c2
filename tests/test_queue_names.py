"""The one mapping of the frameworks' queue names onto SimpleBroker's, and back for people."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simplebroker.ext import QueueNameError

import celery_simplebroker
import taskiq_simplebroker.routing
from simplebroker_redis.ops.dashboard.live import state_json
from simplebroker_redis.ops.observe import combine
from simplebroker_redis.queue_names import MAX_QUEUE, shown_queue, storage_queue
from simplebroker_redis.types import QueueDepth, Snapshot
from simplebroker_redis.validation import validate_queue_name

#: Characters names are drawn from: the ones that matter to the mapping, and any.
_CHARS = st.one_of(
    st.sampled_from([*"aZ09_.-:@ /", "-2D", "-3A", "--", "\u00e9", "\U0001f600"]),
    st.characters(codec="utf-8"),
)
NAMES = st.lists(_CHARS, min_size=1, max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(NAMES)
def test_every_name_is_stored_under_a_valid_name_that_shows_it_again(name: str) -> None:
    stored = storage_queue(name)
    assert validate_queue_name(stored) == stored
    assert shown_queue(stored) == name  # an inverse: no two names share a queue


@settings(max_examples=200, deadline=None)
@given(NAMES, NAMES)
def test_two_names_never_share_a_queue(first: str, second: str) -> None:
    assert (storage_queue(first) == storage_queue(second)) == (first == second)


@pytest.mark.parametrize(
    ("name", "stored"),
    [
        ("celery", "celery"),
        ("my-queue", "my-queue"),
        ("taskiq:queue", "taskiq-3Aqueue"),
        ("celery@host.celery.pidbox", "celery-40host.celery.pidbox"),
        # Pairs the first mapping (Celery's own) stored under one name:
        ("a-3Ab", "a-2D3Ab"),
        ("a:b", "a-3Ab"),
        ("-abc", "_-2Dabc"),
        ("_-abc", "_-abc"),
        ("_x:y", "_-5Fx-3Ay"),
    ],
)
def test_names_the_docs_give(name: str, stored: str) -> None:
    assert storage_queue(name) == stored
    assert shown_queue(stored) == name


def test_long_names_end_in_a_digest_and_stay_apart() -> None:
    first, second = "x" * 600 + "1", "x" * 600 + "2"
    assert storage_queue(first) != storage_queue(second)
    assert all(len(storage_queue(name)) == MAX_QUEUE for name in (first, second))
    assert shown_queue(storage_queue(first)) == storage_queue(first)  # shown as stored


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(QueueNameError):
        storage_queue("")


def test_every_integration_uses_this_mapping() -> None:
    assert celery_simplebroker.storage_queue is storage_queue
    assert taskiq_simplebroker.routing.storage_queue is storage_queue


def test_the_dashboard_shows_the_frameworks_names() -> None:
    depths = tuple(
        QueueDepth(storage_queue(name), 1, 0, 0, 0, None) for name in ("taskiq:queue", "plain")
    )
    snapshot = Snapshot(now_us=1, cursor="", dead_letter_targets=(), queues=depths)
    state = state_json(combine([snapshot]), "ns")
    assert [(q["name"], q["shown"]) for q in state["queues"]] == [
        ("taskiq-3Aqueue", "taskiq:queue"),
        ("plain", "plain"),
    ]
