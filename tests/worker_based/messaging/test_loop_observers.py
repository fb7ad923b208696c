"""A consume loop calls, in each hook, only the observers that do something there.

A round (one message on most transports) calls ``after_round``: observers
that leave a hook LoopObserver's no-op are skipped, those that override it
in their class, set it on the instance, or are duck-typed are called.
"""

from __future__ import annotations

from flowengine.engines.worker_based.messaging import consumer as consumer_mod
from flowengine.engines.worker_based.messaging.consumer import LoopObserver


class Rounds(LoopObserver):
    def after_round(self) -> None:
        pass


class Starts(LoopObserver):
    def after_consume_start(self) -> None:
        pass


class DuckTyped:
    """Not a LoopObserver: every hook it has counts."""

    def after_round(self) -> None:
        pass


def test_only_observers_that_override_a_hook_are_called_in_it():
    rounds, starts, plain = Rounds(), Starts(), LoopObserver()
    on_instance = LoopObserver()
    on_instance.after_round = lambda: None  # type: ignore[method-assign]
    duck = DuckTyped()
    observers = [rounds, starts, plain, on_instance, duck]
    chosen = {
        hook: [o for o in observers if consumer_mod._overrides(o, hook)]
        for hook in consumer_mod._HOOKS
    }
    assert chosen["after_round"] == [rounds, on_instance, duck]
    assert chosen["after_consume_start"] == [starts, duck]
    assert chosen["every_wait_period"] == [duck]
    assert set(consumer_mod._HOOKS) == {
        "after_consume_start",
        "every_wait_period",
        "after_round",
        "after_loop_exit",
        "after_failing_change",
    }
