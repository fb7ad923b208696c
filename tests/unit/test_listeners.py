"""Listeners: registration, and the exact text/metadata they produce (TaskFlow's)."""

from __future__ import annotations

import logging
import os
import re

import networkx as nx
import pytest

from flowengine import exceptions as exc
from flowengine import formatters as formatting
from flowengine import states
from flowengine.listeners import base, capturing, printing, timing
from flowengine.listeners import logging as logging_listeners
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier, RestrictedNotifier

ENGINE_TEXT = "<FakeEngine>"


class FakeStorage:
    """Records metadata updates; can be told to fail like a broken backend."""

    def __init__(self, fail: bool = False) -> None:
        self.atom_meta: dict[str, dict] = {}
        self.flow_meta: dict = {}
        self.fail = fail
        self.intentions: dict[str, str] = {}
        self.states: dict[str, str] = {}
        self.results: dict[str, object] = {}

    def update_atom_metadata(self, name: str, update: dict) -> None:
        if self.fail:
            raise exc.StorageFailure("backend down")
        self.atom_meta.setdefault(name, {}).update(update)

    def update_flow_metadata(self, update: dict) -> None:
        if self.fail:
            raise exc.StorageFailure("backend down")
        self.flow_meta.update(update)

    def get_atom_intention(self, name: str) -> str:
        try:
            return self.intentions[name]
        except KeyError:
            raise exc.NotFound(f"no atom {name}")

    def get_atom_state(self, name: str) -> str:
        try:
            return self.states[name]
        except KeyError:
            raise exc.NotFound(f"no atom {name}")

    def fetch_mapped_args(
        self, rebind: dict, atom_name: str | None = None, optional_args: object = None
    ) -> dict:
        return {arg: self.results.get(symbol) for arg, symbol in rebind.items()}

    def get_execute_result(self, name: str) -> object:
        try:
            return self.results[name]
        except KeyError:
            raise exc.NotFound(f"no result for {name}")


class FakeEngine:
    """Just what listeners touch: two notifiers, storage and compilation."""

    def __init__(self, storage: FakeStorage | None = None, compilation: object = None) -> None:
        self.notifier = Notifier()
        self.atom_notifier = Notifier()
        self.storage = storage if storage is not None else FakeStorage()
        self.compilation = compilation

    def __str__(self) -> str:
        return ENGINE_TEXT


def flow_event(engine: FakeEngine, state: str, old: str, name: str = "f") -> None:
    engine.notifier.notify(state, {"flow_name": name, "flow_uuid": "f-uuid", "old_state": old})


def task_event(engine: FakeEngine, state: str, old: str, name: str = "t", **extra: object) -> None:
    details = {"task_name": name, "task_uuid": f"{name}-uuid", "old_state": old}
    details.update(extra)
    engine.atom_notifier.notify(state, details)


def retry_event(engine: FakeEngine, state: str, old: str, name: str = "r") -> None:
    engine.atom_notifier.notify(
        state, {"retry_name": name, "retry_uuid": f"{name}-uuid", "old_state": old}
    )


def success_run(engine: FakeEngine) -> None:
    flow_event(engine, states.RUNNING, states.PENDING)
    task_event(engine, states.RUNNING, states.PENDING)
    task_event(engine, states.SUCCESS, states.RUNNING, result=5)
    flow_event(engine, states.SUCCESS, states.RUNNING)


def make_failure(message: str = "Woot!") -> Failure:
    try:
        raise RuntimeError(message)
    except RuntimeError:
        return Failure()


def registered_count(engine: FakeEngine) -> int:
    return len(engine.notifier) + len(engine.atom_notifier)


# -- base.Listener -----------------------------------------------------------


class Recorder(base.Listener):
    def __init__(self, engine: FakeEngine, **kwargs: object) -> None:
        super().__init__(engine, **kwargs)
        self.seen: list[tuple[str, str]] = []

    def _flow_receiver(self, state: str, details: dict) -> None:
        self.seen.append(("flow", state))

    def _task_receiver(self, state: str, details: dict) -> None:
        self.seen.append(("task", state))

    def _retry_receiver(self, state: str, details: dict) -> None:
        self.seen.append(("retry", state))


def test_listener_registers_nothing_until_asked():
    engine = FakeEngine()
    listener = Recorder(engine)
    assert registered_count(engine) == 0
    listener.register()
    listener.register()  # idempotent
    assert registered_count(engine) == 3
    listener.deregister()
    listener.deregister()  # idempotent
    assert registered_count(engine) == 0


