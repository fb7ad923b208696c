"""Persistence models: JSON round trips, put/reset semantics, pformat, bad data."""

import datetime
import json

import pytest

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.types import failure as ft


def _failure(msg="Woot!"):
    try:
        raise RuntimeError(msg)
    except RuntimeError:
        return ft.Failure()


def _json_round_trip(data):
    return json.loads(json.dumps(data))


def test_logbook_round_trip_is_pure_json():
    book = models.LogBook("book")
    book.meta = {"a": 1}
    book.add(models.FlowDetail("fd", models.generate_uuid()))
    data = _json_round_trip(book.to_dict())
    assert models.FORMAT_VERSION_KEY not in data  # TaskFlow's keys only
    again = models.LogBook.from_dict(data)
    assert (again.name, again.uuid, again.meta) == ("book", book.uuid, {"a": 1})
    assert again.created_at == book.created_at
    assert again.updated_at == book.updated_at
    assert len(again) == 0  # contained flow details are not part of the dict


#: The keys of TaskFlow 6.5's to_dict() of each model.
TASKFLOW_KEYS = {
    "LogBook": {"name", "meta", "uuid", "updated_at", "created_at"},
    "FlowDetail": {"name", "meta", "state", "uuid"},
    "AtomDetail": {
        "failure",
        "revert_failure",
        "meta",
        "name",
        "results",
        "revert_results",
        "state",
        "version",
        "intention",
        "uuid",
    },
}


def test_to_dict_has_exactly_taskflows_keys():
    assert set(models.LogBook("b").to_dict()) == TASKFLOW_KEYS["LogBook"]
    assert set(models.LogBook("b").to_dict(marshal_time=False)) == TASKFLOW_KEYS["LogBook"]
    assert set(models.FlowDetail("f", "u").to_dict()) == TASKFLOW_KEYS["FlowDetail"]
    for cls in (models.TaskDetail, models.RetryDetail):
        assert set(cls("a", "u").to_dict()) == TASKFLOW_KEYS["AtomDetail"], cls


@pytest.mark.parametrize(
    "cls", [models.LogBook, models.FlowDetail, models.TaskDetail, models.RetryDetail]
)
def test_from_dict_reads_data_with_the_format_version_older_flowengines_wrote(cls):
    data = {"name": "n", "uuid": "u", "meta": {"k": 1}, models.FORMAT_VERSION_KEY: 1}
    obj = cls.from_dict(data)
    assert (obj.name, obj.uuid, obj.meta) == ("n", "u", {"k": 1})
    assert models.FORMAT_VERSION_KEY not in obj.to_dict()


def test_logbook_reads_taskflow_marshalled_times():
    data = {
        "name": "b",
        "uuid": "u",
        "meta": None,
        "updated_at": None,
        "created_at": {
            "year": 2020,
            "month": 1,
            "day": 2,
            "hour": 3,
            "minute": 4,
            "second": 5,
            "microsecond": 6,
        },
    }
    book = models.LogBook.from_dict(data)
    assert book.created_at.year == 2020 and book.created_at.microsecond == 6
    assert book.meta == {}


def test_logbook_reads_taskflow_times_with_a_zone_name():
    # TaskFlow (oslo.utils) adds 'tzname' when the time it marshals was aware
    fields = {
        "year": 2020,
        "month": 7,
        "day": 2,
        "hour": 3,
        "minute": 4,
        "second": 5,
        "microsecond": 6,
    }
    data = {
        "name": "b",
        "uuid": "u",
        "meta": {},
        "created_at": dict(fields, tzname="Europe/Paris"),
        "updated_at": dict(fields, tzname="UTC"),
    }
    book = models.LogBook.from_dict(data)
    assert book.created_at == datetime.datetime(2020, 7, 2, 1, 4, 5, 6, tzinfo=datetime.UTC)
    assert book.updated_at == datetime.datetime(2020, 7, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)


def test_flow_detail_round_trip_and_copy():
    fd = models.FlowDetail("fd", "fd-uuid")
    fd.state = states.RUNNING
    fd.meta["k"] = "v"
    ad = models.TaskDetail("t", "t-uuid")
    fd.add(ad)
    again = models.FlowDetail.from_dict(_json_round_trip(fd.to_dict()))
    assert (again.name, again.uuid, again.state, again.meta) == (
        "fd",
        "fd-uuid",
        states.RUNNING,
        {"k": "v"},
    )
    clone = fd.copy()
    assert clone.find("t-uuid") is ad
    clone.meta["k"] = "other"
    assert fd.meta["k"] == "v"
    assert len(fd.copy(retain_contents=False)) == 0


def test_task_detail_round_trip_with_failures():
    ad = models.TaskDetail("t", "t-uuid")
    ad.state = states.FAILURE
    ad.failure = _failure()
    ad.revert_failure = _failure("revert broke")
    ad.meta = {"progress": 0.5}
    ad.version = "1.0"
    data = _json_round_trip(ad.to_dict())
    again = models.TaskDetail.from_dict(data)
    assert again.failure.exception_str == "Woot!"
    assert again.failure.check(RuntimeError) is not None
    assert again.revert_failure.exception_str == "revert broke"
    assert (again.state, again.version, again.meta) == (states.FAILURE, "1.0", {"progress": 0.5})


