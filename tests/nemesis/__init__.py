"""The nemesis suite: workloads under network, process, server and clock faults, and a checker.

A *run* starts a server (or a Sentinel group) with a :class:`FaultProxy`
in front of every client, worker processes of one framework, and a
producer; it enqueues tasks with unique keys, injects one fault while they
run, heals it, drains the queue, and hands everything the processes logged
to :func:`checker.check`, which says what went wrong in Jepsen's terms
(lost, unexpected, duplicated beyond what was in flight, wrong or stale
results, stuck, left reserved, started after the lease expired, producers
that hung). See docs/reliability.md.

- ``history``: what a run logged, read back as sends, runs, results, faults;
- ``checker``: the verdict on a history (unit-tested on synthetic ones);
- ``faults``: the faults, each ``inject`` and ``heal``;
- ``workloads``: SimpleBroker's ``Queue``, Taskiq, Celery and Protean, each
  a producer, worker processes and a result reader;
- ``scenario``: one run, start to verdict; ``campaign``: ``make nemesis``.
"""
