"""flowengine's msgpack of TaskFlow's Redis postings against oslo.serialization's own."""

from __future__ import annotations

import datetime
import uuid

import pytest

msgpackutils = pytest.importorskip(
    "oslo_serialization.msgpackutils",
    reason="oslo.serialization is not installed (pip install -e .[interop])",
)
codec = pytest.importorskip(
    "flowengine.jobs.backends.taskflow_codec",
    reason="msgpack is not installed (pip install -e .[taskflow-compat])",
)

VALUES = {
    "naive": datetime.datetime(2026, 11, 29, 6, 1, 2, 345678),
    "aware": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    "day": datetime.date(2026, 2, 3),
    "id": uuid.UUID(int=12345),
    "set": {1, 2, 3},
    "frozen": frozenset({"a"}),
    "nested": {"list": [1, "two", None, 3.5], "bytes": b"\x00\xff"},
}


def test_flowengine_reads_what_oslo_writes() -> None:
    assert codec.loads(msgpackutils.dumps(VALUES)) == VALUES


def test_oslo_reads_what_flowengine_writes() -> None:
    assert msgpackutils.loads(codec.dumps(VALUES)) == VALUES


def test_a_taskflow_posting_is_written_byte_for_byte_as_taskflow_does() -> None:
    posting = {
        "uuid": str(uuid.UUID(int=1)),
        "name": "job",
        "priority": "NORMAL",
        "details": {"store": {"x": 1}},
        "created_on": VALUES["naive"],
        "sequence": 7,
    }
    assert codec.dumps(posting) == msgpackutils.dumps(posting)


@pytest.mark.parametrize("blob", [b'{"uuid": "x", "name": "json"}', b"\xc1", b"\x93\x01\x02\x03"])
def test_anything_else_is_a_value_error_naming_why(blob: bytes) -> None:
    with pytest.raises(ValueError, match="msgpack|map"):
        codec.loads(blob)


def test_values_msgpack_cannot_hold_are_refused_by_name() -> None:
    from flowengine import exceptions as exc

    with pytest.raises(exc.JobFailure, match="object"):
        codec.dumps({"x": object()})
