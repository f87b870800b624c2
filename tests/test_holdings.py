"""A worker never recovers its own live reservations, and knows when its leases run out.

- A reservation made for a holder spares that holder's expired tokens in
  its recovery step (``upkeep``); anyone else's recovers them.
- ``recover`` spares the tokens it is told the caller holds.
- ``renewal`` returns the server's time, from which ``Holdings`` knows each
  lease's deadline; ``Holdings.standing`` turns EXPIRED once the server's
  time (as estimated here, never behind it) passes it, LOST only when a
  renewal found the token taken over, LET_GO once this process settled or
  handed back every message of it (however the server answers since).
- A heartbeat cut off from the server for longer than the lease keeps its
  process's reservations: at the heal it renews them, recovers none of
  them, and reports none lost.
"""

from __future__ import annotations

import logging
import time

import pytest

from simplebroker_redis import Leases, RedisRunner
from simplebroker_redis.calls import new_holder
from simplebroker_redis.calls.base import new_token
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer
from simplebroker_redis.heartbeat import Holdings, LeaseHeartbeat, ServerClock, Standing
from simplebroker_redis.lease_timing import lease_timing
from support.faultproxy import FaultProxy
from support.waiting import wait_for


def _expired_reservation(broker: RedisBrokerCore, leases: Leases, holder: str | None):
    broker.write("jobs", "a")
    lease = leases.reserve("jobs", 1, 0.05, holder=holder)
    assert lease.messages
    # Expired on the server's clock: the deadline is behind its TIME.
    wait_for(
        lambda: _server_ns(leases.runner) > lease.deadline_ns + 10_000_000,
        timeout=5,
        what="the lease to run out",
        interval=0.01,
    )
    return lease


def _server_ns(runner: RedisRunner) -> int:
    seconds, micros = runner.execute(lambda client: client.time())
    return int(seconds) * 1_000_000_000 + int(micros) * 1000


def test_a_holders_own_reservation_spares_its_expired_tokens(broker, runner):
    leases = Leases(runner)
    mine = new_holder()
    lease = _expired_reservation(broker, leases, mine)
    assert lease.token.startswith(mine + ".")
    broker.write("other", "b")
    leases.reserve("other", 1, 30, holder=mine)  # its upkeep spares my token
    assert leases.renew([lease.token]) == set(), "my own reservation recovered my token"
    # Anyone else's reservation (or none named) recovers it.
    lease = _expired_reservation(broker, leases, mine)
    leases.reserve("other", 1, 30, holder=new_holder())
    assert leases.renew([lease.token]) == {lease.token}


def test_an_ordered_reservation_spares_its_holders_tokens_too(broker, runner):
    leases = Leases(runner)
    mine = new_holder()
    lease = _expired_reservation(broker, leases, mine)
    broker.write("other", "b")
    multi = leases.reserve_queues([("other", None)], 1, 30, holder=mine)
    assert multi.leases[0].token.startswith(mine + ".")
    assert leases.renew([lease.token]) == set()


def test_recovery_spares_the_tokens_it_is_told_are_held(broker, runner):
    leases = Leases(runner)
    mine = new_holder()  # (so that the second reservation spares the first)
    held = _expired_reservation(broker, leases, mine)
    given_up = _expired_reservation(broker, leases, mine)
    recovery = leases.recover(spare=[held.token])
    assert (recovery.tokens, recovery.released) == (1, 1)
    assert leases.renew([held.token, given_up.token]) == {given_up.token}


def test_spared_tokens_do_not_hide_the_rest_from_a_batch(broker, runner):
    leases = Leases(runner)
    mine = new_holder()
    spared = [_expired_reservation(broker, leases, mine).token for _ in range(3)]
    others = [_expired_reservation(broker, leases, mine).token for _ in range(2)]
    total = 0
    for _ in range(5):
        recovery = leases.recover(max_tokens=1, spare=spared)
        total += recovery.tokens
        if not recovery.more:
            break
    assert total == 2
    assert leases.renew(spared + others) == set(others)


def test_a_holder_is_hex(runner):
    with pytest.raises(ValueError, match="holder"):
        new_token("not hex!")
    assert new_token("ab12").startswith("ab12.")


def test_renewal_gives_the_deadline_and_standing_follows_it(broker, runner):
    leases = Leases(runner)
    holdings = Holdings()
    broker.write("jobs", "a")
    sent = time.monotonic()
    lease = leases.reserve("jobs", 1, 0.5, holder=holdings.holder)
    holdings.clock.observe(lease.created_ns, sent)
    holdings.hold(lease.token, 1, lease.deadline_ns)
    assert holdings.standing(lease.token) is Standing.HELD
    sent = time.monotonic()
    renewal = leases.renewal([lease.token], 0.5)
    holdings.clock.observe(renewal.now_ns, sent)
    holdings.renewed([lease.token], renewal.now_ns + 500_000_000)
    assert renewal.lost == frozenset()
    assert holdings.deadline_ns(lease.token) == renewal.now_ns + 500_000_000
    wait_for(
        lambda: holdings.standing(lease.token) is Standing.EXPIRED,
        timeout=5,
        what="the estimate to pass the deadline",
    )
    # The estimate is never behind the server: the server agrees it ran out.
    assert _server_ns(runner) >= holdings.deadline_ns(lease.token)
    holdings.let_go(lease.token)
    assert holdings.standing(lease.token) is Standing.LET_GO


