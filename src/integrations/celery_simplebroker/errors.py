"""Errors the transport raises to Celery's producers."""

from __future__ import annotations


class UnconfirmedPublish(RuntimeError):
    """A message was written, but too few replicas confirmed it (``wait_replicas``).

    Its cause is the backend's ``ReplicationTimeout``. It is deliberately
    not one of the transport's connection errors: kombu retries a publish
    that raised one of those (Celery's ``task_publish_retry``, on by
    default), and the message, already in its queue, would be sent a
    second time and could run twice at once.
    """


class ServerRefused(RuntimeError):
    """The server refused this client for good: a wrong password, an ACL, TLS.

    Its cause is the backend's ``AccessDenied``. Like
    :class:`UnconfirmedPublish`, it is deliberately not a connection error:
    kombu retries those (a worker 100 times, for minutes), and no retry can
    fix a password. A worker stops at once with the message instead.
    """