def test_context_manager_returns_listener_and_deregisters_on_error():
    engine = FakeEngine()
    with pytest.raises(KeyError):
        with Recorder(engine) as listener:
            assert isinstance(listener, Recorder)
            assert registered_count(engine) == 3
            raise KeyError("boom")
    assert registered_count(engine) == 0


def test_task_and_retry_events_reach_their_own_receiver():
    engine = FakeEngine()
    with Recorder(engine) as listener:
        flow_event(engine, states.RUNNING, states.PENDING)
        task_event(engine, states.RUNNING, states.PENDING)
        retry_event(engine, states.RUNNING, states.PENDING)
    flow_event(engine, states.SUCCESS, states.RUNNING)  # after deregistering
    assert listener.seen == [("flow", "RUNNING"), ("task", "RUNNING"), ("retry", "RUNNING")]


def test_listen_for_selects_states_and_empty_means_nothing():
    engine = FakeEngine()
    with Recorder(
        engine, task_listen_for=[states.SUCCESS], flow_listen_for=None, retry_listen_for=()
    ) as listener:
        assert registered_count(engine) == 1
        success_run(engine)
        retry_event(engine, states.SUCCESS, states.RUNNING)
    assert listener.seen == [("task", "SUCCESS")]


def test_progress_events_only_reach_listeners_that_ask_for_them():
    # TaskFlow never routes progress through the atom notifier: listening for
    # everything must not surface it; naming the event explicitly does.
    engine = FakeEngine()
    with (
        Recorder(engine) as everything,
        Recorder(engine, task_listen_for=["update_progress"]) as progress,
    ):
        task_event(engine, "update_progress", states.RUNNING, progress=0.5)
        task_event(engine, states.SUCCESS, states.RUNNING, result=1)
    assert everything.seen == [("task", "SUCCESS")]
    assert progress.seen == [("task", "update_progress")]
    assert registered_count(engine) == 0


def test_register_is_all_or_nothing_when_an_event_is_refused():
    engine = FakeEngine()
    engine.atom_notifier = RestrictedNotifier([states.RUNNING], allow_any=False)
    listener = Recorder(engine, task_listen_for=[states.RUNNING, "NOT-A-STATE"])
    with pytest.raises(ValueError):
        listener.register()
    assert registered_count(engine) == 0


def test_deregister_failure_on_exit_is_logged_not_raised(caplog):
    engine = FakeEngine()
    listener = Recorder(engine)
    listener.register()
    engine.notifier = None  # deregistering flow receivers will now blow up
    with caplog.at_level(logging.WARNING, logger="flowengine.listeners.base"):
        listener.__exit__(None, None, None)
    assert caplog.messages == [f"Failed deregistering listeners from engine {ENGINE_TEXT}"]


# -- printing / logging (DumpingListener text) ---------------------------------

SUCCESS_LINES = [
    f"{ENGINE_TEXT} has moved flow 'f' (f-uuid) into state 'RUNNING' from state 'PENDING'",
    f"{ENGINE_TEXT} has moved task 't' (t-uuid) into state 'RUNNING' from state 'PENDING'",
    f"{ENGINE_TEXT} has moved task 't' (t-uuid) into state 'SUCCESS' from state 'RUNNING'"
    " with result '5' (failure=False)",
    f"{ENGINE_TEXT} has moved flow 'f' (f-uuid) into state 'SUCCESS' from state 'RUNNING'",
]


def test_printing_listener_prints_taskflow_text(capsys):
    engine = FakeEngine()
    with printing.PrintingListener(engine):
        success_run(engine)
    out, err = capsys.readouterr()
    assert out.splitlines() == SUCCESS_LINES
    assert err == ""


def test_printing_listener_prints_failure_traceback_to_stderr(capsys):
    engine = FakeEngine()
    fail = make_failure()
    with printing.PrintingListener(engine, stderr=True):
        task_event(engine, states.FAILURE, states.RUNNING, result=fail)
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == (
        f"{ENGINE_TEXT} has moved task 't' (t-uuid) into state 'FAILURE'"
        " from state 'RUNNING' with result 'Failure: RuntimeError: Woot!'"
        " (failure=True)"
    )
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: Woot!"


def test_logging_listener_logs_at_debug_into_module_logger(caplog):
    engine = FakeEngine()
    with caplog.at_level(logging.DEBUG, logger="flowengine.listeners.logging"):
        with logging_listeners.LoggingListener(engine):
            success_run(engine)
    assert caplog.messages == SUCCESS_LINES
    assert {r.levelno for r in caplog.records} == {logging.DEBUG}
    assert {r.name for r in caplog.records} == {"flowengine.listeners.logging"}


