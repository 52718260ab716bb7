"""Checking the launch files' arguments: a wrong value stops the launch with one line naming it."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = [
    'LaunchArgumentError',
    'flag',
    'one_of',
    'parameter_value',
    'params_file',
    'port_number',
    'positive_number',
    'topic_name',
]


class LaunchArgumentError(ValueError):
    """A launch argument with a wrong value; `ros2 launch` prints its message as one line and exits 1."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f'launch argument {name}: {reason}')


def flag(name: str, value: str) -> bool:
    """A true/false argument (also 1/0, yes/no)."""
    if value.lower() in ('true', '1', 'yes'):
        return True
    if value.lower() in ('false', '0', 'no'):
        return False
    raise LaunchArgumentError(name, f'expected true or false, got {value!r}')


def one_of(name: str, value: str, choices: Sequence[str], *, empty: bool = False) -> str:
    """A value among `choices` ('' too when `empty`: the parameter file's value stays in force)."""
    if value in choices or (empty and value == ''):
        return value
    shown = ', '.join(choices) + (" or '' (the parameter file's)" if empty else '')
    raise LaunchArgumentError(name, f'expected one of {shown}, got {value!r}')


def positive_number(name: str, value: str) -> float:
    """A number > 0."""
    try:
        number = float(value)
    except ValueError:
        number = float('nan')
    if not number > 0:
        raise LaunchArgumentError(name, f'expected a positive number, got {value!r}')
    return number


def port_number(name: str, value: str, *, empty: bool = False) -> str:
    """A TCP port, 0..65535 ('' too when `empty`: the parameter file's value stays in force)."""
    if empty and value == '':
        return value
    if not (value.isdigit() and int(value) <= 65535):
        shown = "0..65535 or '' (the parameter file's)" if empty else '0..65535'
        raise LaunchArgumentError(name, f'expected a port number {shown}, got {value!r}')
    return value


def topic_name(name: str, value: str) -> str:
    """A valid ROS 2 topic name (absolute or relative), as rcl would accept it for a remapping."""
    from rclpy.exceptions import InvalidTopicNameException
    from rclpy.validate_topic_name import validate_topic_name

    try:
        validate_topic_name(value)
    except InvalidTopicNameException as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else 'invalid'
        reason = reason.removeprefix('Invalid topic name: ')
        raise LaunchArgumentError(name, f'{value!r} is not a valid topic name ({reason})') from None
    return value


def params_file(name: str, value: str, nodes: Sequence[str] = ()) -> str:
    """A ROS parameter file that exists and is a YAML mapping (its values are the nodes' to check)."""
    import yaml

    if not os.path.isfile(value):
        raise LaunchArgumentError(name, f'no such file {value!r}')
    try:
        with open(value, encoding='utf-8') as handle:
            data = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LaunchArgumentError(name, f'{value} is not readable YAML ({first})') from None
    if data is None:
        return value
    if not isinstance(data, dict):
        raise LaunchArgumentError(name, f'{value} must map node names to "ros__parameters:" blocks')
    for node in nodes:
        block = data.get(node, data.get('/' + node))
        if block is not None and not (
            isinstance(block, dict) and isinstance(block.get('ros__parameters', {}), dict)
        ):
            raise LaunchArgumentError(
                name, f'{value}: the block of {node} must hold "ros__parameters:" values'
            )
    return value


def parameter_value(name: str, value: str, type_: type) -> object:
    """A launch argument as a node parameter of a backend option's type: text stays text; numbers, booleans
    and lists ('[a, b]', and a dict option's 'KEY=VALUE' items) are read as YAML, as `ros2 run -p` does."""
    import yaml

    if type_ is str:
        return value
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = None
    if type_ is float and isinstance(parsed, int) and not isinstance(parsed, bool):
        parsed = float(parsed)
    wanted = list if type_ in (list, dict) else type_
    if not isinstance(parsed, wanted) or (wanted is int and isinstance(parsed, bool)):
        raise LaunchArgumentError(
            name, f'expected {"a list" if wanted is list else wanted.__name__}, got {value!r}'
        )
    return parsed
