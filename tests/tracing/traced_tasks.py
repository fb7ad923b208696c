"""Tasks of the tracing tests: a charge that sees a secret, a shipment that fails."""

from __future__ import annotations

from flowengine import task

#: What the Charge task is given: it must appear in no span.
SECRET_CARD = "4111-1111-SECRET-0042"

#: Message of the Ship task's failure.
NO_TRUCK = "no truck available"


class Charge(task.Task):
    """Charges a card (a secret argument); its revert refunds."""

    default_provides = "receipt"

    def execute(self, card_number: str) -> str:
        return f"receipt for ...{card_number[-4:]}"

    def revert(self, card_number: str, **kwargs: object) -> None:
        pass


class Ship(task.Task):
    """Always fails: the flow reverts."""

    def execute(self, receipt: str) -> None:
        raise RuntimeError(NO_TRUCK)


class Pack(task.Task):
    """Succeeds."""

    def execute(self) -> str:
        return "packed"
