"""What engines say on the event stream, called from their notifiers.

:class:`FlowEvents` listens to an engine and hands each event to an
:class:`~flowengine.engines.worker_based.events.EventPublisher`. A worker's
events come from one of its middleware
(:mod:`flowengine.engines.worker_based.worker_side.worker_events`). With
events disabled nothing is sent. When the sender signs its messages (it has
a keyring) its events are signed with the same keyring.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any

from flowengine import states
from flowengine.engines.base import Engine
from flowengine.engines.worker_based.events.publisher import EventPublisher
from flowengine.engines.worker_based.messaging.settings import BrokerSettings

#: Whether workers and engines publish events when not told: off, because
#: publishing costs a broker write per event (see doc/source/events.rst for
#: the measured cost) and most deployments never watch.
EVENTS_BY_DEFAULT = False


class FlowEvents:
    """An engine's events: flow-started/flow-finished and task-retried."""

    #: Flow states that end a run.
    FINAL_STATES = (states.SUCCESS, states.FAILURE, states.REVERTED, states.SUSPENDED)

    def __init__(self, publisher: EventPublisher) -> None:
        self.publisher = publisher
        self.root_id: str | None = None
        # Retries of each controller in the current run (its events' attempt).
        self._retries: dict[str | None, int] = {}

    @classmethod
    def from_options(cls, options: Mapping[str, Any], exchange: str) -> FlowEvents:
        """Events for an engine, from its ``events``/``url``/``transport*``/``secret`` options.

        Events are signed with the keys the engine's executor signs with:
        the ``secret`` option, else ``$FLOWENGINE_SECRET_FILE`` /
        ``$FLOWENGINE_SECRET`` (read only when events are on).
        """
        enabled = options.get("events")
        enabled = EVENTS_BY_DEFAULT if enabled is None else bool(enabled)
        if options.get("broker") is not None:
            # The engine's own broker settings (checked by its executor);
            # their keys are read only when events are on.
            broker = BrokerSettings.from_options(options)
            if not enabled:
                broker = dataclasses.replace(broker, secret=False)
        else:
            broker = BrokerSettings(
                url=options.get("url"),
                transport=options.get("transport"),
                transport_options=options.get("transport_options") or {},
                secret=options.get("secret") if enabled else False,
            )
        publisher = EventPublisher(
            exchange,
            hostname=f"engine:{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}",
            enabled=enabled,
            secret=broker.keyring,
            broker=broker,
        )
        return cls(publisher)

    def attach(self, engine: Engine) -> None:
        """Listen to ``engine``'s flow and atom notifications."""
        if not self.publisher.enabled:
            return
        engine.notifier.register(engine.notifier.ANY, self._on_flow)
        engine.atom_notifier.register(engine.atom_notifier.ANY, self._on_atom)

    def _on_flow(self, state: str, details: Mapping[str, Any]) -> None:
        fields = {
            "root_id": details.get("flow_uuid"),
            "flow_name": details.get("flow_name"),
            "state": state,
        }
        if state == states.RUNNING:
            self.root_id = details.get("flow_uuid")
            self._retries.clear()
            self.publisher.send("flow-started", **fields)
        elif state in self.FINAL_STATES:
            self.publisher.send("flow-finished", **fields)
            # The caller may exit right after run(): get the news out first,
            # and hold no thread or connection until the next run.
            self.publisher.idle()

    def _on_atom(self, state: str, details: Mapping[str, Any]) -> None:
        if state == states.RETRYING:
            # The atom's uuid is the uuid of its requests (a retried atom is
            # requested again under it), so a view can follow it as a request.
            atom_uuid: str | None = details.get("retry_uuid") or details.get("atom_uuid")
            attempt = self._retries[atom_uuid] = self._retries.get(atom_uuid, 0) + 1
            self.publisher.send(
                "task-retried",
                uuid=atom_uuid,
                retry_uuid=atom_uuid,
                name=details.get("retry_name") or details.get("atom_name"),
                root_id=self.root_id,
                attempt=attempt,
                state=state,
            )

    def close(self) -> None:
        """Flush and stop publishing."""
        self.publisher.close()