def test_logging_listener_uses_given_logger_and_level(caplog):
    engine = FakeEngine()
    logger = logging.getLogger("test.listeners.custom")
    with caplog.at_level(logging.INFO, logger="test.listeners.custom"):
        with logging_listeners.LoggingListener(engine, log=logger, level=logging.INFO):
            task_event(engine, states.FAILURE, states.RUNNING, result=make_failure())
    (record,) = caplog.records
    assert record.name == "test.listeners.custom" and record.levelno == logging.INFO
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


# -- DynamicLoggingListener --------------------------------------------------


def dynamic_records(caplog, engine: FakeEngine, emit, level=logging.DEBUG, **kwargs):
    with caplog.at_level(level, logger="flowengine.listeners.logging"):
        with logging_listeners.DynamicLoggingListener(engine, **kwargs):
            emit(engine)
    return [(r.levelno, r.getMessage()) for r in caplog.records]


def test_dynamic_logging_success_run(caplog):
    records = dynamic_records(caplog, FakeEngine(), success_run)
    assert records == [
        (logging.DEBUG, "Flow 'f' (f-uuid) transitioned into state 'RUNNING' from state 'PENDING'"),
        (logging.DEBUG, "Task 't' (t-uuid) transitioned into state 'RUNNING' from state 'PENDING'"),
        (
            logging.DEBUG,
            "Task 't' (t-uuid) transitioned into state 'SUCCESS' from state 'RUNNING'"
            " with result '5'",
        ),
        (logging.DEBUG, "Flow 'f' (f-uuid) transitioned into state 'SUCCESS' from state 'RUNNING'"),
    ]


def test_dynamic_logging_levels_for_failures_and_reverts(caplog):
    def emit(engine):
        task_event(engine, states.REVERTING, states.FAILURE)
        task_event(engine, states.REVERTED, states.REVERTING, result=None)
        task_event(engine, states.RETRYING, states.REVERTED)
        flow_event(engine, states.REVERTED, states.RUNNING)
        flow_event(engine, states.FAILURE, states.RUNNING)

    records = dynamic_records(caplog, FakeEngine(), emit)
    assert records == [
        (
            logging.DEBUG,
            "Task 't' (t-uuid) transitioned into state 'REVERTING' from state 'FAILURE'",
        ),
        (
            logging.WARNING,
            "Task 't' (t-uuid) transitioned into state 'REVERTED'"
            " from state 'REVERTING' with result 'None'",
        ),
        (
            logging.WARNING,
            "Task 't' (t-uuid) transitioned into state 'RETRYING' from state 'REVERTED'",
        ),
        (
            logging.WARNING,
            "Flow 'f' (f-uuid) transitioned into state 'REVERTED' from state 'RUNNING'",
        ),
        (
            logging.WARNING,
            "Flow 'f' (f-uuid) transitioned into state 'FAILURE' from state 'RUNNING'",
        ),
    ]


def test_dynamic_logging_hides_results_when_debug_is_off(caplog):
    def emit(engine):
        task_event(engine, states.SUCCESS, states.RUNNING, result="secret")
        task_event(engine, states.REVERTED, states.REVERTING, result="secret")

    records = dynamic_records(caplog, FakeEngine(), emit, level=logging.INFO)
    assert records == [
        (
            logging.WARNING,
            "Task 't' (t-uuid) transitioned into state 'REVERTED' from state 'REVERTING'",
        ),
    ]


def test_dynamic_logging_hide_inputs_outputs_of(caplog):
    def emit(engine):
        task_event(engine, states.SUCCESS, states.RUNNING, name="t", result="secret")
        task_event(engine, states.SUCCESS, states.RUNNING, name="u", result="shown")

    records = dynamic_records(caplog, FakeEngine(), emit, hide_inputs_outputs_of=["t"])
    assert [m for _, m in records] == [
        "Task 't' (t-uuid) transitioned into state 'SUCCESS' from state 'RUNNING'",
        "Task 'u' (u-uuid) transitioned into state 'SUCCESS' from state 'RUNNING'"
        " with result 'shown'",
    ]


def test_dynamic_logging_custom_levels(caplog):
    records = dynamic_records(
        caplog,
        FakeEngine(),
        lambda e: flow_event(e, states.FAILURE, states.RUNNING),
        failure_level=logging.ERROR,
        level=logging.INFO,
    )
    assert [lvl for lvl, _ in records] == [logging.ERROR]


def test_dynamic_logging_failure_without_compilation_logs_traceback(caplog):
    fail = make_failure()
    with caplog.at_level(logging.DEBUG, logger="flowengine.listeners.logging"):
        engine = FakeEngine()
        with logging_listeners.DynamicLoggingListener(engine):
            task_event(engine, states.FAILURE, states.RUNNING, result=fail)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "Task 't' (t-uuid) transitioned into state 'FAILURE' from state 'RUNNING'"
    )
    assert record.exc_info[1] is fail.exception


