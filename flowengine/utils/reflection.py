"""Introspection helpers: class and callable names, argument lists, imports."""

from __future__ import annotations

import importlib
import inspect
import weakref
from collections.abc import Callable, Iterator
from typing import Any

# Names of modules whose classes are reported without a module prefix, so
# exception names read 'RuntimeError' (as TaskFlow writes them on the wire).
_BUILTIN_MODULES = frozenset(("builtins", "__builtin__", "exceptions"))


def get_class_name(obj: Any, fully_qualified: bool = True, truncate_builtins: bool = True) -> str:
    """Return the name of a class (or of an object's class), e.g. 'pkg.mod.Class'."""
    cls = obj if isinstance(obj, type) else type(obj)
    module: str | None = getattr(cls, "__module__", None)
    if truncate_builtins and module in _BUILTIN_MODULES:
        return cls.__name__
    if fully_qualified and module:
        return module + "." + cls.__name__
    return cls.__name__


def get_all_class_names(
    obj: Any, up_to: type = object, fully_qualified: bool = True, truncate_builtins: bool = True
) -> Iterator[str]:
    """Yield class names along the MRO of obj's class, stopping at classes not below up_to."""
    cls = obj if isinstance(obj, type) else type(obj)
    for base in cls.__mro__:
        if issubclass(base, up_to):
            yield get_class_name(
                base, fully_qualified=fully_qualified, truncate_builtins=truncate_builtins
            )


def get_callable_name(function: Callable[..., Any]) -> str:
    """Return a dotted name for a function, method or callable object."""
    parts: tuple[str, ...]
    if inspect.ismethod(function):
        owner = function.__self__
        owner_cls = owner if isinstance(owner, type) else type(owner)
        parts = (owner_cls.__module__, owner_cls.__qualname__, function.__name__)
    elif inspect.isfunction(function) or inspect.isbuiltin(function):
        module = getattr(function, "__module__", None)
        qualname = getattr(function, "__qualname__", function.__name__)
        parts = (module, qualname) if module else (qualname,)
    else:
        cls = function if isinstance(function, type) else type(function)
        parts = (cls.__module__, getattr(cls, "__qualname__", cls.__name__))
    return ".".join(p for p in parts if p)


# (name, kind, has_default) per parameter.
_Param = tuple[str, Any, bool]

# Parameter lists of plain functions, keyed weakly by the function object:
# inspect.signature dominates atom construction, and the same execute
# method is inspected for every instance of a task class.
_PARAMS_CACHE: weakref.WeakKeyDictionary[Any, tuple[_Param, ...]] = weakref.WeakKeyDictionary()


def _compute_params(function: Callable[..., Any]) -> tuple[_Param, ...]:
    return tuple(
        (p.name, p.kind, p.default is not p.empty)
        for p in inspect.signature(function).parameters.values()
    )


def _function_params(function: Any) -> tuple[_Param, ...]:
    try:
        return _PARAMS_CACHE[function]
    except KeyError:
        params = _compute_params(function)
        _PARAMS_CACHE[function] = params
        return params
    except TypeError:
        # Not weak-referenceable (or unhashable): no caching.
        return _compute_params(function)


def _params(function: Callable[..., Any]) -> tuple[_Param, ...]:
    if inspect.isfunction(function):
        return _function_params(function)
    if inspect.ismethod(function) and inspect.isfunction(function.__func__):
        params = _function_params(function.__func__)
        # Binding consumes the first positional parameter (self or cls).
        if params and params[0][1] in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            return params[1:]
        return params
    return _compute_params(function)


_VAR_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def get_callable_args(function: Callable[..., Any], required_only: bool = False) -> list[str]:
    """Return the named parameters of a callable (no *args/**kwargs; bound self excluded).

    With required_only, parameters that have a default value are left out.
    """
    return [
        name
        for name, kind, has_default in _params(function)
        if kind not in _VAR_KINDS and not (required_only and has_default)
    ]


#: (named parameters, those without a default, whether it takes **kwargs).
ArgInfo = tuple[tuple[str, ...], tuple[str, ...], bool]

# arg_info() results: plain functions, and functions seen through a bound
# method (their first parameter consumed), weakly keyed by the function.
_INFO_PLAIN: weakref.WeakKeyDictionary[Any, ArgInfo] = weakref.WeakKeyDictionary()
_INFO_BOUND: weakref.WeakKeyDictionary[Any, ArgInfo] = weakref.WeakKeyDictionary()


def _compute_info(function: Callable[..., Any]) -> ArgInfo:
    params = _params(function)
    named = tuple(name for name, kind, _d in params if kind not in _VAR_KINDS)
    required = tuple(
        name for name, kind, has_default in params if kind not in _VAR_KINDS and not has_default
    )
    return named, required, any(kind is inspect.Parameter.VAR_KEYWORD for _n, kind, _d in params)


def arg_info(function: Callable[..., Any]) -> ArgInfo:
    """``(get_callable_args(f), get_callable_args(f, required_only=True), accepts_kwargs(f))``.

    Cached per function: every instance of a task class asks about the same
    ``execute`` and ``revert``, and atom construction is dominated by it.
    """
    func = getattr(function, "__func__", None)
    if func is not None and getattr(function, "__self__", None) is not None:
        cache, key = _INFO_BOUND, func
    else:
        cache, key = _INFO_PLAIN, function
    try:
        return cache[key]
    except KeyError:
        info = cache[key] = _compute_info(function)
        return info
    except TypeError:
        # Not weak-referenceable (or unhashable): no caching.
        return _compute_info(function)


def accepts_kwargs(function: Callable[..., Any]) -> bool:
    """Return whether a callable accepts arbitrary keyword arguments (**kwargs)."""
    return any(kind is inspect.Parameter.VAR_KEYWORD for _n, kind, _d in _params(function))


def is_same_callback(callback1: Any, callback2: Any) -> bool:
    """Return whether two callbacks are the same (bound methods compare by owner and function)."""
    if callback1 is callback2:
        return True
    if inspect.ismethod(callback1) and inspect.ismethod(callback2):
        return callback1.__self__ is callback2.__self__ and callback1.__func__ is callback2.__func__
    try:
        return bool(callback1 == callback2)
    except Exception:
        return False


def is_bound_method(method: Any) -> bool:
    """Return whether method is bound to an instance or class."""
    return inspect.ismethod(method)


def import_class(path: str) -> Any:
    """Import and return the object named 'pkg.mod.Class' or 'pkg.mod:Class'.

    Raises ImportError naming the path when the module or attribute is missing.
    """
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path:
        raise ImportError(
            f"'{path}' does not name a class (expected 'module.Class' or 'module:Class')"
        )
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(
                f"'{path}': module '{module_name}' has no attribute '{attr_path}'"
            ) from None
    return obj
