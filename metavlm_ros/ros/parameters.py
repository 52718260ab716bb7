"""Declaring node parameters with descriptors and refusing bad run-time changes with a reason."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    ParameterType,
    SetParametersResult,
)
from rclpy.exceptions import (
    InvalidParameterTypeException,
    InvalidParameterValueException,
    ParameterException,
)
from rclpy.node import Node
from rclpy.parameter import Parameter

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.models.options import DTYPES, Option, device_name, distinct_classes
from metavlm_ros.models.registry import BACKENDS, all_options, given_options, options_for

__all__ = [
    'DTYPES',
    'MODEL_PARAMETERS',
    'model_options',
    'Check',
    'ParameterRules',
    'ParameterSpec',
    'descriptor',
    'device_name',
    'distinct_classes',
    'in_range',
    'one_of',
]

# A check returns None when the value is acceptable, else the reason it is not.
Check = Callable[[Any], str | None]

_TYPES = {
    bool: ParameterType.PARAMETER_BOOL,
    int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE,
    str: ParameterType.PARAMETER_STRING,
}


def _type_of(default: Any, array_type: Parameter.Type | None = None) -> int:
    if array_type is not None:
        return int(array_type)
    if isinstance(default, list | tuple):
        if default and all(isinstance(v, str) for v in default):
            return ParameterType.PARAMETER_STRING_ARRAY
        if default and all(isinstance(v, bool) for v in default):
            return ParameterType.PARAMETER_BOOL_ARRAY
        if default and all(isinstance(v, int) and not isinstance(v, bool) for v in default):
            return ParameterType.PARAMETER_INTEGER_ARRAY
        if default and all(isinstance(v, float | int) for v in default):
            return ParameterType.PARAMETER_DOUBLE_ARRAY
        raise ParameterError('list parameters need a non-empty default of one element type, or array_type')
    return _TYPES[type(default)]


def descriptor(
    description: str,
    *,
    type_: int = ParameterType.PARAMETER_NOT_SET,
    read_only: bool = False,
    low: float | None = None,
    high: float | None = None,
    constraints: str = '',
    dynamic_typing: bool = False,
) -> ParameterDescriptor:
    """Build a ParameterDescriptor, with an IntegerRange or FloatingPointRange when bounds are given.

    Args:
        description: what the parameter does, shown by `ros2 param describe` and rqt.
        type_: a rcl_interfaces ParameterType constant.
        read_only: True for parameters fixed at start (rclpy refuses later changes).
        low: inclusive lower bound (needs `high`).
        high: inclusive upper bound (needs `low`).
        constraints: free text for additional_constraints (e.g. the allowed choices).
        dynamic_typing: True for a parameter that takes values of more than one type (its type stays
            PARAMETER_NOT_SET, and the node's own check reads the value).
    """
    desc = ParameterDescriptor(
        description=description,
        type=type_,
        read_only=read_only,
        additional_constraints=constraints,
        dynamic_typing=dynamic_typing,
    )
    if low is not None and high is not None:
        if type_ == ParameterType.PARAMETER_INTEGER:
            desc.integer_range = [IntegerRange(from_value=int(low), to_value=int(high), step=1)]
        elif type_ == ParameterType.PARAMETER_DOUBLE:
            desc.floating_point_range = [
                FloatingPointRange(from_value=float(low), to_value=float(high), step=0.0)
            ]
    return desc


def one_of(*choices: str) -> Check:
    """A check that accepts only the given strings."""

    def check(value: Any) -> str | None:
        return None if value in choices else f'{value!r} is not one of {", ".join(choices)}'

    return check


def in_range(low: float, high: float) -> Check:
    """A check that accepts numbers in [low, high] (also applied to every element of arrays)."""

    def check(value: Any) -> str | None:
        items = value if isinstance(value, Sequence) and not isinstance(value, str) else [value]
        for item in items:
            if not low <= item <= high:
                return f'{item} is outside [{low}, {high}]'
        return None

    return check


@dataclass(frozen=True)
class ParameterSpec:
    """One node parameter: name, default (which fixes its type), meaning and limits."""

    name: str
    default: Any
    description: str
    read_only: bool = False
    low: float | None = None
    high: float | None = None
    choices: Sequence[str] | None = None
    check: Check | None = None
    #: The element type of a list parameter whose default is empty (rclpy would take it for bytes).
    array_type: Parameter.Type | None = None
    #: Takes values of any type (names or numbers, e.g. a range of Jerlov water types): the node
    #: checks them itself; `low`, `high` and `choices` do not apply.
    dynamic_typing: bool = False


def _model_parameter(option: Option) -> ParameterSpec:
    """A backend option as a node parameter: lists and KEY=VALUE mappings are string arrays; an option
    without a default is '' or [] (the backend's own default)."""
    takers = options_for(option.name)
    description = option.help + ('' if len(takers) == len(BACKENDS) else f' [{", ".join(takers)}]')
    if option.type in (list, dict):
        default, array_type = list(option.default or ()), Parameter.Type.STRING_ARRAY
    else:
        default, array_type = ('' if option.default is None else option.default), None
    check = option.check if option.type is not dict else _items(option)
    choices, low, high = option.choices, option.low, option.high
    if option.default is None:  # '' is not set (the backend's own default): no choice, no number
        if choices is not None:
            choices = ('', *choices)
        if low is not None and high is not None:
            checks = [c for c in (in_range(low, high), check) if c is not None]
            check = lambda value, cs=checks: next((r for c in cs if (r := c(value))), None)  # noqa: E731
            low = high = None
    return ParameterSpec(
        option.parameter_name,
        default,
        description,
        read_only=not option.dynamic,
        low=low,
        high=high,
        choices=choices,
        check=(lambda value, c=check: None if value in ('', []) else c(value)) if check else None,
        array_type=array_type,
    )


def _items(option: Option) -> Check:
    def check(value: Any) -> str | None:
        try:
            option.from_items(value)
        except ParameterError as exc:
            return str(exc)
        return None

    return check


#: The model parameters, the same in both nodes (the tester's apply to its inprocess endpoint): the
#: backend, the model and every backend's options, as the backends declare them.
MODEL_PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec('backend', 'clip', 'VLM backend', True, choices=tuple(BACKENDS)),
    ParameterSpec(
        'model',
        'demo',
        "Hugging Face id in the local cache, a directory, 'demo', or a served model's id",
        True,
    ),
    *(_model_parameter(option) for option in all_options().values()),
)


def model_options(values: Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(backend, model, options) from node parameter values: the chosen backend's options, KEY=VALUE
    arrays read as mappings; a value set for an option the backend does not take is refused.

    Raises:
        ParameterError: one line naming the parameter.
    """
    backend = values['backend']
    options: dict[str, Any] = {}
    for name, option in all_options().items():
        value = values.get(option.parameter_name)
        if option.type is dict and value:
            value = option.from_items(value)
        options[name] = value
    try:
        return backend, values['model'], given_options(backend, options)
    except ParameterError as exc:
        raise ParameterError(f'parameter {exc}') from None


class ParameterRules:
    """The parameters of one node: declared with descriptors, checked at start and on every change.

    Typical use in a node constructor::

        rules = ParameterRules(self)
        rules.declare('max_batch', 16, 'most probes per inference', low=1, high=256,
                      on_change=self._set_max_batch)
        rules.declare('confidence', 'cosine', 'confidence type', read_only=True,
                      check=one_of('cosine', 'softmax'))

    A change that fails a check is refused with SetParametersResult(successful=False, reason=...);
    an accepted one is passed to its `on_change` listener.
    """

    def __init__(self, node: Node) -> None:
        """Register the node's on-set-parameters callback."""
        self._node = node
        self._checks: dict[str, list[Check]] = {}
        self._listeners: dict[str, Callable[[Any], None]] = {}
        node.add_on_set_parameters_callback(self._on_set)

    def declare_table(
        self, specs: Sequence[ParameterSpec], on_change: Mapping[str, Callable[[Any], None]] | None = None
    ) -> dict[str, Any]:
        """Declare every parameter of a table; returns name -> start value."""
        listeners = dict(on_change or {})
        return {
            spec.name: self.declare(
                spec.name,
                spec.default,
                spec.description,
                read_only=spec.read_only,
                low=spec.low,
                high=spec.high,
                choices=spec.choices,
                check=spec.check,
                on_change=listeners.get(spec.name),
                array_type=spec.array_type,
                dynamic_typing=spec.dynamic_typing,
            )
            for spec in specs
        }

    def declare(
        self,
        name: str,
        default: Any,
        description: str,
        *,
        read_only: bool = False,
        low: float | None = None,
        high: float | None = None,
        choices: Sequence[str] | None = None,
        check: Check | None = None,
        on_change: Callable[[Any], None] | None = None,
        array_type: Parameter.Type | None = None,
        dynamic_typing: bool = False,
    ) -> Any:
        """Declare a parameter and return its start value, validated.

        An empty list default needs `array_type` (e.g. Parameter.Type.STRING_ARRAY): rclpy would
        otherwise type it as a byte array and refuse every override. A `dynamic_typing` parameter
        takes a value of any type (its `check`, or the node, reads it).

        Raises:
            ParameterError: the start value (default or override) has the wrong type or fails a check.
        """
        type_ = ParameterType.PARAMETER_NOT_SET if dynamic_typing else _type_of(default, array_type)
        checks: list[Check] = []
        constraints = ''
        if choices is not None:
            checks.append(one_of(*choices))
            constraints = 'one of: ' + ', '.join(choices)
        if low is not None and high is not None:
            checks.append(in_range(low, high))
        if check is not None:
            checks.append(check)
        desc = descriptor(
            description,
            type_=type_,
            read_only=read_only,
            low=low,
            high=high,
            constraints=constraints,
            dynamic_typing=dynamic_typing,
        )
        try:
            if array_type is not None and not default:
                # Declared by type only, the parameter takes an override; without one it is set to
                # a typed empty list. Read-only comes last, or the empty list could not be set.
                writable = descriptor(description, type_=type_, constraints=constraints)
                value = self._node.declare_parameter(name, array_type, writable).value
                if value is None:
                    self._node.set_parameters([Parameter(name, array_type, [])])
                    value = []
                if read_only:
                    self._node.set_descriptor(name, desc)
            else:
                value = self._node.declare_parameter(name, default, desc).value
        except (InvalidParameterValueException, InvalidParameterTypeException, ParameterException) as exc:
            raise ParameterError(f'parameter {name}: {_first_line(exc)}') from None
        self._checks[name] = checks
        if on_change is not None:
            self._listeners[name] = on_change
        reason = self._reason(name, value)
        if reason:
            raise ParameterError(f'parameter {name}: {reason}')
        return value

    def value(self, name: str) -> Any:
        """The current value of a declared parameter."""
        return self._node.get_parameter(name).value

    def _reason(self, name: str, value: Any) -> str | None:
        for check in self._checks.get(name, ()):
            reason = check(value)
            if reason:
                return reason
        return None

    def _on_set(self, parameters: list[Parameter]) -> SetParametersResult:
        for parameter in parameters:
            reason = self._reason(parameter.name, parameter.value)
            if reason:
                return SetParametersResult(successful=False, reason=f'{parameter.name}: {reason}')
        for parameter in parameters:
            listener = self._listeners.get(parameter.name)
            if listener is not None:
                listener(parameter.value)
        return SetParametersResult(successful=True)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    if 'Reason: ' in text:  # rclpy wraps the useful part: '... Reason: <why>: <name>'
        text = text.split('Reason: ', 1)[1].rsplit(': ', 1)[0]
    return text.splitlines()[0] if text else type(exc).__name__