def test_dynamic_logging_remote_failure_logs_its_text(caplog):
    remote = Failure.from_dict(make_failure().to_dict())
    assert remote.exc_info is None
    with caplog.at_level(logging.DEBUG, logger="flowengine.listeners.logging"):
        engine = FakeEngine()
        with logging_listeners.DynamicLoggingListener(engine):
            task_event(engine, states.FAILURE, states.RUNNING, result=remote)
    (record,) = caplog.records
    assert not record.exc_info
    assert record.getMessage() == (
        "Task 't' (t-uuid) transitioned into state 'FAILURE' from state 'RUNNING'"
        + os.linesep
        + remote.pformat(traceback=True)
        + os.linesep
    )


def test_dynamic_logging_skips_failure_formatting_when_disabled(caplog):
    class ExplodingStorage(FakeStorage):
        def get_atom_intention(self, name: str) -> str:
            raise AssertionError("formatter should not run")

    engine = FakeEngine(storage=ExplodingStorage(), compilation=object())
    with caplog.at_level(logging.ERROR, logger="flowengine.listeners.logging"):
        with logging_listeners.DynamicLoggingListener(engine):
            task_event(engine, states.FAILURE, states.RUNNING, result=make_failure())
    assert caplog.records == []


# -- FailureFormatter ---------------------------------------------------------


def test_tree_layout_matches_taskflow_example():
    # The example tree of TaskFlow's tree.Node.pformat documentation.
    def node(name, *children):
        n = formatting._TreeNode(name, {})
        n.children.extend(children)
        return n

    tree = node("CEO", node("Infra", node("Boss", node("Me"))), node("Mobile"), node("Mail"))
    text = formatting._render_tree(tree, lambda n: n.name)
    assert text.split(os.linesep) == [
        "CEO",
        "|__Infra",
        "|  |__Boss",
        "|     |__Me",
        "|__Mobile",
        "|__Mail",
    ]


class FakeAtom:
    def __init__(self, name: str, rebind: dict | None = None) -> None:
        self.name = name
        self.rebind = rebind or {}
        self.optional = set()


class FakeCompilation:
    def __init__(self, graph: nx.DiGraph) -> None:
        self.execution_graph = graph


def linear_graph() -> nx.DiGraph:
    # f: [a, g: [b], c, d]  compiled as  f -> a -> g -> b -> g[end] -> c -> d -> f[end]
    g = nx.DiGraph()
    g.add_node("f[1]", kind="flow", name="f")
    g.add_node("a", kind="task", atom=FakeAtom("a", {"v": "seed"}))
    g.add_node("g[2]", kind="flow", name="g")
    g.add_node("b", kind="task", atom=FakeAtom("b"))
    g.add_node("g[2][end]", kind="flow_end")
    g.add_node("c", kind="task", atom=FakeAtom("c", {"x": "a"}))
    g.add_node("d", kind="task", atom=FakeAtom("d"))
    g.add_node("f[1][end]", kind="flow_end")
    nx.add_path(g, ["f[1]", "a", "g[2]", "b", "g[2][end]", "c", "d", "f[1][end]"])
    return g


def linear_storage() -> FakeStorage:
    storage = FakeStorage()
    storage.intentions = {"a": "EXECUTE", "b": "EXECUTE", "c": "EXECUTE", "d": "EXECUTE"}
    storage.states = {"a": "SUCCESS", "b": "SUCCESS", "c": "SUCCESS", "d": "FAILURE"}
    storage.results = {"seed": 0, "a": 1, "b": 2, "c": 3}
    return storage


def test_failure_formatter_lists_predecessors_most_recent_first():
    engine = FakeEngine(storage=linear_storage(), compilation=FakeCompilation(linear_graph()))
    fail = make_failure()
    exc_info, text = formatting.FailureFormatter(engine, ("c",)).format(fail, "d")
    assert exc_info is fail.exc_info
    # As in TaskFlow, the atom that closed a subflow ('b') is walked through
    # but not shown: the subflow appears as its start node.
    assert text.split(os.linesep) == [
        "4 predecessors (most recent first):",
        "  Atom 'c' {'intention': 'EXECUTE', 'state': 'SUCCESS'}",
        "  |__Flow 'g'",
        "     |__Atom 'a' {'intention': 'EXECUTE', 'state': 'SUCCESS', 'requires': {'v': 0},"
        " 'provides': 1}",
        "        |__Flow 'f'",
    ]


