"""Loading and running flows in engines (TaskFlow's ``taskflow.engines`` helpers)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from flowengine.utils import misc, plugins, reflection

if TYPE_CHECKING:
    import flowengine.flow
    import flowengine.task
    from flowengine.engines.base import Engine
    from flowengine.persistence.base import Backend
    from flowengine.persistence.models import FlowDetail, LogBook

#: What an engine runs: a flow, or a single task. (Full names: the API docs
#: link them, and several patterns have a class named Flow.)
FlowLike: TypeAlias = "flowengine.flow.Flow | flowengine.task.BaseTask"

#: A flow factory: a callable returning a flow, or its importable dotted name.
FlowFactory: TypeAlias = "str | Callable[..., Any]"

#: A backend, or what ``persistence.backends.fetch`` makes one from (a URL or
#: a configuration dict); None: nothing is saved.
BackendSpec: TypeAlias = "Backend | str | dict[str, Any] | None"

#: Entry point group engines are looked up in (by engine name).
ENGINES_NAMESPACE = "flowengine.engines"

#: Engine used when none is named.
ENGINE_DEFAULT = "default"

# Built-in engines, looked up before entry points (and so found also when
# those are not installed, e.g. running from a source tree). Paths, not
# classes: the worker-based engine imports kombu, which local engines must
# not pay for.
_BUILTIN_ENGINES = {
    "default": "flowengine.engines.action_engine.engine:SerialActionEngine",
    "serial": "flowengine.engines.action_engine.engine:SerialActionEngine",
    "parallel": "flowengine.engines.action_engine.engine:ParallelActionEngine",
    "worker-based": "flowengine.engines.worker_based.executor_side.engine:WorkerBasedActionEngine",
    "workers": "flowengine.engines.worker_based.executor_side.engine:WorkerBasedActionEngine",
}


def _fetch_engine_cls(kind: str, namespace: str) -> type[Engine]:
    builtin = _BUILTIN_ENGINES if namespace == ENGINES_NAMESPACE else {}
    engine_cls: type[Engine] = plugins.find_class(kind, namespace, builtin, "engine")
    return engine_cls


def _extract_engine(engine: Any, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    """Split 'kind' (maybe a URI like 'parallel://?max_workers=2') from options."""
    # TaskFlow's older spelling: engine_conf='parallel' or {'engine': ..., ...}.
    engine_conf = kwargs.pop("engine_conf", None)
    options: dict[str, Any] = {}
    if engine_conf is not None:
        if isinstance(engine_conf, str):
            engine = engine_conf
        else:
            engine_conf = dict(engine_conf)
            engine = engine_conf.pop("engine", engine)
            options.update(engine_conf)
    kind = engine or ENGINE_DEFAULT
    try:
        uri = misc.parse_uri(kind)
    except (TypeError, ValueError):
        pass
    else:
        kind = uri.scheme
        options = misc.merge_uri(uri, options)
    options.update(kwargs)
    return kind, options


def _fetch_backend(backend: BackendSpec) -> Backend | None:
    if isinstance(backend, (dict, str)):
        from flowengine.persistence import backends

        return backends.fetch(backend)
    return backend


def load(
    flow: FlowLike,
    store: Mapping[str, Any] | None = None,
    flow_detail: FlowDetail | None = None,
    book: LogBook | None = None,
    backend: BackendSpec = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> Engine:
    """Load a flow into an engine, ready to ``run()``.

    ``engine`` names the engine ('serial'/'default', 'parallel',
    'worker-based', or a URI such as 'parallel://?max_workers=4'); the other
    keyword arguments are engine options. ``store`` values are injected into
    storage. Raises NotFound for an unknown engine.
    """
    from flowengine.persistence import helpers as p_utils

    kind, options = _extract_engine(engine, **kwargs)
    backend_obj = _fetch_backend(backend)
    if flow_detail is None:
        flow_detail = p_utils.create_flow_detail(flow, book=book, backend=backend_obj)
    engine_cls = _fetch_engine_cls(kind, namespace)
    engine_obj = engine_cls(flow, flow_detail, backend_obj, options)
    if store:
        engine_obj.storage.inject(store)
    return engine_obj


def run(
    flow: FlowLike,
    store: Mapping[str, Any] | None = None,
    flow_detail: FlowDetail | None = None,
    book: LogBook | None = None,
    backend: BackendSpec = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> dict[str, Any]:
    """Load a flow into an engine, run it, and return every named result."""
    engine_obj = load(
        flow,
        store=store,
        flow_detail=flow_detail,
        book=book,
        backend=backend,
        namespace=namespace,
        engine=engine,
        **kwargs,
    )
    engine_obj.run()
    return engine_obj.storage.fetch_all()


def _fetch_factory(factory_name: str) -> Any:
    try:
        return reflection.import_class(factory_name)
    except (ImportError, ValueError, AttributeError) as e:
        raise ImportError(f"Could not import factory {factory_name!r}: {e}")


def _fetch_validate_factory(flow_factory: FlowFactory) -> tuple[str, Callable[..., Any]]:
    if isinstance(flow_factory, str):
        return flow_factory, _fetch_factory(flow_factory)
    factory_name = reflection.get_callable_name(flow_factory)
    try:
        reimported = _fetch_factory(factory_name)
    except ImportError:
        reimported = None
    if reimported != flow_factory:
        raise ValueError(
            f"Flow factory {flow_factory!r} is not reimportable by name {factory_name}"
        )
    return factory_name, flow_factory


def save_factory_details(
    flow_detail: FlowDetail,
    flow_factory: FlowFactory,
    factory_args: Iterable[Any] | None,
    factory_kwargs: Mapping[str, Any] | None,
    backend: BackendSpec = None,
) -> None:
    """Record the (reimportable) factory and its arguments in the flow detail's meta."""
    factory_name, _ = _fetch_validate_factory(flow_factory)
    factory_data = {
        "factory": {
            "name": factory_name,
            "args": list(factory_args or []),
            "kwargs": dict(factory_kwargs or {}),
        }
    }
    if not flow_detail.meta:
        flow_detail.meta = factory_data
    else:
        flow_detail.meta.update(factory_data)
    backend_obj = _fetch_backend(backend)
    if backend_obj is not None:
        with contextlib.closing(backend_obj.get_connection()) as conn:
            conn.update_flow_details(flow_detail)


