"""The VLM backend registry: name -> backend class, and everything derived from the backends' options."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping
from typing import Any

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.models.options import Backend, Option

__all__ = [
    'BACKENDS',
    'all_options',
    'backend_class',
    'given_options',
    'options_for',
    'register',
    'resolve_options',
]


class _Registry(Mapping[str, type[Backend]]):
    """Name -> backend class, filled by `register` as the modules of metavlm_ros/models/backends/ are
    imported, which happens the first time anyone reads it (a backend module imports this one, so the
    backends cannot be imported when it is)."""

    def __init__(self) -> None:
        self.classes: dict[str, type[Backend]] = {}
        self._loaded = False

    def _all(self) -> dict[str, type[Backend]]:
        if not self._loaded:
            self._loaded = True
            from metavlm_ros.models import backends

            for module in pkgutil.iter_modules(backends.__path__):
                importlib.import_module(f'{backends.__name__}.{module.name}')
            # Whichever backend module was imported first, the order is the modules' (by name), then
            # each module's own: help texts and messages list the backends the same way everywhere.
            order = list(self.classes)
            ranked = sorted(self.classes.items(), key=lambda item: (item[1].__module__, order.index(item[0])))
            self.classes = dict(ranked)
        return self.classes

    def __getitem__(self, name: str) -> type[Backend]:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: The registry, in the order help texts list the backends: a new backend is one module in
#: metavlm_ros/models/backends/ whose class is decorated with `register` (docs/architecture.md).
BACKENDS = _Registry()


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: add a backend to BACKENDS, checking its declarations against the others'."""
    if not cls.name or not cls.kinds or cls.name in BACKENDS.classes:
        raise TypeError(f'backend {cls.__name__}: needs a new name and its kinds')
    known = {option.name: option for backend in BACKENDS.classes.values() for option in backend.all_options()}
    for option in cls.all_options():
        if option.default is not None and not isinstance(
            option.default, tuple if option.type is list else option.type
        ):
            raise TypeError(
                f'backend {cls.name}: option {option.name}: default of another type (lists: a tuple)'
            )
        other = known.get(option.name)
        # Two backends may share an option only as one declaration: it is one flag and one parameter.
        if other is not None and other != option:
            raise TypeError(f"backend {cls.name}: option {option.name} differs from another backend's")
    BACKENDS.classes[cls.name] = cls
    return cls


def backend_class(name: str) -> type[Backend]:
    """The class registered as `name`; ModelError naming the valid ones otherwise."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ModelError(f'unknown backend {name!r}; valid backends: {", ".join(BACKENDS)}') from None


def all_options() -> dict[str, Option]:
    """Every option of every backend, once each, in declaration order."""
    options: dict[str, Option] = {}
    for cls in BACKENDS.values():
        for option in cls.all_options():
            options.setdefault(option.name, option)
    return options


def options_for(option: str) -> list[str]:
    """The backends that take an option."""
    return [name for name, cls in BACKENDS.items() if any(o.name == option for o in cls.all_options())]


def resolve_options(backend: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """A backend's options: validated, with defaults for those not given.

    Args:
        backend: a registered name.
        given: option name -> value; None (and, from node parameters, '' or []) means not given.

    Returns:
        Every option of the backend -> its value.

    Raises:
        ModelError: unknown backend.
        ParameterError: an option the backend does not take, or a value it refuses (one line).
    """
    cls = backend_class(backend)
    declared = {option.name: option for option in cls.all_options()}
    resolved: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            continue
        option = declared.get(name)
        if option is None:
            takers = options_for(name)
            where = f' (it is an option of {", ".join(takers)})' if takers else ''
            raise ParameterError(f'option {name} does not apply to backend {backend}{where}')
        if option.type is list and not isinstance(value, Mapping):
            value = list(value) if not isinstance(value, str) else value
        reason = option.reason(value)
        if reason:
            raise ParameterError(f'{name}: {reason}')
        resolved[name] = float(value) if option.type is float else value
    for name, option in declared.items():
        if name not in resolved:
            resolved[name] = list(option.default) if isinstance(option.default, tuple) else option.default
    cls.check(resolved)
    return resolved


def given_options(backend: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The options of `backend` among values named by every backend's options (node parameters, argparse).

    A value equal to its option's default (or '' or [] for one without) is 'not given'; a given value of
    an option the backend does not take is refused, so that a setting is never silently ignored.

    Raises:
        ParameterError: a value given for an option `backend` does not take.
    """
    declared = {option.name for option in backend_class(backend).all_options()}
    chosen: dict[str, Any] = {}
    for name, option in all_options().items():
        if name not in values:
            continue
        value = values[name]
        default = list(option.default) if isinstance(option.default, tuple) else option.default
        if isinstance(value, tuple):
            value = list(value)
        unset = value is None or value == default or (default is None and value in ('', [], {}))
        if name in declared:
            chosen[name] = None if unset else value
        elif not unset:
            takers = ', '.join(options_for(name))
            raise ParameterError(f'{name} does not apply to backend {backend} (it is an option of {takers})')
    return chosen