def test_failure_formatter_branches_and_reverting_atoms():
    g = nx.DiGraph()
    g.add_node("f[1]", kind="flow", name="f")
    for name in ("a", "b", "c"):
        g.add_node(name, kind="task", atom=FakeAtom(name))
    g.add_edges_from([("f[1]", "a"), ("f[1]", "b"), ("a", "c"), ("b", "c")])
    storage = FakeStorage()
    storage.intentions = {"c": "EXECUTE"}
    engine = FakeEngine(storage=storage, compilation=FakeCompilation(g))
    _, text = formatting.FailureFormatter(engine).format(make_failure(), "c")
    assert text.split(os.linesep) == [
        "4 predecessors (most recent first):",
        "  Atom 'a' {'requires': {}}",
        "  |__Flow 'f'",
        "  Atom 'b' {'requires': {}}",
        "  |__Flow 'f'",
    ]
    storage.intentions = {"c": "REVERT"}
    assert formatting.FailureFormatter(engine).format(make_failure(), "c")[1] == ""


def test_dynamic_logging_failure_with_predecessors(caplog):
    engine = FakeEngine(storage=linear_storage(), compilation=FakeCompilation(linear_graph()))
    fail = make_failure()
    with caplog.at_level(logging.DEBUG, logger="flowengine.listeners.logging"):
        with logging_listeners.DynamicLoggingListener(engine):
            task_event(engine, states.FAILURE, states.RUNNING, name="d", result=fail)
    (record,) = caplog.records
    lines = record.getMessage().split(os.linesep)
    assert lines[0] == "Task 'd' (d-uuid) transitioned into state 'FAILURE' from state 'RUNNING'"
    assert lines[1] == "4 predecessors (most recent first):"
    assert lines[2] == (
        "  Atom 'c' {'intention': 'EXECUTE', 'state': 'SUCCESS',"
        " 'requires': {'x': 1}, 'provides': 3}"
    )
    assert lines[-1] == "        |__Flow 'f'"
    assert record.exc_info[1] is fail.exception


# -- CaptureListener ----------------------------------------------------------


def test_capture_listener_records_kind_state_details():
    engine = FakeEngine()
    with capturing.CaptureListener(engine) as capture:
        success_run(engine)
        retry_event(engine, states.RUNNING, states.PENDING)
    assert [(kind, state) for kind, state, _ in capture.values] == [
        ("flow", "RUNNING"),
        ("task", "RUNNING"),
        ("task", "SUCCESS"),
        ("flow", "SUCCESS"),
        ("retry", "RUNNING"),
    ]
    assert capture.values[2][2] == {
        "task_name": "t",
        "task_uuid": "t-uuid",
        "old_state": "RUNNING",
        "result": 5,
    }


def test_capture_listener_skips_and_appends_to_given_values():
    engine = FakeEngine()
    previous = [("old",)]
    with capturing.CaptureListener(
        engine, capture_flow=False, skip_tasks=["t"], skip_retries=["r"], values=previous
    ) as capture:
        success_run(engine)
        task_event(engine, states.RUNNING, states.PENDING, name="u")
        retry_event(engine, states.RUNNING, states.PENDING, name="r")
    assert capture.values is previous
    assert [v[:2] for v in previous] == [("old",), ("task", "RUNNING")]


# -- timing -------------------------------------------------------------------


def test_duration_listener_stores_durations():
    engine = FakeEngine()
    with timing.DurationListener(engine):
        success_run(engine)
        task_event(engine, states.RUNNING, states.PENDING, name="u")
        task_event(engine, states.PENDING, states.RUNNING, name="u")  # reset: no duration
    assert set(engine.storage.atom_meta) == {"t"}
    assert isinstance(engine.storage.atom_meta["t"]["duration"], float)
    assert engine.storage.atom_meta["t"]["duration"] >= 0.0
    assert engine.storage.flow_meta["duration"] >= engine.storage.atom_meta["t"]["duration"]


def test_duration_listener_warns_about_unfinished_and_survives_storage_failure(caplog):
    engine = FakeEngine(storage=FakeStorage(fail=True))
    with caplog.at_level(logging.WARNING, logger="flowengine.listeners.timing"):
        with timing.DurationListener(engine):
            task_event(engine, states.RUNNING, states.PENDING)
            task_event(engine, states.SUCCESS, states.RUNNING, result=1)
            task_event(engine, states.RUNNING, states.PENDING, name="u")
    duration = caplog.records[0].args[0]["duration"]
    assert caplog.messages[0] == (
        f"Failure to store duration update {{'duration': {duration!r}}} for task t"
    )
    assert caplog.messages[1].startswith("1 task(s) did not enter frozenset({")
    assert caplog.messages[1].endswith("}) states")


