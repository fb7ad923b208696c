"""What a board stores about a job, as immutable values: posting, claim, outcome.

A *posting* is what the poster gave (name, details, logbook reference,
priority) and never changes; it travels as JSON (``encode_posting`` /
``decode_posting``), never pickle. A :class:`JobRecord` is a posting plus the
board's view of it at one moment (attempts, current claim). An
:class:`Outcome` is how the job ended.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field, replace
from typing import Any

from flowengine import exceptions as exc

__all__ = [
    "DEAD",
    "FAILED",
    "OUTCOMES",
    "REVERTED",
    "SUCCEEDED",
    "TRASHED",
    "Claim",
    "JobRecord",
    "Outcome",
    "decode_posting",
    "encode_posting",
]

#: Outcomes: the flow ran to SUCCESS; its failure was reverted; the engine
#: failed in a way TaskFlow still consumes; trashed (by hand, or because the
#: job could not even be loaded); dead-lettered after too many attempts.
SUCCEEDED = "succeeded"
REVERTED = "reverted"
FAILED = "failed"
TRASHED = "trashed"
DEAD = "dead"
OUTCOMES = (SUCCEEDED, REVERTED, FAILED, TRASHED, DEAD)

#: Where a job is: listed (claimable or claimed), in the trash, dead-lettered,
#: or consumed (kept as long as its outcome).
LISTED = "listed"
IN_TRASH = "trash"
IN_DEAD_LETTER = "dead"
CONSUMED = "consumed"

_REQUIRED = ("uuid", "name")


def _utcnow() -> datetime.datetime:
    # TaskFlow's jobs carry naive UTC datetimes; keep that for its users.
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def encode_posting(posting: dict[str, Any]) -> str:
    """The JSON text of a posting; JobFailure naming what cannot be encoded."""
    data = dict(posting)
    created = data.get("created_on")
    if isinstance(created, datetime.datetime):
        data["created_on"] = created.isoformat()
    try:
        return json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise exc.JobFailure(f"Job details must be JSON-serialisable: {e}", cause=e) from e


def decode_posting(raw: str | bytes) -> dict[str, Any]:
    """A posting from its JSON text; JobFailure naming what is wrong (raw kept)."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise exc.JobFailure(f"Job posting is not valid JSON ({e}): {raw[:200]!r}") from e
    if not isinstance(data, dict):
        raise exc.JobFailure(f"Job posting must be a JSON object, not {raw[:200]!r}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise exc.JobFailure(f"Job posting lacks {missing}: {raw[:200]!r}")
    return data


def decode_posting_fields(raw: str | bytes, uuid: str, sequence: Any) -> dict[str, Any]:
    """A stored posting, checked to be job ``uuid``'s, with its ``sequence`` filled in."""
    data = decode_posting(raw)
    if data["uuid"] != uuid:
        raise exc.JobFailure(f"Job posting stored under {uuid} is job {data['uuid']}")
    data["sequence"] = int(sequence or 0)
    return data


def new_posting(
    uuid: str, name: str, details: dict[str, Any] | None, book: Any, priority: str
) -> dict[str, Any]:
    """A posting for a job about to be posted (its sequence is set by the store)."""
    from flowengine.jobs import base

    posting = base.format_posting(
        uuid,
        name,
        created_on=_utcnow().isoformat(),
        details=details,
        book=book,
        priority=base.JobPriority.convert(priority),
    )
    posting["sequence"] = 0
    return posting


@dataclass(frozen=True)
class JobRecord:
    """A posting and the board's view of it when it was read.

    ``owner``/``token`` describe the newest claim (``leased`` says whether
    its lease still runs); ``not_before`` is the end of a back-off (epoch
    seconds, server clock); ``where`` is LISTED, IN_TRASH or IN_DEAD_LETTER.
    """

    posting: dict[str, Any]
    attempts: int = 0
    token: int = 0
    owner: str | None = None
    leased: bool = False
    lease_expires_at: float | None = None
    not_before: float | None = None
    where: str = LISTED
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        """The job's uuid."""
        return str(self.posting["uuid"])

    @property
    def sequence(self) -> int:
        """Posting order on its board."""
        return int(self.posting.get("sequence", 0))

    @property
    def priority_rank(self) -> int:
        """0 (VERY_HIGH) .. 4 (VERY_LOW)."""
        from flowengine.jobs import base

        try:
            return base.JobPriority.convert(self.posting.get("priority", "NORMAL")).rank
        except ValueError:
            return base.JobPriority.NORMAL.rank

    def sort_key(self) -> tuple[int, int]:
        """Most urgent first, then oldest first."""
        return (self.priority_rank, self.sequence)

    def with_posting(self, **changes: Any) -> JobRecord:
        """A copy whose posting has ``changes`` applied."""
        return replace(self, posting={**self.posting, **changes})


@dataclass(frozen=True)
class Claim:
    """A granted claim: its fencing token and which attempt it is."""

    uuid: str
    who: str
    token: int
    attempts: int


@dataclass(frozen=True)
class Outcome:
    """How a job ended: one of OUTCOMES, by whom, under which token, when (epoch s)."""

    uuid: str
    outcome: str
    who: str | None = None
    token: int = 0
    attempts: int = 0
    at: float = 0.0
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of this outcome."""
        return {
            "uuid": self.uuid,
            "outcome": self.outcome,
            "who": self.who,
            "token": self.token,
            "attempts": self.attempts,
            "at": self.at,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        """Inverse of to_dict; JobFailure naming an unknown outcome."""
        if data.get("outcome") not in OUTCOMES:
            raise exc.JobFailure(f"Unknown job outcome {data.get('outcome')!r} in {data!r}")
        return cls(
            uuid=str(data["uuid"]),
            outcome=data["outcome"],
            who=data.get("who"),
            token=int(data.get("token") or 0),
            attempts=int(data.get("attempts") or 0),
            at=float(data.get("at") or 0.0),
            reason=data.get("reason"),
        )
