"""Consumer processes of one group racing while messages are published.

Three processes read one group (each copies the log into the group when
it finds it behind, and reserves) while the test process publishes; every
message must be handled exactly once by the group, and a second group,
read afterwards, must get all of them in publish order.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
from phelpers import HERE, handler_calls

from support.waiting import wait_for

# Racing consumer processes: their server side is the lease scripts, which
# every other test runs on each server binary.
pytestmark = pytest.mark.once

COUNT = 200

CONSUMER = textwrap.dedent(
    """
    import json, os, sys, time
    from protean.domain import Domain
    from protean_simplebroker import SimpleBrokerBroker
    import papp
    broker = SimpleBrokerBroker("default", Domain(name="race"), papp.conn_info())
    log = os.environ["PBK_LOG"]
    broker.read_blocking("race", "g", "c", timeout_ms=0)  # connected, group registered
    print("ready", flush=True)
    seen = 0
    while seen < int(sys.argv[1]):
        for identifier, payload in broker.read_blocking("race", "g", "c", timeout_ms=500, count=7):
            time.sleep(0.01)  # a handler's work: 200 take one process 2 s, so all share them
            line = {"id": identifier, "n": payload["n"], "pid": os.getpid()}
            with open(log, "a") as out:
                out.write(json.dumps(line) + "\\n")
            assert broker.ack("race", identifier, "g")
        seen = sum(1 for _ in open(log))
    broker.close()
    """
)


def test_processes_racing_on_one_group_handle_each_message_once(
    broker, worker_env, events, tmp_path
):
    script = tmp_path / "consume.py"
    script.write_text(CONSUMER)
    consumers = [
        subprocess.Popen(
            [sys.executable, str(script), str(COUNT)],
            env=worker_env,
            cwd=str(HERE),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for consumer in consumers:  # each says so once it reads the group
            assert consumer.stdout is not None and consumer.stdout.readline() == "ready\n"
        ids: list[str] = []
        publishers = [
            threading.Thread(
                target=lambda start=start: ids.extend(
                    broker.publish("race", {"n": n}) for n in range(start, COUNT, 2)
                )
            )
            for start in (0, 1)
        ]
        for thread in publishers:
            thread.start()
        for thread in publishers:
            thread.join(60)
        wait_for(lambda: len(handler_calls(events)) >= COUNT, timeout=60, what="every message")
        for consumer in consumers:
            assert consumer.wait(30) == 0
    finally:
        for consumer in consumers:
            consumer.kill()
    handled = [event["id"] for event in handler_calls(events)]
    assert sorted(handled) == sorted(ids), "each message exactly once in the group"
    assert len({event["pid"] for event in handler_calls(events)}) > 1, "the consumers shared them"
    # Another group gets the whole stream, in publish (ID) order.
    late = []
    while taken := broker.read("race", "late", 50):
        late += [identifier for identifier, _ in taken]
    assert late == sorted(ids, key=int)
