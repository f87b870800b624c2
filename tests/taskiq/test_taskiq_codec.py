"""Lossless bytes <-> SimpleBroker text encoding of task bodies."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simplebroker_redis.validation import validate_message
from taskiq_simplebroker import decode_body, encode_body


@given(st.binary(max_size=512))
def test_any_bytes_round_trip_as_valid_simplebroker_text(data: bytes) -> None:
    text = encode_body(data)
    assert validate_message(text, 1 << 20) == text
    assert decode_body(text) == data


@given(st.text(max_size=256))
def test_any_text_round_trips(text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return  # lone surrogates are covered by the bytes test
    assert decode_body(encode_body(data)) == data


def test_json_is_stored_verbatim() -> None:
    body = b'{"task_id":"abc","args":[1,2]}'
    assert encode_body(body) == body.decode()


@pytest.mark.parametrize(
    ("data", "prefix"),
    [
        (pickle.dumps({"x": 1}), "\x00b:"),
        (b"\xff\xfe", "\x00b:"),
        (b"\x00starts with NUL", "\x00t:"),
    ],
)
def test_marked_forms(data: bytes, prefix: str) -> None:
    text = encode_body(data)
    assert text.startswith(prefix)
    assert decode_body(text) == data


def test_text_written_by_hand_is_taken_as_text() -> None:
    assert decode_body("\x00other") == b"\x00other"


def test_damaged_base64_is_an_error() -> None:
    with pytest.raises(ValueError, match="base64"):
        decode_body("\x00b:not base64!")
