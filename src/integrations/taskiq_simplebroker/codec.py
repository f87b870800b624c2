"""Lossless bytes <-> SimpleBroker text: the backend's codec, shared with Dramatiq."""

from simplebroker_redis.codec import (
    BINARY_PREFIX,
    ESCAPED_PREFIX,
    MARK,
    decode_body,
    encode_body,
    stored_size,
)

__all__ = ["BINARY_PREFIX", "ESCAPED_PREFIX", "MARK", "decode_body", "encode_body", "stored_size"]
