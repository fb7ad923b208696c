"""The shop's tasks. Workers import this module; so does the engine.

A worker runs only the task classes it was given (``--tasks shop.tasks``),
so everything a task needs must be importable where the worker runs.
"""

from flowengine import task


class ReserveSeat(task.Task):
    """Hold a seat for the passenger; release it if a later step fails."""

    default_provides = "seat"

    def execute(self, passenger):
        return f"12A for {passenger}"

    def revert(self, result, **kwargs):
        print(f"released seat {result}")


class ChargeCard(task.Task):
    """Charge the passenger for the seat."""

    default_provides = "receipt"

    def execute(self, passenger, seat):
        return {"passenger": passenger, "seat": seat, "amount": 120}


class SendConfirmation(task.Task):
    """Tell the passenger what was booked and charged."""

    default_provides = "confirmation"

    def execute(self, receipt):
        return f"Confirmed {receipt['seat']}, charged {receipt['amount']} EUR"
