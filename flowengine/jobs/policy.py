"""Leases, attempts, back-off and retention: every tunable of the jobboards, in one place.

A board reads these from its configuration (the same keys on every
backend, in a conf dict or a board URL's query: ``redis://h:6379?lease_s=5``)
and falls back to the defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_S",
    "LEASE_S",
    "MAX_ATTEMPTS",
    "MIN_LEASE_S",
    "OUTCOME_TTL_S",
    "RENEWALS_PER_LEASE",
    "BoardPolicy",
]

#: How long a claim lives without renewal. A conductor that dies (kill -9,
#: power loss, partition) loses its jobs after at most this long, so it
#: bounds recovery time; the keeper renews every LEASE_S / RENEWALS_PER_LEASE,
#: so it also bounds the pause (GC, swap, SIGSTOP) a live conductor survives
#: without losing its claim. 10 s recovers fast and tolerates two missed
#: renewals of a badly loaded host.
LEASE_S = 10.0
#: Renewals per lease: 3 means two renewals in a row may fail (a server
#: restart, a slow round trip) before the claim is at risk.
RENEWALS_PER_LEASE = 3
#: Shortest lease accepted: below this a single slow round trip loses claims.
MIN_LEASE_S = 0.2
#: Claims a job may get without finishing before it goes to the dead letter:
#: a job that crashed or failed its conductor this often is poison, not unlucky.
MAX_ATTEMPTS = 5
#: Back-off after a failed attempt: BACKOFF_S * 2**(attempt-1), at most
#: BACKOFF_MAX_S. 1 s lets a transient fault (a database failover) pass
#: before the next try; 300 s keeps a broken job from hogging conductors.
BACKOFF_S = 1.0
BACKOFF_MAX_S = 300.0
#: How long a finished job's outcome stays readable (``Job.wait``, ``jobs
#: show``): a week covers a poster that checks back after a weekend.
OUTCOME_TTL_S = 7 * 24 * 3600.0


def _number(conf: dict[str, Any], key: str, default: float, minimum: float) -> float:
    value = conf.get(key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"jobboard option {key!r} must be a number, not {value!r}") from None
    if not number >= minimum:
        raise ValueError(f"jobboard option {key!r} must be at least {minimum}, not {value!r}")
    return number


@dataclass(frozen=True)
class BoardPolicy:
    """The lease, attempt, back-off and retention settings of one board."""

    lease_s: float = LEASE_S
    max_attempts: int = MAX_ATTEMPTS
    backoff_s: float = BACKOFF_S
    backoff_max_s: float = BACKOFF_MAX_S
    outcome_ttl_s: float = OUTCOME_TTL_S

    @classmethod
    def from_conf(cls, conf: dict[str, Any]) -> BoardPolicy:
        """Read ``lease_s``, ``max_attempts``, ``backoff_s``, ``backoff_max_s``,
        ``outcome_ttl_s`` from a board conf; ValueError naming a bad one."""
        attempts = _number(conf, "max_attempts", MAX_ATTEMPTS, 1)
        if attempts != int(attempts):
            raise ValueError(
                f"jobboard option 'max_attempts' must be an integer, not"
                f" {conf.get('max_attempts')!r}"
            )
        return cls(
            lease_s=_number(conf, "lease_s", LEASE_S, MIN_LEASE_S),
            max_attempts=int(attempts),
            backoff_s=_number(conf, "backoff_s", BACKOFF_S, 0.0),
            backoff_max_s=_number(conf, "backoff_max_s", BACKOFF_MAX_S, 0.0),
            outcome_ttl_s=_number(conf, "outcome_ttl_s", OUTCOME_TTL_S, 1.0),
        )

    @property
    def renew_every_s(self) -> float:
        """Seconds between two renewals of the held leases."""
        return self.lease_s / RENEWALS_PER_LEASE

    def backoff_for(self, attempts: int) -> float:
        """Seconds to wait before claiming a job that failed its ``attempts``-th attempt."""
        if attempts < 1 or self.backoff_s <= 0:
            return 0.0
        doubling = 2.0 ** min(attempts - 1, 32)
        return min(self.backoff_s * doubling, self.backoff_max_s)
