"""Tests for Task, FunctorTask, MapFunctorTask and ReduceFunctorTask."""

import logging
import pickle
import threading

import pytest

from flowengine import engines, task
from flowengine.patterns import linear_flow


class Adder(task.Task):
    def execute(self, x, y):
        return x + y


def add(x, y=2):
    return x + y


def undo_add(x, result, flow_failures, y=2):
    return ("undone", x, result)


def test_task_name_and_notifier():
    t = Adder()
    assert t.name == f"{__name__}.Adder"
    assert isinstance(t, task.BaseTask)
    assert task.Task.TASK_EVENTS == (task.EVENT_UPDATE_PROGRESS,)
    assert task.EVENT_UPDATE_PROGRESS == "update_progress"
    with pytest.raises(ValueError):
        t.notifier.register("not-a-task-event", lambda event_type, details: None)


def test_each_task_has_its_own_notifier():
    assert Adder().notifier is not Adder().notifier


def test_notifier_is_made_once_even_when_threads_first_touch_it_together():
    t = Adder()
    start = threading.Barrier(8)
    seen = []

    def touch():
        start.wait(timeout=10)
        seen.append(t.notifier)

    threads = [threading.Thread(target=touch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(seen) == 8 and all(n is seen[0] for n in seen)
    assert t.notifier is seen[0]


def test_engine_drops_only_the_notifier_it_made_for_progress():
    # Given a flow where one task has a listener and the other was never asked
    # for its notifier
    class Reporter(task.Task):
        def execute(self):
            self.update_progress(0.5)

    listened, quiet = Reporter(name="listened"), Reporter(name="quiet")
    heard = []
    listened.notifier.register(
        task.EVENT_UPDATE_PROGRESS, lambda event_type, details: heard.append(details["progress"])
    )
    own = listened.notifier
    # When the flow runs
    engine = engines.load(linear_flow.Flow("f").add(listened, quiet))
    engine.run()
    # Then the listener heard the task's progress and keeps its notifier;
    # the quiet task holds none (the one made to pass its progress on is
    # gone), and its progress still reached storage
    assert heard == [0.0, 0.5, 1.0]
    assert listened.notifier is own
    assert quiet._made_notifier is None
    assert engine.storage.get_task_progress("quiet") == 1.0


def test_a_notifier_taken_while_the_engine_held_it_stays_the_tasks():
    # Given a task whose notifier the engine made to pass its progress on,
    # and code that takes a reference to it meanwhile (here the task itself;
    # as well another thread) to register a listener later
    taken = []

    class Taker(task.Task):
        def execute(self):
            taken.append(self.notifier)

    t = Taker()
    engines.run(linear_flow.Flow("f").add(t))
    # When a listener is registered through that reference after the run
    heard = []
    taken[0].register(task.EVENT_UPDATE_PROGRESS, lambda event_type, details: heard.append(details))
    t.update_progress(0.5)
    # Then it hears the task: the engine did not drop the notifier it had made
    assert t.notifier is taken[0]
    assert heard == [{"progress": 0.5}]


def test_code_written_for_taskflow_notifies_through_the_private_notifier():
    # Given a task that reports as TaskFlow's tasks may (Masakari's call
    # self._notifier.notify), with a listener on its public notifier
    class Detailed(task.Task):
        def execute(self):
            self._notifier.notify(task.EVENT_UPDATE_PROGRESS, {"progress": 0.5, "x": 1})

    t = Detailed()
    heard = []
    t.notifier.register(
        task.EVENT_UPDATE_PROGRESS, lambda event_type, details: heard.append(details)
    )
    # When it runs, alone and in a flow
    t.execute()
    engines.run(linear_flow.Flow("f").add(Detailed(name="in-flow")))
    # Then the listener heard it, and both names are one notifier
    assert heard == [{"progress": 0.5, "x": 1}]
    assert t._notifier is t.notifier


def test_update_progress_notifies_and_clamps(caplog):
    t = Adder()
    got = []
    t.notifier.register(
        task.EVENT_UPDATE_PROGRESS, lambda event_type, details: got.append(details["progress"])
    )
    t.update_progress(0.5)
    with caplog.at_level(logging.WARNING, logger=task.__name__):
        t.update_progress(1.5)
        t.update_progress(-1)
    assert got == [0.5, 1.0, 0.0]
    assert "Progress value must be" in caplog.text


def test_copy_retains_or_drops_listeners():
    t = Adder()
    got = []
    t.notifier.register(task.EVENT_UPDATE_PROGRESS, lambda event_type, details: got.append("x"))
    kept = t.copy()
    dropped = t.copy(retain_listeners=False)
    assert kept.notifier is not t.notifier
    kept.update_progress(0.1)
    dropped.update_progress(0.1)
    assert got == ["x"]
    assert kept.name == t.name and kept.rebind == t.rebind


def test_functor_task_maps_the_callable_signature():
    t = task.FunctorTask(add, provides="sum")
    assert t.name == f"{__name__}.add"
    assert list(t.requires) == ["x"]
    assert list(t.optional) == ["y"]
    assert t.save_as == {"sum": None}
    assert t.execute(x=1) == 3
    assert t.revert(x=1, result=3, flow_failures={}) is None
    assert t.revert_rebind == t.rebind


def test_functor_task_with_revert_and_version():
    t = task.FunctorTask(
        add, name="adder", revert=undo_add, version=(2, 1), rebind={"x": "ex"}, inject={"y": 5}
    )
    assert str(t) == '"adder==2.1"'
    assert t.rebind == {"x": "ex", "y": "y"}
    assert list(t.requires) == ["ex"]
    assert list(t.optional) == []
    assert t.revert_rebind == {"x": "ex", "y": "y"}
    assert t.revert(x=1, result=3, flow_failures={}) == ("undone", 1, 3)


def test_functor_task_rejects_non_callables():
    with pytest.raises(ValueError):
        task.FunctorTask(3)
    with pytest.raises(ValueError):
        task.FunctorTask(add, revert="nope")


def test_functor_task_lambda_name():
    t = task.FunctorTask(lambda: 1)
    assert t.name.endswith("<lambda>")


def test_map_functor_task():
    t = task.MapFunctorTask(lambda v: v * 2, requires=["a", "b", "c"], provides="doubled")
    assert list(t.requires) == ["a", "b", "c"]
    assert t.execute(a=1, b=2, c=3) == [2, 4, 6]
    with pytest.raises(ValueError):
        task.MapFunctorTask(lambda a, b: a, requires=["a"])
    with pytest.raises(TypeError):
        task.MapFunctorTask(lambda v: v, requires=5)
    with pytest.raises(ValueError):
        task.MapFunctorTask("no", requires=["a"])


def test_reduce_functor_task():
    t = task.ReduceFunctorTask(lambda a, b: a + b, requires=["x", "y", "z"], provides="total")
    assert t.execute(x=1, y=2, z=3) == 6
    with pytest.raises(ValueError) as info:
        task.ReduceFunctorTask(lambda a: a, requires=["x", "y"])
    assert "exactly 2 arguments" in str(info.value)
    with pytest.raises(ValueError):
        task.ReduceFunctorTask(lambda a, b: a, requires=["x"])


def test_map_functor_task_with_rebind():
    t = task.MapFunctorTask(lambda v: -v, requires=["a"], rebind={"a": "src"})
    assert list(t.requires) == ["src"]
    assert t.execute(a=4) == [-4]


def test_task_pickles_without_listeners():
    t = Adder(name="pickled", provides="s")
    clone = pickle.loads(pickle.dumps(t.copy(retain_listeners=False)))
    assert clone.name == "pickled" and clone.save_as == {"s": None}
    assert clone.execute(1, 2) == 3
    got = []
    clone.notifier.register(
        task.EVENT_UPDATE_PROGRESS, lambda event_type, details: got.append(details)
    )
    clone.update_progress(0.25)
    assert got == [{"progress": 0.25}]
