"""wire.json_text.read_json: the same values (and errors) as kombu's JSON reader.

Its fast path skips kombu's type-tag hook; it may do so only for text in
which no ``__type__`` key can be spelled. Generated values, kombu's own tags
and tags spelled through ``\\u`` escapes must read the same both ways; a
plain reply body must take the fast path.
"""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from flowengine.engines.worker_based.messaging import delivery
from flowengine.engines.worker_based.wire import json_text

# Keys near kombu's tag, so generated mappings often are (or nearly are) tags.
KEYS = st.sampled_from(["__type__", "__value__", "state", "_type_", "\u00e9", "x"]) | st.text(
    max_size=4
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


def _read_both(text: str | bytes) -> tuple[object, object]:
    """(kombu's value or error type, read_json's value or error type)."""
    results = []
    for read in (kombu_json.loads, json_text.read_json):
        try:
            results.append(read(text))
        except Exception as e:
            results.append(type(e))
    return results[0], results[1]


@settings(max_examples=300, deadline=None)
@given(JSON, st.booleans())
def test_generated_values_read_as_kombu_reads_them(value, ascii_only):
    # Given text written with or without escapes for non-ASCII characters
    text = json.dumps(value, ensure_ascii=ascii_only)
    # When both readers read it, then they agree (an error included)
    kombu_value, ours = _read_both(text)
    assert ours == kombu_value


@pytest.mark.parametrize(
    "text",
    [
        kombu_json.dumps({"when": datetime.datetime(2026, 11, 30, 1, 2, 3)}),
        kombu_json.dumps({"id": uuid.UUID(int=7)}),
        kombu_json.dumps({"raw": b"\x00\x01"}),
        # The tag's key spelled with escapes: kombu decodes it all the same.
        '{"\\u005f_type__": "uuid", "__value__": "00000000-0000-0000-0000-000000000007"}',
        '{"__\\u0074ype__": "uuid", "__value__": "00000000-0000-0000-0000-000000000007"}',
        # A tag kombu cannot decode: both raise.
        '{"__type__": "uuid", "__value__": "zz"}',
        '{"__type__": "no-such-type", "__value__": 1}',
        # Not JSON, or not only JSON.
        "{",
        '{"a": 1} x',
        "",
    ],
)
def test_type_tags_and_bad_text_read_as_kombu_reads_them(text):
    kombu_value, ours = _read_both(text)
    assert ours == kombu_value
    kombu_value, ours = _read_both(text.encode())
    assert ours == kombu_value


def test_a_plain_reply_body_is_read_without_kombus_hook(monkeypatch):
    # Given kombu's reader made unusable
    def refuse(*args, **kwargs):
        raise AssertionError("kombu's JSON reader was used")

    monkeypatch.setattr(kombu_json, "loads", refuse)

    # When a reply body of the usual shape is decoded
    class Message:
        content_type = delivery.CONTENT_TYPE
        content_encoding = delivery.CONTENT_ENCODING
        headers: dict[str, object] = {}
        body = b'{"state": "SUCCESS", "data": {"result": [1, "two", null]}}'

    # Then it reads without kombu's reader (its type-tag hook)
    assert delivery.Delivery(Message()).decode() == {
        "state": "SUCCESS",
        "data": {"result": [1, "two", None]},
    }
