"""Retry atoms' histories: their attempts and the failures recorded in each."""

from __future__ import annotations

from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.storage.base import StorageBase
from flowengine.types import failure as ft


class RetryHistoryMixin(StorageBase):
    """Recording failures into a retry's history, clearing it and reading it back."""

    def save_retry_failure(
        self, retry_name: str, failed_atom_name: str, failure: ft.Failure
    ) -> None:
        """Add an atom's failure to the retry's latest history entry."""
        with self._rlock:
            ad = self._typed_detail(retry_name, models.RetryDetail)
            try:
                failures = ad.last_failures
            except exc.NotFound:
                exc.raise_with_cause(
                    exc.StorageFailure,
                    "Unable to fetch most recent retry failures so new"
                    " retry failure can be inserted",
                )
            if failed_atom_name not in failures:
                failures[failed_atom_name] = failure
                self._save_atom(ad)

    def cleanup_retry_history(self, retry_name: str, state: str) -> None:
        """Empty the retry's history and set its state."""
        with self._rlock:
            ad = self._typed_detail(retry_name, models.RetryDetail)
            ad.state = state
            ad.results = []
            self._save_atom(ad)

    def _history(self, ad: models.RetryDetail) -> Any:
        from flowengine import retry

        failure = ad.failure
        if failure is not None:
            cached = self._failures.get(ad.name, {}).get(states.EXECUTE)
            if cached is not None and failure.matches(cached):
                failure = cached
        return retry.History(list(ad.results), failure=failure)

    def get_retry_history(self, retry_name: str) -> Any:
        """The retry's History (its attempts and the failures seen in each)."""
        with self._rlock:
            return self._history(self._typed_detail(retry_name, models.RetryDetail))

    def get_retry_histories(self) -> list[tuple[str, Any]]:
        """``(name, History)`` for every retry."""
        with self._rlock:
            return [
                (ad.name, self._history(ad))
                for ad in self._details.values()
                if isinstance(ad, models.RetryDetail)
            ]