def load_from_factory(
    flow_factory: FlowFactory,
    factory_args: Iterable[Any] | None = None,
    factory_kwargs: Mapping[str, Any] | None = None,
    store: Mapping[str, Any] | None = None,
    book: LogBook | None = None,
    backend: BackendSpec = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> Engine:
    """Make a flow with a factory and load it, remembering the factory for resumption."""
    from flowengine.persistence import helpers as p_utils

    _name, factory_fun = _fetch_validate_factory(flow_factory)
    factory_args = list(factory_args or [])
    factory_kwargs = dict(factory_kwargs or {})
    flow = factory_fun(*factory_args, **factory_kwargs)
    backend = _fetch_backend(backend)
    flow_detail = p_utils.create_flow_detail(flow, book=book, backend=backend)
    save_factory_details(flow_detail, flow_factory, factory_args, factory_kwargs, backend=backend)
    return load(
        flow=flow,
        store=store,
        flow_detail=flow_detail,
        book=book,
        backend=backend,
        namespace=namespace,
        engine=engine,
        **kwargs,
    )


def flow_from_detail(flow_detail: FlowDetail) -> FlowLike:
    """Rebuild a flow from the factory recorded in its flow detail."""
    try:
        factory_data = flow_detail.meta["factory"]
    except (KeyError, AttributeError, TypeError):
        raise ValueError(
            f"Cannot reconstruct flow {flow_detail.name} {flow_detail.uuid}:"
            " no factory information saved."
        )
    try:
        factory_fun = _fetch_factory(factory_data["name"])
    except (KeyError, ImportError):
        raise ImportError(
            f"Could not import factory for flow {flow_detail.name} {flow_detail.uuid}"
        )
    flow: FlowLike = factory_fun(*factory_data.get("args", ()), **factory_data.get("kwargs", {}))
    return flow


def load_from_detail(
    flow_detail: FlowDetail,
    store: Mapping[str, Any] | None = None,
    backend: BackendSpec = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> Engine:
    """Rebuild a flow from its detail and load it into an engine (to resume it)."""
    flow = flow_from_detail(flow_detail)
    return load(
        flow,
        flow_detail=flow_detail,
        store=store,
        backend=backend,
        namespace=namespace,
        engine=engine,
        **kwargs,
    )
