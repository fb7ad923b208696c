"""Atom: the unit a flow is made of (tasks and retry controllers derive from it).

An atom declares what it needs and produces. From the signature of its
``execute`` (and ``revert``) method plus the ``requires``/``rebind``/``inject``
arguments it derives, once at construction:

* ``rebind``: execute argument name -> symbol fetched from storage,
* ``requires`` / ``optional``: the symbols it needs / may use if present,
* ``save_as``: symbol -> where to find it in the result (``provides``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from flowengine.types.sets import OrderedSet
from flowengine.utils import misc, reflection

#: Revert arguments supplied by the engine itself, never fetched from storage.
REVERT_RESULT = "result"
REVERT_FLOW_FAILURES = "flow_failures"
_ENGINE_REVERT_ARGS = (REVERT_RESULT, REVERT_FLOW_FAILURES)


def _save_as_to_mapping(provides: Any) -> dict[Any, Any]:
    """Map each provided symbol to where it lives in the result.

    A string names the whole result (index None); a list/tuple names the
    result's items by position; a set names a dict result's keys.
    """
    if provides is None:
        return {}
    if isinstance(provides, str):
        return {provides: None}
    if isinstance(provides, Sequence):
        return {symbol: index for index, symbol in enumerate(provides)}
    if isinstance(provides, AbstractSet):
        return {symbol: symbol for symbol in provides}
    raise TypeError(f"Atom provides parameter should be str, set or tuple/list, not {provides!r}")


def _rebind_to_dict(required_args: list[str], rebind: Any) -> dict[str, Any]:
    if rebind is None:
        return {}
    if isinstance(rebind, (list, tuple)):
        # Positional: the i-th symbol feeds the i-th required argument; any
        # extra symbols are passed under their own name (to **kwargs).
        mapping = dict(zip(required_args, rebind))
        mapping.update((s, s) for s in rebind[len(required_args) :])
        return mapping
    if isinstance(rebind, Mapping):
        return dict(rebind)
    raise TypeError(f"Invalid rebind value '{rebind}' ({type(rebind)})")


def build_arg_mapping(
    atom_name: str,
    requires: Any,
    rebind: Any,
    function: Callable[..., Any],
    auto_extract: bool,
    ignore_list: Iterable[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (required, optional) dicts of argument name -> symbol for function.

    Raises ValueError naming the atom when rebind/requires name arguments the
    function cannot take, or leave required arguments unmapped.
    """
    ignored = set(ignore_list)
    all_args, required_names, takes_kwargs = reflection.arg_info(function)
    required_args = (
        [a for a in required_names if a not in ignored] if ignored else list(required_names)
    )
    required: dict[str, Any] = {}
    if auto_extract:
        required.update((a, a) for a in required_args)
    if requires:
        if isinstance(requires, str):
            required[requires] = requires
        else:
            required.update((s, s) for s in requires)
    required.update(_rebind_to_dict(required_args, rebind))
    optional: dict[str, Any] = {}
    if auto_extract:
        optional = {a: a for a in all_args if a not in required and a not in ignored}
    if not takes_kwargs:
        known = set(all_args)
        extra = [a for a in required if a not in known]
        if extra:
            raise ValueError(f"Extra arguments given to atom {atom_name}: {extra}")
    missing = [a for a in required_args if a not in required]
    if missing:
        raise ValueError(f"Missing arguments for atom {atom_name}: {missing}")
    return required, optional


_Mapping = tuple[dict[str, Any], OrderedSet[str], OrderedSet[str]]


def _same_or(first: _Mapping, second: _Mapping) -> _Mapping:
    """``first`` when ``second`` holds the same mapping and symbols (in order), else ``second``.

    An atom's revert usually takes what its execute takes; sharing the
    (never changed) mapping and sets halves what every atom holds.
    """
    if (
        first[0] == second[0]
        and tuple(first[1]) == tuple(second[1])
        and tuple(first[2]) == tuple(second[2])
    ):
        return first
    return second


