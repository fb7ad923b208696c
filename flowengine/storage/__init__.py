"""Storage: the engine's view of one flow detail (states, results, injected values).

Every change is applied to the in-memory models first and then written to
the backend through one cached connection, one atom detail per write, so a
state change or a saved result costs O(1) whatever the flow's size. Nothing
is deep-copied here; without a backend a ``MemoryBackend`` that does not
deep-copy is used.

Threading: every mutation holds ``lock`` (a re-entrant lock). Reads of one
attribute are lock-free; reads that combine several (``fetch_all``, failure
maps, histories) take the lock so listeners on other threads see a
consistent picture.

Fast path for the engine (see :meth:`Storage.fetch_args`): an argument
plan, a tuple of :class:`ArgSpec`, is built once per atom at compile time
from the compiler's providers (:func:`make_arg_plan`); each call then costs
O(number of arguments).

The names below are the public API; the modules of this package split
:class:`Storage` by concern (``base``: shared state and persistence;
``lookup``: reading outcomes; ``atoms``, ``flow``, ``results``,
``retries``, ``injection``: bookkeeping; ``fetching`` and ``plans``:
argument resolution) and may change.
"""

from flowengine.storage import atoms, base, lookup
from flowengine.storage.core import Storage
from flowengine.storage.plans import ArgSpec, make_arg_plan

# Bound here (not only imported) so the docs, which read ``#:`` comments
# from this module, keep describing them.
#: Atom metadata key holding persistent atom-scoped injected arguments.
META_INJECTED = base.META_INJECTED
#: Atom metadata keys holding task progress (and its details).
META_PROGRESS = atoms.META_PROGRESS
META_PROGRESS_DETAILS = atoms.META_PROGRESS_DETAILS
#: Atom states in which some result may be available.
STATES_WITH_RESULTS = lookup.STATES_WITH_RESULTS

__all__ = [
    "ArgSpec",
    "META_INJECTED",
    "META_PROGRESS",
    "META_PROGRESS_DETAILS",
    "STATES_WITH_RESULTS",
    "Storage",
    "make_arg_plan",
]
