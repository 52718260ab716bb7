"""A relation's extras: secondary parameters searched with it but no part of f_trans (docs/method.md §12)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metavlm_ros.common.errors import ParameterError

__all__ = ['Extra']


@dataclass(frozen=True)
class Extra:
    """A secondary parameter of a relation, searched with it but no part of f_trans (docs/method.md §12).

    E.g. the direction of MR10's motion blur: a direction has no magnitude, and at the relation's
    nominal value (length 0) every direction is the identity. A `prior` is a stated property of the
    footage rather than a condition to explore (MR12's range prior and lamps, docs/underwater.md): a
    search holds it at its nominal value unless the user gives it a range. `parse` reads a value given
    by name ('5C' -> 7.0) and `label` names one (7.0 -> '5C'); `step` spaces the named values (every
    whole water index is a Jerlov type), which are the points an envelope is measured at. A `discrete`
    extra takes the named values only (insertion's class): a value between them is the nearest.
    """

    name: str
    unit: str
    nominal: float
    low: float
    high: float
    prior: bool = False
    parse: Callable[[Any], float] | None = field(default=None, compare=False, repr=False)
    label: Callable[[float], str] | None = field(default=None, compare=False, repr=False)
    step: float | None = None
    discrete: bool = False

    @property
    def span(self) -> tuple[float, float]:
        """The range a search spans when the user gives none: the whole range, a prior's nominal value."""
        return (self.nominal, self.nominal) if self.prior else (self.low, self.high)

    def read(self, value: Any) -> float:
        """A value given as a number or, where the extra names its values, a name ('II' -> 3.0).

        Raises:
            ParameterError: for a name the extra does not know, or a value that is no number.
        """
        if isinstance(value, str) and self.parse is not None:
            return float(self.parse(value))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ParameterError(f'must be a number, got {value!r}')
        return float(value)

    def snap(self, value: float) -> float:
        """A checked value as the extra takes it: the nearest whole step for a discrete extra, else itself."""
        if self.discrete and self.step:
            return float(round(value / self.step) * self.step)
        return value

    def text(self, value: float) -> str:
        """A value as users read it: its name where the extra names its values ('5C'), else the number."""
        return self.label(value) if self.label is not None else f'{value:g}'

    def points(self, low: float, high: float) -> tuple[float, ...]:
        """The values an envelope is measured at inside [low, high]: both ends and the named values
        between them (every Jerlov type from II to 5C); one point when low equals high."""
        inside = []
        if self.step:
            k = math.floor(low / self.step) + 1
            while k * self.step < high:
                inside.append(k * self.step)
                k += 1
        return tuple(sorted({low, high, *inside}))
