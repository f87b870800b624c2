"""Message-ID arithmetic inside the scripts (IDs exceed Lua's exact doubles)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simplebroker.ext import TimestampError

from simplebroker_redis import calls
from simplebroker_redis.errors import ScriptConflict
from simplebroker_redis.keys import format_id
from simplebroker_redis.scripts import script_source

IDS = st.integers(min_value=0, max_value=2**63 - 2)


@pytest.fixture
def lib(raw, runner):
    """Evaluate a Lua expression with the script library loaded."""
    # write.lua needs the ID helpers, so its prelude includes them.
    prelude = script_source("write").split("-- ==== write.lua ====")[0]

    def run(expression: str, *args: str) -> object:
        keys = list(runner.keys.fixed_keys)
        return raw.eval(f"{prelude}\nreturn {expression}", len(keys), *keys, "", *args)

    return run


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # the fixture is a stateless evaluator
@given(value=IDS)
def test_id_mod4096_and_increment_match_python(lib, value):
    text = format_id(value)
    assert lib("id_mod4096(ARGV[2])", text) == value % 4096
    assert lib("id_incr(ARGV[2])", text) == format_id(value + 1)


def test_increment_carries_across_every_digit(lib):
    assert lib("id_incr(ARGV[2])", "0000000000000000999") == "0000000000000001000"
    assert lib("id_incr(ARGV[2])", "0999999999999999999") == "1000000000000000000"


@pytest.mark.parametrize(
    ("last", "candidate", "expected"),
    [
        (1000 * 4096 + 5, 2000 * 4096, 2000 * 4096),  # candidate ahead: used as is
        (1000 * 4096 + 5, 1000 * 4096, 1000 * 4096 + 6),  # behind: high-water + 1
        (1000 * 4096 + 5, 999 * 4096, 1000 * 4096 + 6),
    ],
)
def test_write_takes_the_larger_of_candidate_and_high_water(
    broker, runner, raw, namespace, last, candidate, expected
):
    raw.hset(f"sb:{{{namespace}}}:meta", "last_ts", format_id(last))
    committed = runner.run(calls.write("q", "body", candidate))
    assert int(committed) == expected
    assert raw.hget(f"sb:{{{namespace}}}:meta", "last_ts") == format_id(expected)


def test_exhausted_counter_is_refused_before_any_write(broker, runner, raw, namespace):
    last = 1000 * 4096 + 4095
    raw.hset(f"sb:{{{namespace}}}:meta", "last_ts", format_id(last))
    with pytest.raises(ScriptConflict) as info:
        runner.run(calls.write("q", "body", 1000 * 4096))
    assert info.value.code == "CLOCK"
    assert int(info.value.detail) == last
    assert raw.zcard(f"sb:{{{namespace}}}:pending") == 0
    assert raw.hget(f"sb:{{{namespace}}}:meta", "last_ts") == format_id(last)


def test_existing_id_above_high_water_is_refused_then_skipped(broker, raw, namespace):
    next_id = broker.write("q", "a") + 1
    # Damaged data: a body exists above the high-water mark.
    raw.hset(f"sb:{{{namespace}}}:bodies", format_id(next_id), "ghost")
    raw.hset(f"sb:{{{namespace}}}:meta", "last_ts", format_id(next_id - 1))
    committed = broker.write("q", "b")  # may collide once, then moves past it
    assert committed != next_id
    assert broker.peek_one("q", exact_timestamp=committed) == ("b", committed)


def test_broadcast_borrows_following_grains_for_large_fan_out(broker, raw, namespace):
    names = [f"q{i}" for i in range(5000)]
    # Exact names: one client candidate per queue, all distinct and increasing.
    assert broker.broadcast("x", queue_names=names, create_missing=True) == 5000
    first = sorted(int(m.split()[1]) for m in raw.zrange(f"sb:{{{namespace}}}:pending", 0, -1))
    assert len(set(first)) == 5000
    # Patternless: the script selects the 5000 queues itself and allocates
    # consecutive IDs from one candidate, borrowing the next grains.
    assert broker.broadcast("y") == 5000
    every = [int(m.split()[1]) for m in raw.zrange(f"sb:{{{namespace}}}:pending", 0, -1)]
    second = sorted(set(every) - set(first))
    assert len(second) == 5000
    assert second[0] > first[-1]
    assert second[-1] - second[0] == 4999


def test_id_range_end_is_a_timestamp_error(broker, raw, namespace):
    broker.delete_message_ids("seed", [broker.write("seed", "x")])  # warm the ID cache
    raw.hset(f"sb:{{{namespace}}}:meta", "last_ts", format_id(2**63 - 1))
    with pytest.raises(TimestampError):
        broker.broadcast("x", queue_names=["a", "b"], create_missing=True)
    assert broker.list_queues() == []