def test_retry_detail_history_round_trip():
    ad = models.RetryDetail("r", "r-uuid")
    ad.put(states.SUCCESS, 1)
    ad.last_failures["t"] = _failure()
    ad.put(states.SUCCESS, 2)
    data = _json_round_trip(ad.to_dict())
    again = models.RetryDetail.from_dict(data)
    assert [r for r, _ in again.results] == [1, 2]
    assert again.results[0][1]["t"].exception_str == "Woot!"
    assert again.last_results == 2
    assert again.last_failures == {}


def test_task_detail_put_semantics():
    ad = models.TaskDetail("t", "u")
    assert ad.put(states.SUCCESS, 5)
    assert (ad.results, ad.failure) == (5, None)
    fail = _failure()
    assert ad.put(states.FAILURE, fail)
    assert (ad.results, ad.failure) == (None, fail)
    assert ad.put(states.REVERTED, "undone")
    assert ad.revert_results == "undone"
    revert_fail = _failure("nope")
    assert ad.put(states.REVERT_FAILURE, revert_fail)
    assert (ad.revert_results, ad.revert_failure) == (None, revert_fail)
    same = ad.results
    assert not ad.put(states.REVERT_FAILURE, revert_fail)  # nothing changed
    assert ad.results is same
    ad.intention = states.REVERT
    ad.reset(states.PENDING)
    assert (ad.state, ad.intention, ad.results, ad.failure, ad.revert_failure) == (
        states.PENDING,
        states.EXECUTE,
        None,
        None,
        None,
    )


def test_retry_detail_put_keeps_history_until_reset():
    ad = models.RetryDetail("r", "u")
    with pytest.raises(exc.NotFound):
        _ = ad.last_results
    ad.put(states.SUCCESS, "a")
    ad.put(states.FAILURE, _failure())
    ad.put(states.SUCCESS, "b")
    assert [r for r, _ in ad.results] == ["a", "b"]
    assert ad.failure is None
    ad.reset(states.PENDING)
    assert ad.results == [] and ad.state == states.PENDING


def test_retry_detail_copy_does_not_share_failure_dicts():
    ad = models.RetryDetail("r", "u")
    ad.put(states.SUCCESS, "a")
    clone = ad.copy()
    clone.last_failures["x"] = _failure()
    assert ad.last_failures == {}


def test_merge_takes_other_values_and_rejects_other_kinds():
    a = models.TaskDetail("t", "u")
    b = models.TaskDetail("t", "u")
    b.state, b.results, b.meta = states.SUCCESS, [1], {"m": 1}
    assert a.merge(b) is a
    assert (a.state, a.results, a.meta) == (states.SUCCESS, [1], {"m": 1})
    with pytest.raises(NotImplementedError):
        a.merge(models.RetryDetail("r", "u2"))


def test_atom_detail_type_and_class():
    assert models.atom_detail_type(models.TaskDetail("t", "u")) == "TASK_DETAIL"
    assert models.atom_detail_class("RETRY_DETAIL") is models.RetryDetail
    with pytest.raises(TypeError):
        models.atom_detail_class("BLAH")
    with pytest.raises(TypeError):
        models.atom_detail_type(object())


def test_pformat_text():
    fd = models.FlowDetail("example", "fd-uuid")
    ad = models.TaskDetail("t", "t-uuid")
    ad.state = states.SUCCESS
    ad.version = "1.0"
    ad.results = 3
    ad.meta = {"progress": 0.5}
    fd.add(ad)
    assert fd.pformat(linesep="\n") == "\n".join(
        [
            "FlowDetail: 'example'",
            " - uuid = fd-uuid",
            " - state = None",
            " TaskDetail: 't'",
            "  - uuid = t-uuid",
            "  - state = SUCCESS",
            "  - version = 1.0",
            "  - results = 3",
            "  - failure = False",
            "  - metadata:",
            "    + progress = 50.00%",
        ]
    )
    book = models.LogBook("example")
    lines = book.pformat(linesep="\n").splitlines()
    assert lines[0] == "LogBook: 'example'"
    assert lines[1] == f" - uuid = {book.uuid}"
    assert lines[2].startswith(" - created_at = ") and lines[2].endswith("Z")


@pytest.mark.parametrize(
    "data, error, words",
    [
        ("nope", exc.InvalidFormat, ["must be a dict"]),
        ({"uuid": "u"}, exc.InvalidFormat, ["missing", "'name'", "'u'"]),
        ({"name": "t", "uuid": 5}, exc.InvalidFormat, ["non-string", "'uuid'"]),
        (
            {"name": "t", "uuid": "u", models.FORMAT_VERSION_KEY: 99},
            exc.IncompatibleVersion,
            ["99", "'u'"],
        ),
        (
            {"name": "t", "uuid": "u", "failure": {"version": 42}},
            exc.InvalidFormat,
            ["failure", "'u'"],
        ),
    ],
)
def test_bad_atom_data_is_reported_precisely(data, error, words):
    with pytest.raises(error) as info:
        models.TaskDetail.from_dict(data)
    for word in words:
        assert word in str(info.value)


def test_malformed_retry_history():
    with pytest.raises(exc.InvalidFormat, match="malformed history"):
        models.RetryDetail.from_dict({"name": "r", "uuid": "u", "results": [1, 2]})


def test_generated_uuids_are_random_version_4_uuids():
    import uuid

    made = [models.generate_uuid() for _ in range(200)]
    assert len(set(made)) == len(made)
    for text in made:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # canonical form: lower-case, dashed
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
