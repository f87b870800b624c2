"""One typed call per Lua script: what it sends, and how its reply is read.

Each builder validates its arguments and returns a :class:`Call`: the
script to run, its ``ARGV`` (after the wake prefix every script receives
first), any extra ``KEYS`` after the fixed ones, and the parser of its
reply. Both runners execute a call the same way
(``RedisRunner.run(call)``, ``await AsyncRedisRunner.run(call)``), so the
sync core, the reservation API and the asyncio integrations never build an
argument list or read a reply of their own. Each script's header
(``lua/<name>.lua``) documents the same arguments and reply; the replies'
types are in :mod:`simplebroker_redis.types`.

The builders live by concern: :mod:`.base` (the :class:`Call` and shared
argument helpers), :mod:`.queues` (namespace, writes, reads, probes,
deletes), :mod:`.leases` (reservations: every operation of the lease
objects), :mod:`.journal` (dead letters),
:mod:`.schedules` (Taskiq schedules), :mod:`.celery` (the Celery
integration), :mod:`.dramatiq` (the Dramatiq integration's room: its keys
and replies too), :mod:`.operations` (metrics, dashboard, worker beats) and
:mod:`.tasks` (the task index, tasks in flight, task statistics).
This package only re-exports them, so every call reads ``calls.<name>(...)``.
"""

from .base import Call, new_holder
from .celery import (
    celery_bind,
    celery_chord_add,
    celery_chord_dispatch,
    celery_chord_part,
    celery_chord_size,
    celery_exchange_table,
    celery_store,
    celery_unbind,
)
from .dramatiq import dramatiq_dead, dramatiq_store
from .journal import dead_letter_ack, dead_letters
from .leases import (
    ack,
    commit,
    deliveries,
    recover,
    reject,
    release,
    renew,
    renewal,
    reserve,
    reserve_queues,
    settle,
)
from .operations import dead_letter_requeue, depths, inspect, worker_beat
from .queues import (
    DEFAULT_DEDUPE_SECONDS,
    advance_ts,
    alias_add,
    alias_remove,
    broadcast,
    claim,
    cleanup,
    dedupe,
    delete_ids,
    delete_queues,
    find,
    init,
    insert,
    key_types,
    peek,
    probe_exists,
    probe_latest,
    probe_pending,
    ready_count,
    rename,
    resync,
    stamp,
    stats,
    vacuum,
    write,
    write_batch,
)
from .schedules import schedule_claim, schedule_list, schedule_sent
from .tasks import running, task_find, task_stats, task_stats_read

__all__ = [
    "DEFAULT_DEDUPE_SECONDS",
    "Call",
    "ack",
    "advance_ts",
    "alias_add",
    "alias_remove",
    "broadcast",
    "celery_bind",
    "celery_chord_add",
    "celery_chord_dispatch",
    "celery_chord_part",
    "celery_chord_size",
    "celery_exchange_table",
    "celery_store",
    "celery_unbind",
    "claim",
    "cleanup",
    "commit",
    "dead_letter_ack",
    "dead_letter_requeue",
    "dead_letters",
    "dedupe",
    "delete_ids",
    "delete_queues",
    "deliveries",
    "depths",
    "dramatiq_dead",
    "dramatiq_store",
    "find",
    "init",
    "insert",
    "inspect",
    "key_types",
    "new_holder",
    "peek",
    "probe_exists",
    "probe_latest",
    "probe_pending",
    "ready_count",
    "recover",
    "reject",
    "release",
    "rename",
    "renew",
    "renewal",
    "reserve",
    "reserve_queues",
    "running",
    "resync",
    "schedule_claim",
    "schedule_list",
    "schedule_sent",
    "settle",
    "stamp",
    "stats",
    "task_find",
    "task_stats",
    "task_stats_read",
    "vacuum",
    "worker_beat",
    "write",
    "write_batch",
]
