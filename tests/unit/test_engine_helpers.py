"""engines.load/run/load_from_factory/... and engine lookup by name."""

from __future__ import annotations

import contextlib

import pytest

from flowengine import engines, exceptions, states, task
from flowengine.engines import helpers
from flowengine.engines.action_engine import engine as ae
from flowengine.patterns import linear_flow as lf
from flowengine.persistence import helpers as p_utils
from flowengine.persistence.backends import impl_memory
from flowengine.utils import plugins


class Echo(task.Task):
    """Returns its input."""

    def execute(self, value):
        return value


def make_flow(suffix="", provides="out"):
    """A reimportable flow factory."""
    return lf.Flow("factory-flow" + suffix).add(Echo("echo", provides=provides))


@pytest.mark.parametrize(
    "name, cls",
    [
        ("default", ae.SerialActionEngine),
        ("serial", ae.SerialActionEngine),
        ("parallel", ae.ParallelActionEngine),
        ("parallel://?max_workers=2", ae.ParallelActionEngine),
    ],
)
def test_engine_lookup_by_name(name, cls):
    engine = engines.load(make_flow(), engine=name)
    assert type(engine) is cls


def test_uri_options_and_kwargs_merge():
    engine = engines.load(make_flow(), engine="parallel://?max_workers=3", foo="bar")
    assert engine.options["max_workers"] == "3"
    assert engine.options["foo"] == "bar"


def test_taskflow_engine_conf_spelling():
    engine = engines.load(make_flow(), engine_conf={"engine": "parallel", "max_workers": 2})
    assert isinstance(engine, ae.ParallelActionEngine)
    assert engine.options["max_workers"] == 2
    engine = engines.load(make_flow(), engine_conf="serial")
    assert isinstance(engine, ae.SerialActionEngine)


def test_builtin_table_used_without_entry_points(monkeypatch):
    monkeypatch.setattr(plugins, "_entry_points", lambda namespace: {})
    engine = engines.load(make_flow(), engine="parallel")
    assert isinstance(engine, ae.ParallelActionEngine)


def test_a_name_not_built_in_is_looked_up_in_the_entry_points(monkeypatch):
    class Plugged:
        """An entry point naming the serial engine under another name."""

        name = "plugged"

        def load(self):
            return ae.SerialActionEngine

    asked = []

    def entry_points(namespace):
        asked.append(namespace)
        return {"plugged": Plugged()}

    monkeypatch.setattr(plugins, "_entry_points", entry_points)
    engines.load(make_flow(), engine="serial")
    assert asked == []  # a built-in name never scans the installed metadata
    engine = engines.load(make_flow(), engine="plugged")
    assert type(engine) is ae.SerialActionEngine
    assert asked == [helpers.ENGINES_NAMESPACE]


def test_unknown_engine_lists_known_ones():
    with pytest.raises(exceptions.NotFound, match="serial"):
        engines.load(make_flow(), engine="warp-drive")


def _in_a_fresh_process(code: str) -> str:
    """What ``code`` prints, run by a new interpreter on this source tree."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    return done.stdout.strip()


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_local_engines_do_not_import_kombu():
    code = (
        "import sys; from flowengine import engines; from flowengine.patterns import "
        "linear_flow as lf; engines.run(lf.Flow('f'), engine='parallel'); "
        "print('kombu' in sys.modules)"
    )
    assert _in_a_fresh_process(code) == "False"


@pytest.mark.broker  # starts a process (tests/fast_tier.py)
def test_a_first_local_run_reads_no_distribution_metadata_and_no_json_schema():
    # Each costs tens of milliseconds in a process's first flow (a
    # conductor's first job): entry points are only read for names that are
    # not built in, and jsonschema only once a failure is validated.
    code = (
        "import sys; from flowengine import engines, task; from flowengine.patterns import "
        "linear_flow as lf; from flowengine.utils import plugins\n"
        "class T(task.Task):\n    def execute(self): raise ValueError('boom')\n"
        "try:\n    engines.run(lf.Flow('f').add(T('t')), backend='memory://')\n"
        "except ValueError: pass\n"
        "print(plugins._entry_points.cache_info().currsize, 'jsonschema' in sys.modules)"
    )
    assert _in_a_fresh_process(code) == "0 False"


def test_run_returns_all_results():
    assert engines.run(make_flow(), store={"value": 4}) == {"value": 4, "out": 4}


def test_store_is_injected():
    engine = engines.load(make_flow(), store={"value": 1})
    assert engine.storage.fetch("value") == 1


def test_load_with_backend_config_and_book():
    backend = impl_memory.MemoryBackend()
    book = p_utils.temporary_log_book(backend)
    engine = engines.load(make_flow(), store={"value": 2}, book=book, backend=backend)
    engine.run()
    with contextlib.closing(backend.get_connection()) as conn:
        flow_detail = conn.get_flow_details(engine.storage.flow_uuid)
    assert flow_detail.state == states.SUCCESS


def test_load_from_factory_and_resume_from_detail():
    backend = impl_memory.MemoryBackend()
    engine = engines.load_from_factory(
        make_flow,
        factory_args=["-x"],
        factory_kwargs={"provides": "o"},
        store={"value": 5},
        backend=backend,
    )
    flow_detail = _flow_detail_of(engine, backend)
    assert flow_detail.meta["factory"] == {
        "name": f"{__name__}.make_flow",
        "args": ["-x"],
        "kwargs": {"provides": "o"},
    }
    flow = engines.flow_from_detail(flow_detail)
    assert flow.name == "factory-flow-x"
    engine2 = engines.load_from_detail(flow_detail, store={"value": 6}, backend=backend)
    engine2.run()
    assert engine2.storage.fetch("o") == 6


def _flow_detail_of(engine, backend):
    with contextlib.closing(backend.get_connection()) as conn:
        return conn.get_flow_details(engine.storage.flow_uuid)


def test_load_from_factory_by_name():
    engine = engines.load_from_factory(f"{__name__}.make_flow", store={"value": 1})
    engine.run()
    assert engine.storage.fetch("out") == 1


def test_factory_must_be_reimportable():
    def local_factory():
        return make_flow()

    with pytest.raises(ValueError, match="reimportable"):
        engines.load_from_factory(local_factory)


def test_flow_from_detail_without_factory():
    _book, flow_detail = p_utils.temporary_flow_detail()
    with pytest.raises(ValueError, match="no factory"):
        engines.flow_from_detail(flow_detail)


def test_save_factory_details_keeps_other_meta():
    _book, flow_detail = p_utils.temporary_flow_detail(meta={"mine": 1})
    engines.save_factory_details(flow_detail, make_flow, [], {})
    assert flow_detail.meta["mine"] == 1
    assert flow_detail.meta["factory"]["name"] == f"{__name__}.make_flow"