def test_printing_duration_listener_text():
    engine = FakeEngine()
    printed: list[str] = []
    with timing.PrintingDurationListener(engine, printer=printed.append):
        success_run(engine)
    assert printed[0] == "'f' flow started."
    assert printed[1] == "'t' task started."
    assert re.fullmatch(r"It took task 't' \d+\.\d\d seconds to finish\.", printed[2])
    assert re.fullmatch(r"It took flow 'f' \d+\.\d\d seconds to finish\.", printed[3])
    assert len(printed) == 4


def test_printing_duration_listener_prints_to_stdout_by_default(capsys):
    engine = FakeEngine()
    with timing.PrintingDurationListener(engine):
        task_event(engine, states.RUNNING, states.PENDING)
    assert capsys.readouterr().out == "'t' task started.\n"


def test_event_time_listener_stores_timestamps():
    engine = FakeEngine()
    with timing.EventTimeListener(engine):
        success_run(engine)
        retry_event(engine, states.RUNNING, states.PENDING)
    meta = engine.storage.atom_meta
    assert set(meta["t"]) == {"RUNNING-timestamp", "SUCCESS-timestamp"}
    assert set(meta["r"]) == {"RUNNING-timestamp"}
    assert set(engine.storage.flow_meta) == {"RUNNING-timestamp", "SUCCESS-timestamp"}
    assert meta["t"]["RUNNING-timestamp"] <= meta["t"]["SUCCESS-timestamp"]


# -- against a real serial engine ---------------------------------------------
# Imported lazily so the fake-engine tests above still run if the engine breaks.


def _engines():
    from flowengine import engines

    return engines


def _task_classes():
    from flowengine import task

    class Const(task.Task):
        def execute(self):
            return 1

    class AddOne(task.Task):
        def execute(self, a):
            return a + 1

    class Boom(task.Task):
        def execute(self):
            raise RuntimeError("Woot!")

    return Const, AddOne, Boom


def make_flow(fail: bool = False, retry_times: int | None = None):
    from flowengine import retry
    from flowengine.patterns import linear_flow as lf

    const, add_one, boom = _task_classes()
    r = retry.Times(retry_times, "r") if retry_times else None
    flow = lf.Flow("f", retry=r).add(const("a", provides="a"), add_one("b", provides="b"))
    if fail:
        flow.add(boom("c"))
    return flow


def load(flow, engine: str = "serial"):
    from flowengine.persistence.backends import impl_memory
    from flowengine.utils import persistence_utils

    backend = impl_memory.MemoryBackend()
    book = persistence_utils.temporary_log_book(backend)
    flow_detail = persistence_utils.create_flow_detail(flow, book=book, backend=backend)
    loaded = _engines().load(flow, flow_detail=flow_detail, backend=backend, engine=engine)
    return loaded, flow_detail


class ShortCapture(capturing.CaptureListener):
    """Captures 'name.k STATE(result)' strings, TaskFlow's own test format."""

    @staticmethod
    def _format_capture(kind, state, details):
        name = details[f"{kind}_name"]
        if "result" in details:
            return f"{name}.{kind[0]} {state}({details['result']})"
        return f"{name}.{kind[0]} {state}"


def run_engine(engine) -> BaseException | None:
    try:
        engine.run()
    except RuntimeError as e:
        return e
    return None


SUCCESS_CAPTURE = [
    "f.f RUNNING",
    "a.t RUNNING",
    "a.t SUCCESS(1)",
    "b.t RUNNING",
    "b.t SUCCESS(2)",
    "f.f SUCCESS",
]
FAILURE_CAPTURE = [
    "f.f RUNNING",
    "a.t RUNNING",
    "a.t SUCCESS(1)",
    "b.t RUNNING",
    "b.t SUCCESS(2)",
    "c.t RUNNING",
    "c.t FAILURE(Failure: RuntimeError: Woot!)",
    "c.t REVERTING",
    "c.t REVERTED(None)",
    "b.t REVERTING",
    "b.t REVERTED(None)",
    "a.t REVERTING",
    "a.t REVERTED(None)",
    "f.f REVERTED",
]


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_engine_capture_success_and_failure_runs(kind):
    engine, _ = load(make_flow(), kind)
    baseline = registered_count(engine)
    with ShortCapture(engine) as capture:
        assert run_engine(engine) is None
    assert capture.values == SUCCESS_CAPTURE
    assert registered_count(engine) == baseline

    engine, _ = load(make_flow(fail=True), kind)
    with ShortCapture(engine) as capture:
        assert str(run_engine(engine)) == "Woot!"
    assert capture.values == FAILURE_CAPTURE