def _revert_takes_what_execute_takes(
    execute: Callable[..., Any], revert: Callable[..., Any]
) -> bool:
    """Whether revert's mapping is bound to equal execute's, given the same requires/rebind.

    True when revert's parameters, less the engine's own revert arguments,
    are execute's and execute takes none of those: build_arg_mapping then
    sees the same arguments for both. Deciding so from the (cached)
    signatures saves building and comparing a second mapping per atom.
    """
    named, required, kwargs = reflection.arg_info(execute)
    revert_named, revert_required, revert_kwargs = reflection.arg_info(revert)
    if kwargs != revert_kwargs or any(a in _ENGINE_REVERT_ARGS for a in named):
        return False
    if revert_named != named:
        revert_named = tuple(a for a in revert_named if a not in _ENGINE_REVERT_ARGS)
        revert_required = tuple(a for a in revert_required if a not in _ENGINE_REVERT_ARGS)
    return revert_named == named and revert_required == required


#: Most distinct argument mappings remembered (see Atom._build_arg_mapping);
#: past it the memory starts afresh. Programs have a handful of task classes,
#: so this is only reached by those that make classes on the fly.
MAPPING_CACHE_MAX = 1024

_Mapped = tuple[dict[str, Any], OrderedSet[str], OrderedSet[str]]
_MAPPINGS: dict[tuple[Any, ...], _Mapped] = {}


