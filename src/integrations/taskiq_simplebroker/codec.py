"""Lossless bytes <-> SimpleBroker text: the backend's codec, shared with Dramatiq."""

from simplebroker_redis.codec import BINARY_PREFIX, ESCAPED_PREFIX, MARK, decode_body, encode_body

__all__ = ["BINARY_PREFIX", "ESCAPED_PREFIX", "MARK", "decode_body", "encode_body"]