def test_engine_capture_retry_events():
    engine, _ = load(make_flow(fail=True, retry_times=2))
    with ShortCapture(engine, skip_tasks=["a", "b"]) as capture:
        run_engine(engine)
    assert capture.values == [
        "f.f RUNNING",
        "r.r RUNNING",
        "r.r SUCCESS(1)",
        "c.t RUNNING",
        "c.t FAILURE(Failure: RuntimeError: Woot!)",
        "c.t REVERTING",
        "c.t REVERTED(None)",
        "r.r RETRYING",
        "c.t PENDING",
        "r.r RUNNING",
        "r.r SUCCESS(2)",
        "c.t RUNNING",
        "c.t FAILURE(Failure: RuntimeError: Woot!)",
        "c.t REVERTING",
        "c.t REVERTED(None)",
        "r.r REVERTING",
        "r.r REVERTED(None)",
        "f.f REVERTED",
    ]


def expected_dump_lines(engine, captured: list[str]) -> list[str]:
    """TaskFlow's PrintingListener lines for a ShortCapture sequence."""
    storage = engine.storage
    lines = []
    for item in captured:
        head, state = item.split(" ", 1)
        name, kind = head.split(".")
        result = None
        if "(" in state:
            state, result = state[:-1].split("(", 1)
        if kind == "f":
            lines.append(
                f"{engine} has moved flow '{name}' ({storage.flow_uuid}) into state"
                f" '{state}' from state '{FLOW_OLD_STATES[state]}'"
            )
            continue
        line = (
            f"{engine} has moved task '{name}' ({storage.get_atom_uuid(name)}) into"
            f" state '{state}' from state '{TASK_OLD_STATES[state]}'"
        )
        if result is not None:
            line += f" with result '{result}' (failure={result.startswith('Failure')})"
        lines.append(line)
    return lines


FLOW_OLD_STATES = {"RUNNING": "PENDING", "SUCCESS": "RUNNING", "REVERTED": "RUNNING"}
TASK_OLD_STATES = {
    "RUNNING": "PENDING",
    "SUCCESS": "RUNNING",
    "FAILURE": "RUNNING",
    "REVERTING": "FAILURE",
    "REVERTED": "REVERTING",
}