def test_the_server_clock_estimate_is_never_behind_the_server(runner):
    clock = ServerClock()
    assert clock.now_ns() is None
    for _ in range(20):
        sent = time.monotonic()
        clock.observe(_server_ns(runner), sent)
        after = _server_ns(runner)
        estimate = clock.now_ns()
        assert estimate is not None
        # Taken after the server's reading: at least that reading (1 us grain).
        assert estimate >= after - 1000


def test_a_settling_token_found_gone_is_not_lost():
    holdings = Holdings()
    holdings.hold("t", 2)
    holdings.settling("t")
    assert holdings.busy()  # one message is neither acknowledged nor being acknowledged
    holdings.settling("t")
    assert not holdings.busy()
    assert holdings.drop_lost(["t"]) == set()
    assert holdings.standing("t") is Standing.LET_GO
    holdings.hold("u", 2)
    holdings.settling("u")
    assert holdings.drop_lost(["u"]) == {"u"}
    assert holdings.standing("u") is Standing.LOST


def test_only_a_token_taken_over_reads_lost(broker, runner):
    """LOST means another worker took it; what this process let go of never reads so (issue 42).

    An event loop checks its delivered tasks while other threads settle
    them: a token whose last message was just acknowledged, handed back
    or settled by a result's script is gone here and, a moment later, on
    the server too; neither makes it a takeover.
    """
    leases = Leases(runner)
    holdings = Holdings()
    for body in "abc":
        broker.write("jobs", body)
    acked, handed_back, taken = (
        leases.reserve("jobs", 1, 30, holder=holdings.holder) for _ in range(3)
    )
    for lease in (acked, handed_back, taken):
        holdings.hold(lease.token, 1, lease.deadline_ns)
    holdings.settling(acked.token)
    assert leases.ack(acked.token, None, delete=True).settled == 1
    assert holdings.standing(acked.token) is Standing.HELD  # until its settlement is over
    holdings.settled(acked.token)
    holdings.let_go(handed_back.token)
    leases.release(handed_back.token)
    leases.release(taken.token)  # as a recovery elsewhere would: this process still holds it
    gone = leases.renew([acked.token, handed_back.token, taken.token])
    assert gone == {acked.token, handed_back.token, taken.token}  # the server knows none of them
    assert holdings.drop_lost(gone) == {taken.token}
    assert holdings.standing(acked.token) is Standing.LET_GO
    assert holdings.standing(handed_back.token) is Standing.LET_GO
    assert holdings.standing(taken.token) is Standing.LOST
    assert holdings.standing("never-held") is Standing.LET_GO


def test_a_settled_message_stops_counting_as_settling():
    """The rest of a token, not being settled, is still reported lost when it is taken over."""
    holdings = Holdings()
    holdings.hold("t", 2)  # one message acknowledged, the other still prefetched
    holdings.settling("t")
    holdings.settled("t")
    assert holdings.holds("t") and holdings.busy()
    assert holdings.drop_lost(["t"]) == {"t"}
    holdings.hold("u", 2)
    holdings.settling("u")
    holdings.unsettle("u")  # the acknowledgement failed: both are held as before
    assert holdings.drop_lost(["u"]) == {"u"}
    holdings.hold("v", 1)
    holdings.settling("v")
    assert holdings.settled("v") and not holdings.holds("v")
    assert not holdings.settled("v")


@pytest.fixture
def proxy(server: DevServer) -> FaultProxy:
    with FaultProxy(("127.0.0.1", server.port)) as p:
        yield p


def test_a_heartbeat_cut_off_past_its_lease_keeps_its_reservations(
    proxy: FaultProxy, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    direct = RedisRunner(f"redis://127.0.0.1:{proxy.upstream[1]}/0", namespace=namespace)
    cut = RedisRunner(proxy.url() + "?socket_timeout=0.5", namespace=namespace)
    timing = lease_timing(1.0, 0.25, 0.25)
    holdings = Holdings()
    heartbeat = LeaseHeartbeat(cut, holdings, timing, framework="taskiq")
    try:
        core, leases = RedisBrokerCore(direct), Leases(direct)
        for body in ("a", "b"):
            core.write("jobs", body)
        lease = leases.reserve("jobs", 2, 1.0, holder=holdings.holder)
        holdings.hold(lease.token, 2, lease.deadline_ns)
        with caplog.at_level(logging.INFO, logger="taskiq_simplebroker"):
            heartbeat.start()
            wait_for(lambda: heartbeat.renewals >= 2, timeout=10, what="renewals")
            proxy.blackhole()
            # 2.5 leases cut off: the held token expires on the server.
            wait_for(
                lambda: holdings.standing(lease.token) is Standing.EXPIRED,
                timeout=10,
                what="the lease to run out",
            )
            time.sleep(1.5)  # the fault's length, not a wait for readiness
            renewals = heartbeat.renewals
            proxy.heal()
            wait_for(lambda: heartbeat.renewals > renewals, timeout=10, what="a renewal")
            # Another process's recovery now finds nothing of ours to take.
            assert leases.recover().released == 0
        assert holdings.holds(lease.token)
        assert holdings.standing(lease.token) is Standing.HELD
        assert heartbeat.recovered == 0
        assert "could renew them" not in caplog.text
        assert "reaches the server again" in caplog.text
    finally:
        heartbeat.stop()
        proxy.heal()
        cut.shutdown()
        direct.shutdown()
