"""WorkerSettings and BrokerSettings as the way to configure workers, engines and conductors.

Worker keeps TaskFlow's signature; everything beyond it is a WorkerSettings
(``settings=``) and a BrokerSettings (``broker=``), or loose keywords folded
into them. Engines and conductors take the same BrokerSettings as the
``broker`` engine option.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import inspect
import types

import pytest

from flowengine import engines
from flowengine.conductors.backends import impl_blocking
from flowengine.engines.worker_based.messaging import proxy as px
from flowengine.engines.worker_based.messaging.settings import BrokerSettings
from flowengine.engines.worker_based.worker_side import server as sv
from flowengine.engines.worker_based.worker_side import worker as wk
from flowengine.engines.worker_based.worker_side.settings import WorkerSettings
from flowengine.patterns import linear_flow as lf
from tests.worker_based import executor_tasks as et
from tests.worker_based.event_helpers import collecting, flow_finished
from tests.worker_based.executor_helpers import running_worker, unique

MEMORY_BROKER = BrokerSettings(transport="memory")


# --- WorkerSettings: checked once, naming the option ---------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("soft_time_limit", -1),
        ("time_limit", 0),
        ("heartbeat_interval", 0.0001),
        ("heartbeat_interval", "often"),
        ("worker_id", ""),
        ("exception_handlers", [42]),
    ],
)
def test_a_bad_setting_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        WorkerSettings(**{field: value})


def test_settings_are_frozen_and_normalised():
    def handler(failed):
        return None

    settings = WorkerSettings(exception_handlers=[handler], heartbeat_interval=3, events=1)
    assert settings.exception_handlers == (handler,)
    assert settings.heartbeat_interval == 3.0 and settings.events is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.control = False  # type: ignore[misc]


# --- Worker: TaskFlow's signature, a thin adapter over the settings ------------


def test_worker_keeps_taskflow_signature_then_takes_objects():
    tf_worker = pytest.importorskip(
        "taskflow.engines.worker_based.worker", reason="needs TaskFlow (the interop extra)"
    )
    theirs = list(inspect.signature(tf_worker.Worker.__init__).parameters.values())[1:]
    ours = list(inspect.signature(wk.Worker.__init__).parameters.values())[1:]
    assert [(p.name, p.default) for p in ours[: len(theirs)]] == [
        (p.name, p.default) for p in theirs
    ]
    kinds = inspect.Parameter
    assert [(p.name, p.kind) for p in ours[len(theirs) :]] == [
        ("broker", kinds.KEYWORD_ONLY),
        ("settings", kinds.KEYWORD_ONLY),
        ("options", kinds.VAR_KEYWORD),
    ]


def test_loose_keywords_are_folded_into_settings_and_broker():
    worker = wk.Worker(
        "ex",
        "t",
        [et.Echo],
        threads_count=1,
        transport="memory",
        worker_id="w-loose",
        soft_time_limit=5,
        control=False,
        max_redeliveries=7,
    )
    assert worker.settings == WorkerSettings(worker_id="w-loose", soft_time_limit=5, control=False)
    assert worker.broker.max_redeliveries == 7 and worker.broker.transport == "memory"
    assert worker.worker_id == "w-loose" and worker.control is None
    assert worker.task_runner.default_limits.soft == 5


def test_settings_object_drives_the_worker():
    settings = WorkerSettings(
        worker_id="w-obj", time_limit=9, heartbeat_interval=1.5, control=False
    )
    worker = wk.Worker(
        "ex", "t", [et.Echo], threads_count=1, broker=MEMORY_BROKER, settings=settings
    )
    assert worker.settings is settings and worker.broker is MEMORY_BROKER
    assert worker.worker_id == "w-obj" and worker.control is None
    assert worker.server.heartbeat_interval == 1.5
    assert worker.task_runner.default_limits.hard == 9


@pytest.mark.parametrize(
    "kwargs,error,needle",
    [
        ({"no_such_option": 1}, TypeError, "no_such_option"),
        ({"settings": WorkerSettings(), "soft_time_limit": 1}, TypeError, "soft_time_limit"),
        ({"broker": MEMORY_BROKER, "durable": True}, TypeError, "durable"),
        ({"broker": MEMORY_BROKER, "url": "memory://"}, ValueError, "not both"),
        ({"transport": "memory", "heartbeat_interval": 0.0001}, ValueError, "heartbeat_interval"),
    ],
    ids=[
        "unknown",
        "settings and loose",
        "broker and loose broker option",
        "broker and url",
        "bad loose value",
    ],
)
def test_options_given_wrong_are_refused_naming_them(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        wk.Worker("ex", "t", [et.Echo], threads_count=1, **kwargs)


def test_server_and_proxy_take_at_most_seven_parameters():
    for cls in (sv.Server, px.Proxy):
        params = list(inspect.signature(cls.__init__).parameters)[1:]
        assert len(params) <= 7, (cls.__name__, params)


def test_server_and_proxy_still_take_taskflows_broker_keywords():
    # TaskFlow's own tests build them so: keywords only, and only those four
    proxy = px.Proxy(
        "t", unique(), None, transport="memory", transport_options={"polling_interval": 0.01}
    )
    assert proxy.broker.transport == "memory"
    assert proxy.broker.transport_options == {"polling_interval": 0.01}
    with cf.ThreadPoolExecutor(1) as pool:
        server = sv.Server("t", unique(), pool, [], transport="memory")
        assert server.proxy.broker.transport == "memory"
    with pytest.raises(TypeError, match="Proxy.*queues"):
        px.Proxy("t", "ex", transport="memory", queues=[])
    with pytest.raises(TypeError, match="Server.*worker_id"):
        sv.Server("t", "ex", pool, [], transport="memory", worker_id="w")


# --- broker= everywhere: engine option, events, conductor ----------------------


def test_a_flow_runs_with_broker_objects_on_both_sides():
    # Given a worker configured by objects only, and an engine given the same broker
    exchange = unique()
    settings = WorkerSettings(worker_id=f"w-{exchange}", control=False)
    flow = lf.Flow("f").add(et.Echo("e", provides="out"))
    with (
        collecting(exchange, broker=MEMORY_BROKER) as seen,
        running_worker(
            exchange,
            "t",
            [et.Echo],
            threads_count=1,
            broker=MEMORY_BROKER,
            settings=dataclasses.replace(settings, events=True),
        ),
    ):
        engine = engines.load(
            flow,
            store={"value": 4},
            engine="worker-based",
            exchange=exchange,
            topics=["t"],
            broker=MEMORY_BROKER,
            events=True,
        )
        # When it runs
        engine.run()
        # Then the task ran on that worker, and the engine's events used the broker too
        assert seen.wait_for(flow_finished()), seen.events
    assert engine.storage.fetch("out") == 4
    assert {e["hostname"] for e in seen.of_type("task-succeeded")} == {f"w-{exchange}"}
    assert [e["type"] for e in seen.of_type("flow-started", "flow-finished")] == [
        "flow-started",
        "flow-finished",
    ]


def test_engine_refuses_broker_with_loose_broker_options():
    flow = lf.Flow("f").add(et.Echo("e"))
    with pytest.raises(ValueError, match="'broker' option or as the option.*url"):
        engines.load(flow, engine="worker-based", broker=MEMORY_BROKER, url="memory://")
    with pytest.raises(TypeError, match="must be a BrokerSettings"):
        engines.load(flow, engine="worker-based", broker="memory://")


def test_a_job_naming_its_broker_overrides_the_conductors_broker_object():
    conductor = impl_blocking.BlockingConductor(
        "c", None, engine="worker-based", engine_options={"broker": MEMORY_BROKER, "exchange": "x"}
    )

    def job(options):
        return types.SimpleNamespace(details={"engine_options": options})

    # A job that says nothing of the broker gets the conductor's object
    _, options = conductor._engine_settings(job({"topics": ["t"]}))
    assert options["broker"] is MEMORY_BROKER and options["topics"] == ["t"]
    # A job naming a URL gets that URL, not a conflict with the conductor's object
    _, options = conductor._engine_settings(job({"url": "redis://h/0"}))
    assert "broker" not in options and options["url"] == "redis://h/0"
    assert BrokerSettings.from_options(options).url == "redis://h/0"