def strip_tracebacks(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    kept, tracebacks, current = [], [], None
    for line in lines:
        if line == "Traceback (most recent call last):":
            current = [line]
            continue
        if current is not None:
            current.append(line)
            if not line.startswith(" "):
                tracebacks.append(current)
                current = None
            continue
        kept.append(line)
    return kept, tracebacks


def test_engine_printing_listener_success(capsys):
    engine, _ = load(make_flow())
    with printing.PrintingListener(engine):
        engine.run()
    assert capsys.readouterr().out.splitlines() == expected_dump_lines(engine, SUCCESS_CAPTURE)


def test_engine_printing_listener_failure(capsys):
    engine, _ = load(make_flow(fail=True))
    with printing.PrintingListener(engine):
        run_engine(engine)
    lines = capsys.readouterr().out.splitlines()
    # REVERTING of an atom that succeeded comes from SUCCESS, not FAILURE.
    expected = expected_dump_lines(engine, FAILURE_CAPTURE)
    expected = [
        line.replace("'REVERTING' from state 'FAILURE'", "'REVERTING' from state 'SUCCESS'")
        if ("'a'" in line or "'b'" in line)
        else line
        for line in expected
    ]
    kept, tracebacks = strip_tracebacks(lines)
    assert kept == expected
    (tb,) = tracebacks
    assert lines[lines.index(tb[0]) - 1] == expected[6]  # right after c's FAILURE line
    assert tb[-1] == "RuntimeError: Woot!"


def test_engine_logging_listener_success(caplog):
    engine, _ = load(make_flow())
    with caplog.at_level(logging.DEBUG, logger="flowengine.listeners.logging"):
        with logging_listeners.LoggingListener(engine):
            engine.run()
    records = [r for r in caplog.records if r.name == "flowengine.listeners.logging"]
    assert [r.getMessage() for r in records] == expected_dump_lines(engine, SUCCESS_CAPTURE)


def test_engine_dynamic_logging_failure_run(caplog):
    engine, _ = load(make_flow(fail=True))
    with caplog.at_level(logging.DEBUG, logger="flowengine.listeners.logging"):
        with logging_listeners.DynamicLoggingListener(engine):
            run_engine(engine)
    records = [
        (r.levelname, r.getMessage(), r.exc_info)
        for r in caplog.records
        if r.name == "flowengine.listeners.logging"
    ]
    uuid_of = engine.storage.get_atom_uuid
    flow_uuid = engine.storage.flow_uuid

    def task_line(name, state, old, result=None):
        line = (
            f"Task '{name}' ({uuid_of(name)}) transitioned into state '{state}' from state '{old}'"
        )
        return line if result is None else line + f" with result '{result}'"

    sep = os.linesep
    assert [(level, msg) for level, msg, _ in records] == [
        ("DEBUG", f"Flow 'f' ({flow_uuid}) transitioned into state 'RUNNING' from state 'PENDING'"),
        ("DEBUG", task_line("a", "RUNNING", "PENDING")),
        ("DEBUG", task_line("a", "SUCCESS", "RUNNING", 1)),
        ("DEBUG", task_line("b", "RUNNING", "PENDING")),
        ("DEBUG", task_line("b", "SUCCESS", "RUNNING", 2)),
        ("DEBUG", task_line("c", "RUNNING", "PENDING")),
        (
            "WARNING",
            task_line("c", "FAILURE", "RUNNING")
            + sep
            + "3 predecessors (most recent first):"
            + sep
            + "  Atom 'b' {'intention': 'EXECUTE', 'state': 'SUCCESS', 'requires': {'a': 1},"
            " 'provides': 2}"
            + sep
            + "  |__Atom 'a' {'intention': 'EXECUTE', 'state': 'SUCCESS', 'requires': {},"
            " 'provides': 1}" + sep + "     |__Flow 'f'",
        ),
        ("DEBUG", task_line("c", "REVERTING", "FAILURE")),
        ("WARNING", task_line("c", "REVERTED", "REVERTING", None) + " with result 'None'"),
        ("DEBUG", task_line("b", "REVERTING", "SUCCESS")),
        ("WARNING", task_line("b", "REVERTED", "REVERTING") + " with result 'None'"),
        ("DEBUG", task_line("a", "REVERTING", "SUCCESS")),
        ("WARNING", task_line("a", "REVERTED", "REVERTING") + " with result 'None'"),
        (
            "WARNING",
            f"Flow 'f' ({flow_uuid}) transitioned into state 'REVERTED' from state 'RUNNING'",
        ),
    ]
    exc_info = records[6][2]
    assert exc_info[0] is RuntimeError and str(exc_info[1]) == "Woot!"


def test_engine_duration_and_event_time_listeners_store_metadata():
    engine, flow_detail = load(make_flow(fail=True))
    printed: list[str] = []
    with (
        timing.PrintingDurationListener(engine, printer=printed.append),
        timing.EventTimeListener(engine),
    ):
        run_engine(engine)
    for name in ("a", "b", "c"):
        meta = flow_detail.find(engine.storage.get_atom_uuid(name)).meta
        assert isinstance(meta["duration"], float) and meta["duration"] >= 0.0
        assert {"RUNNING-timestamp", "REVERTING-timestamp", "REVERTED-timestamp"} <= set(meta)
    assert flow_detail.meta["duration"] >= 0.0
    assert {"RUNNING-timestamp", "REVERTED-timestamp"} <= set(flow_detail.meta)
    assert printed[:2] == ["'f' flow started.", "'a' task started."]
    assert re.fullmatch(r"It took flow 'f' \d+\.\d\d seconds to finish\.", printed[-1])


def test_engine_text_is_taskflow_default_repr(capsys):
    # TaskFlow prints the engine with object's default repr; log parsers match it.
    engine, _ = load(make_flow())
    with printing.PrintingListener(engine, task_listen_for=()):
        engine.run()
    first = capsys.readouterr().out.splitlines()[0]
    assert re.match(
        r"<flowengine\.engines\.action_engine\.engine\.SerialActionEngine"
        r" object at 0x[0-9a-f]+> has moved flow 'f' ",
        first,
    )


def test_engine_progress_updates_do_not_show_in_listener_output(capsys):
    from flowengine import task
    from flowengine.patterns import linear_flow as lf

    class Progressing(task.Task):
        def execute(self):
            self.update_progress(0.5)
            return 1

    engine, _ = load(lf.Flow("f").add(Progressing("p")))
    with (
        printing.PrintingListener(engine),
        ShortCapture(engine) as capture,
        ShortCapture(engine, task_listen_for=["update_progress"], flow_listen_for=()) as progress,
    ):
        engine.run()
    assert capture.values == ["f.f RUNNING", "p.t RUNNING", "p.t SUCCESS(1)", "f.f SUCCESS"]
    assert progress.values == ["p.t update_progress"]
    assert "update_progress" not in capsys.readouterr().out
