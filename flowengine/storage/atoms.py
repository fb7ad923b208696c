"""Atom-detail bookkeeping: creating details, states, intentions, metadata, progress."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import models
from flowengine.storage.base import StorageBase
from flowengine.utils import misc

#: Atom metadata keys holding task progress (and its details).
META_PROGRESS = "progress"
META_PROGRESS_DETAILS = "progress_details"


class AtomDetailsMixin(StorageBase):
    """Atom details by name: their creation, state, intention, metadata and progress."""

    @staticmethod
    def _detail_class_for(atom: Any) -> type[models.AtomDetail]:
        from flowengine import retry, task

        if isinstance(atom, retry.Retry):
            return models.RetryDetail
        if isinstance(atom, task.BaseTask):
            return models.TaskDetail
        raise TypeError(f"Unknown atom '{atom}' ({type(atom)}) requested to ensure")

    def ensure_atoms(self, atoms: Iterable[Any]) -> list[str]:
        """Make sure every atom has an atom detail; return their uuids in order.

        Raises TypeError for objects that are not tasks/retries, ValueError
        for an empty name and Duplicate if a detail of another kind has that name.
        """
        with self._rlock:
            uuids: list[str] = []
            created: list[models.AtomDetail] = []
            # The atoms themselves, not (name, save_as) pairs: a tuple holding
            # a dict stays tracked, and at 100,000 atoms those pairs were as
            # many objects for the collector to carry and walk (issue 38).
            seen: list[Any] = []
            # Per atom class, not per atom: the lookup imports two modules.
            detail_classes: dict[type, type[models.AtomDetail]] = {}
            for atom in atoms:
                detail_cls = detail_classes.get(type(atom))
                if detail_cls is None:
                    detail_cls = detail_classes[type(atom)] = self._detail_class_for(atom)
                name = atom.name
                if not name:
                    raise ValueError(f"{type(atom).__name__} name must be non-empty")
                ad = self._details.get(name)
                if ad is None:
                    ad = detail_cls(name, models.generate_uuid())
                    ad.state = states.PENDING
                    ad.version = misc.get_version_string(atom)
                    created.append(ad)
                elif not isinstance(ad, detail_cls):
                    raise exc.Duplicate(
                        f"Atom detail '{name}' already exists in flow"
                        f" detail '{self._flowdetail.name}'"
                    )
                uuids.append(ad.uuid)
                seen.append(atom)
            if created:
                self._save_flow(created)
                for ad in created:
                    self._flowdetail.add(ad)
                    self._details[ad.name] = ad
            for atom in seen:
                self._set_result_mapping(atom.name, getattr(atom, "save_as", None))
            return uuids

    def ensure_atom(self, atom: Any) -> str:
        """Make sure the atom has an atom detail; return its uuid."""
        return self.ensure_atoms([atom])[0]

    def get_atom_uuid(self, atom_name: str) -> str:
        """Uuid of the named atom's detail (NotFound if unknown)."""
        return self._detail(atom_name).uuid

    def set_atom_state(self, atom_name: str, state: str) -> None:
        """Set and persist the atom's state."""
        with self._rlock:
            ad = self._detail(atom_name)
            if ad.state != state:
                ad.state = state
                self._save_atom(ad)

    def get_atom_state(self, atom_name: str) -> str | None:
        """The atom's state (NotFound if unknown)."""
        return self._detail(atom_name).state

    def set_atom_intention(self, atom_name: str, intention: str) -> None:
        """Set and persist the atom's intention."""
        with self._rlock:
            ad = self._detail(atom_name)
            if ad.intention != intention:
                ad.intention = intention
                self._save_atom(ad)

    def get_atom_intention(self, atom_name: str) -> str:
        """The atom's intention (NotFound if unknown)."""
        return self._detail(atom_name).intention

    def get_atoms_states(self, atom_names: Iterable[str]) -> dict[str, tuple[Any, str]]:
        """Map each name to ``(state, intention)``."""
        with self._rlock:
            out = {}
            for name in atom_names:
                ad = self._detail(name)
                out[name] = (ad.state, ad.intention)
            return out

    def reset_atoms(
        self,
        atom_names: Iterable[str],
        state: str = states.PENDING,
        intention: str = states.EXECUTE,
    ) -> None:
        """Set state and intention of many atoms (one write per changed atom)."""
        with self._rlock:
            for name in atom_names:
                ad = self._detail(name)
                if ad.state != state or ad.intention != intention:
                    ad.state = state
                    ad.intention = intention
                    self._save_atom(ad)

    def update_atom_metadata(
        self, atom_name: str, update_with: Mapping[str, Any] | Iterable[Any]
    ) -> None:
        """Merge a dict (or key/value pairs) into the atom's metadata and persist it."""
        with self._rlock:
            ad = self._detail(atom_name)
            update_with = dict(update_with) if update_with else {}
            if update_with:
                ad.meta.update(update_with)
                self._save_atom(ad)

    def set_task_progress(
        self, task_name: str, progress: float, details: Mapping[str, Any] | None = None
    ) -> None:
        """Record a task's progress (0.0-1.0) and optional progress details."""
        with self._rlock:
            ad = self._typed_detail(task_name, models.TaskDetail)
            ad.meta[META_PROGRESS] = progress
            if details is not None:
                # Details remember the progress they were reported at.
                ad.meta[META_PROGRESS_DETAILS] = (
                    {"at_progress": progress, "details": details} if details else None
                )
            self._save_atom(ad)

    def get_task_progress(self, task_name: str) -> float:
        """The task's last recorded progress (0.0 if none)."""
        progress: float = self._typed_detail(task_name, models.TaskDetail).meta.get(
            META_PROGRESS, 0.0
        )
        return progress

    def get_task_progress_details(self, task_name: str) -> dict[str, Any] | None:
        """The task's last progress details (``{'at_progress', 'details'}``) or None."""
        ad = self._typed_detail(task_name, models.TaskDetail)
        details: dict[str, Any] | None = ad.meta.get(META_PROGRESS_DETAILS)
        return details