def _mapping_key(
    executor: Callable[..., Any],
    requires: Any,
    rebind: Any,
    auto_extract: bool,
    ignore_list: Iterable[str] | None,
    inject: Mapping[str, Any] | None,
) -> tuple[Any, ...] | None:
    """The key of an atom mapped by its function's signature alone; None for any other.

    Only atoms given no ``requires``, ``rebind`` or ``inject`` are
    remembered: those are the many alike (one class, made again and again),
    while atoms given their own symbols are usually each different.
    """
    if requires is not None or rebind is not None or inject:
        return None
    function = getattr(executor, "__func__", None)
    bound = function is not None and getattr(executor, "__self__", None) is not None
    key = (
        function if bound else executor,
        bound,
        auto_extract,
        tuple(ignore_list) if ignore_list else (),
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


class Atom(metaclass=abc.ABCMeta):
    """A named unit of work with declared inputs and outputs."""

    #: Among atoms ready at the same time, higher priorities are started first.
    priority: int = 0

    #: What the atom provides when the ``provides`` argument is not given.
    default_provides: Any = None

    def __init__(
        self,
        name: str | None = None,
        provides: Any = None,
        requires: Any = None,
        auto_extract: bool = True,
        rebind: Any = None,
        inject: Mapping[str, Any] | None = None,
        ignore_list: Iterable[str] | None = None,
        revert_rebind: Any = None,
        revert_requires: Any = None,
    ) -> None:
        if provides is None:
            provides = self.default_provides
        # Tasks default to their class name (BaseTask); a retry stays unnamed
        # until its flow names it '<flow>_retry', as TaskFlow does.
        self.name = name
        self.version: tuple[int, ...] = (1, 0)
        self.inject = inject
        self.save_as = _save_as_to_mapping(provides)
        # The set of symbols is the mapping's keys: share its dict (neither
        # is changed after construction).
        self.provides = OrderedSet.over_keys(self.save_as)
        ignore = list(ignore_list or ())
        executing = self._build_arg_mapping(
            self.execute,
            requires=requires,
            rebind=rebind,
            auto_extract=auto_extract,
            ignore_list=ignore,
        )
        self.rebind, exec_requires, self.optional = executing
        # The engine passes 'result' and 'flow_failures' to revert itself.
        if (
            not revert_requires
            and not revert_rebind
            and _revert_takes_what_execute_takes(self.execute, self.revert)
        ):
            reverting = executing
        else:
            reverting = _same_or(
                executing,
                self._build_arg_mapping(
                    self.revert,
                    requires=revert_requires or requires,
                    rebind=revert_rebind or rebind,
                    auto_extract=auto_extract,
                    ignore_list=ignore + list(_ENGINE_REVERT_ARGS),
                ),
            )
        self.revert_rebind, self.revert_requires, self.revert_optional = reverting
        #: Symbols needed to execute or revert (TaskFlow's union of both).
        self.requires = (
            exec_requires if reverting is executing else exec_requires.union(self.revert_requires)
        )

    def _build_arg_mapping(
        self,
        executor: Callable[..., Any],
        requires: Any = None,
        rebind: Any = None,
        auto_extract: bool = True,
        ignore_list: Iterable[str] | None = None,
    ) -> tuple[dict[str, Any], OrderedSet[str], OrderedSet[str]]:
        """Return (arg name -> symbol, required symbols, optional symbols) for executor.

        The same function with the same arguments always maps the same way:
        every atom of a class built alike (a flow of many, a worker's task
        made for each request) reuses the first one's mapping (a copy of
        its dict; its symbol sets, which nothing changes, shared).
        """
        key = _mapping_key(executor, requires, rebind, auto_extract, ignore_list, self.inject)
        if key is not None:
            known = _MAPPINGS.get(key)
            if known is not None:
                return dict(known[0]), known[1], known[2]
        built = self._map_arguments(executor, requires, rebind, auto_extract, ignore_list)
        if key is None:
            return built
        if len(_MAPPINGS) >= MAPPING_CACHE_MAX:
            _MAPPINGS.clear()
        # The cache keeps the dict it was built with (the required symbols
        # may be a view of its keys) and every atom gets a copy of it.
        _MAPPINGS[key] = built
        return dict(built[0]), built[1], built[2]

    def _map_arguments(
        self,
        executor: Callable[..., Any],
        requires: Any,
        rebind: Any,
        auto_extract: bool,
        ignore_list: Iterable[str] | None,
    ) -> tuple[dict[str, Any], OrderedSet[str], OrderedSet[str]]:
        """_build_arg_mapping's work, done once per distinct key."""
        owner = self.name or reflection.get_class_name(self)
        required, optional = build_arg_mapping(
            owner, requires, rebind, executor, auto_extract, ignore_list or ()
        )
        if not required:
            needed: OrderedSet[str] = OrderedSet.EMPTY
        elif not optional and all(arg == symbol for arg, symbol in required.items()):
            # The usual atom fetches each argument under its own name: its
            # required symbols are the mapping's keys, so share its dict
            # (neither changes after construction) instead of a copy per atom.
            needed = OrderedSet.over_keys(required)
        else:
            needed = OrderedSet(required.values())
        # ``required`` is ours (build_arg_mapping made it): it becomes the
        # whole mapping, optional arguments added where not required.
        mapping: dict[str, Any] = required
        for arg, symbol in optional.items():
            mapping.setdefault(arg, symbol)
        maybe = OrderedSet(optional.values()) if optional else OrderedSet.EMPTY
        if self.inject:
            # Injected values satisfy an argument whether keyed by the
            # argument's name or by the symbol it is bound to.
            injected = set(self.inject)
            injected.update(mapping[a] for a in self.inject if a in mapping)
            needed = needed.difference(injected)
            maybe = maybe.difference(injected)
        return mapping, needed, maybe

    def pre_execute(self) -> None:  # noqa: B027 (optional hook)
        """Hook run just before execute."""

    @abc.abstractmethod
    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Do the work; the result is saved under the symbols in ``provides``."""

    def post_execute(self) -> None:  # noqa: B027 (optional hook)
        """Hook run just after execute (whether it succeeded or not)."""

    def pre_revert(self) -> None:  # noqa: B027 (optional hook)
        """Hook run just before revert."""

    def revert(self, *args: Any, **kwargs: Any) -> Any:  # noqa: B027 (optional)
        """Undo execute; kwargs 'result' and 'flow_failures' come from the engine."""

    def post_revert(self) -> None:  # noqa: B027 (optional hook)
        """Hook run just after revert."""

    def __str__(self) -> str:
        # Quoted, as TaskFlow 6.5 prints atoms (code may compare the text).
        return f'"{self.name}=={misc.get_version_string(self)}"'

    def __repr__(self) -> str:
        return f"<{reflection.get_class_name(self)} {self}>"
