"""What a backend declares: its options (Option), the options every backend takes, and the Backend base."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import CLASSES, VLMBackend

__all__ = [
    'COMMON_OPTIONS',
    'DEFAULT_BATCH_SIZE',
    'DTYPES',
    'MAX_BATCH_SIZE',
    'Backend',
    'Option',
    'device_name',
    'distinct_classes',
]

#: Frames per model call unless told otherwise (--batch-size, both nodes' max_batch, campaign
#: batch_size): a whole generation of the default population in one call.
DEFAULT_BATCH_SIZE = 32
#: The most frames per model call any surface accepts.
MAX_BATCH_SIZE = 256
DTYPES = ('auto', 'float32', 'float16', 'bfloat16')

# A check returns None when the value is acceptable, else the reason it is not.
Check = Callable[[Any], 'str | None']

_DEVICE = re.compile(r'auto|cpu|cuda(:\d+)?')


@dataclass(frozen=True)
class Option:
    """One option of a backend, declared once: argparse, node parameters and campaign keys read it.

    Attributes:
        name: the option's name: create_backend keyword and campaign key (snake_case).
        type: str, int, float, bool, list (of strings) or dict (campaign: a mapping; command line and
            node parameters: repeated KEY=VALUE strings, parsed by `parse_item`).
        default: the value when not given (a tuple for a list); None means 'the backend's own default'.
        help: one line for --help, `ros2 param describe` and docs.
        low, high: inclusive bounds of a number.
        choices: the accepted strings.
        check: a further check of a value; returns the reason it is refused, or None.
        flag: the command-line flag when not --<name with dashes>.
        parameter: the node parameter's name when not `name`.
        dynamic: a node accepts changes while running (read-only otherwise).
        mapping: a list option a campaign file may also give as a mapping class -> value.
        identity: the value is part of a results directory's identity (False for where and how fast
            the model runs: device, batch size; the answers do not depend on them).
    """

    name: str
    type: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    check: Check | None = None
    flag: str | None = None
    parameter: str | None = None
    dynamic: bool = False
    mapping: bool = False
    identity: bool = True

    @property
    def cli_flag(self) -> str:
        return self.flag or '--' + self.name.replace('_', '-')

    @property
    def parameter_name(self) -> str:
        return self.parameter or self.name

    def reason(self, value: Any) -> str | None:
        """Why `value` is refused for this option, or None when it is accepted (None is always accepted)."""
        if value is None:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if self.type is dict:
            if not isinstance(value, Mapping):
                return f'expected a mapping, got {value!r}'
        elif self.type is list:
            if self.mapping and isinstance(value, Mapping):
                if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                    return f'expected a mapping of strings, got {value!r}'
            elif isinstance(value, str) or not isinstance(value, Sequence):
                return f'expected a list of strings, got {value!r}'
            elif not all(isinstance(v, str) for v in value):
                return f'expected a list of strings, got {list(value)!r}'
        elif not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            return f'expected {self.type.__name__}, got {value!r}'
        if self.choices is not None and value not in self.choices:
            return f'{value!r} is not one of {", ".join(self.choices)}'
        if self.low is not None and self.high is not None and not self.low <= value <= self.high:
            return f'{value} is outside [{self.low:g}, {self.high:g}]'
        return self.check(value) if self.check is not None else None

    def parse_item(self, item: str) -> tuple[str, list[str]]:
        """One command-line or parameter item of a dict option: 'KEY=VALUE,VALUE' -> (key, values)."""
        key, _, values = item.partition('=')
        words = [w.strip() for w in values.split(',') if w.strip()]
        if not key.strip() or not words:
            raise ParameterError(
                f'{self.cli_flag} {item!r}: expected {self.name.upper()}=VALUE,VALUE, e.g. trash=bottle,can'
            )
        return key.strip(), words

    def from_items(self, items: Iterable[str]) -> dict[str, list[str]]:
        return dict(self.parse_item(item) for item in items)


def distinct_classes(classes: Any) -> str | None:
    """A check of `classes`: at least one, non-empty, distinct, none named like a message field."""
    names = list(classes)
    if not names:
        return 'at least one class is needed'
    if len(set(names)) != len(names) or not all(names):
        return f'class names must be non-empty and distinct, got {names}'
    reserved = [name for name in names if name in ('kind', 'latency_ms')]
    if reserved:
        return f'{reserved[0]!r} is reserved in prediction messages'
    return None


def device_name(value: Any) -> str | None:
    """A check of `device`: 'auto', 'cpu', 'cuda' or 'cuda:N' (whether CUDA is there shows on loading)."""
    return (
        None
        if _DEVICE.fullmatch(str(value))
        else f"expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}"
    )


#: Options every backend takes.
COMMON_OPTIONS: tuple[Option, ...] = (
    Option('classes', list, CLASSES, 'classes judged, in order', check=distinct_classes),
    Option('device', str, 'auto', "torch device: 'auto' (cuda when present), 'cpu', 'cuda', 'cuda:N'",
           check=device_name, identity=False),
    Option('dtype', str, 'auto', 'torch dtype', choices=DTYPES),
    Option('batch_size', int, DEFAULT_BATCH_SIZE, 'most frames per model call', low=1, high=MAX_BATCH_SIZE,
           parameter='max_batch', dynamic=True, identity=False),
)  # fmt: skip


class Backend(VLMBackend):
    """A registered backend: a VLMBackend that declares its name, prediction kinds and options.

    Subclasses set `name`, `kinds` and `options` (their own, beyond COMMON_OPTIONS), take every option
    as a keyword argument of `__init__` (already validated and defaulted by create_backend), and may
    override `kind_for`, `describe` and `build_tiny`.
    """

    name: ClassVar[str] = ''
    #: Prediction kinds this backend can give ('confidence', 'count').
    kinds: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[Option, ...]] = ()
    #: Whether `model` names weights on this machine (resolve_model) rather than, say, a served model id.
    local_model: ClassVar[bool] = True

    #: The kind this instance gives, for a backend of several kinds (set from its options).
    chosen_kind: str = ''

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.chosen_kind or self.kinds[0]

    @classmethod
    def all_options(cls) -> tuple[Option, ...]:
        return COMMON_OPTIONS + tuple(cls.options)

    @classmethod
    def kind_for(cls, options: Mapping[str, Any]) -> str:
        """The prediction kind the backend gives with these (resolved) options."""
        return cls.kinds[0]

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        """Refuse what the options cannot mean together (ParameterError, one line), before any load."""

    @classmethod
    def describe(cls, model_dir: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
        """What identifies the model beyond its options and weights, read without loading it."""
        return {}

    @classmethod
    def build_tiny(cls, directory: Any, **variant: Any) -> None:
        """Save a tiny random-weight model this backend loads (tests and benchmarks); see models/tiny.py."""
        raise NotImplementedError(f'backend {cls.name!r} has no tiny model builder')
