"""The genotype of MetaVLM (docs/method.md §2): search space, compositions and decoding."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.relations import (
    DEFAULT_RELATIONS,
    PAPER_RELATIONS,
    RELATION_BY_ID,
    RELATION_GROUPS,
    RELATIONS,
    Relation,
)

__all__ = ['N_RELATIONS', 'N_VAR', 'Composition', 'SearchSpace', 'decode', 'encode']

N_RELATIONS = len(RELATIONS)
# Genes of the default search (the paper's six): a flag and a value per relation.
N_VAR = 2 * len(PAPER_RELATIONS)

# A flag strictly above this value activates its relation.
FLAG_THRESHOLD = 0.5

# Composition keys round parameters to this many decimals so float noise from the optimiser
# (0.1 vs 0.1000000000000001) does not defeat the follow-up cache.
KEY_DECIMALS = 9

# Users may name a relation by its id, its parameter, its number ('3') or 'mr3'.
_ALIASES: dict[str, Relation] = {}
for _relation in RELATIONS:
    for _alias in (_relation.id, _relation.parameter, str(_relation.number), f'mr{_relation.number}'):
        _ALIASES.setdefault(_alias, _relation)


def _lookup(name: str) -> Relation:
    relation = _ALIASES.get(str(name).strip().lower())
    if relation is None:
        known = ', '.join(RELATION_BY_ID)
        groups = ', '.join(RELATION_GROUPS)
        raise ParameterError(f'unknown relation {name!r}; known relations: {known} (or the groups {groups})')
    return relation


def _selected(names: Iterable[str]) -> list[Relation]:
    """The relations named by ids, aliases or group names ('paper', 'underwater', 'all')."""
    chosen = []
    for name in names:
        group = RELATION_GROUPS.get(str(name).strip().lower())
        chosen += [RELATION_BY_ID[rid] for rid in group] if group else [_lookup(name)]
    return chosen


def _per_relation(values: Iterable, what: str) -> tuple:
    values = tuple(values)
    if len(values) != N_RELATIONS:
        raise ParameterError(f'{what} needs {N_RELATIONS} entries, one per relation, got {len(values)}')
    return values


@dataclass(frozen=True)
class SearchSpace:
    """Which relations the search may activate, and the (possibly narrowed) range of each parameter.

    Every range must lie inside its relation's range (docs/method.md §1, §12). The genotype holds a
    flag and a value for each enabled relation only, so it grows with the relations a search uses;
    the default enables the paper's six (12 variables).
    """

    enabled: tuple[bool, ...] = tuple(relation.id in DEFAULT_RELATIONS for relation in RELATIONS)
    low: tuple[float, ...] = tuple(relation.low for relation in RELATIONS)
    high: tuple[float, ...] = tuple(relation.high for relation in RELATIONS)

    def __post_init__(self) -> None:
        enabled = tuple(bool(flag) for flag in _per_relation(self.enabled, 'enabled'))
        low = _per_relation(self.low, 'low')
        high = _per_relation(self.high, 'high')
        checked_low, checked_high = [], []
        for relation, lo, hi in zip(RELATIONS, low, high, strict=True):
            lo, hi = _check_range(relation, lo, hi)
            checked_low.append(lo)
            checked_high.append(hi)
        object.__setattr__(self, 'enabled', enabled)
        object.__setattr__(self, 'low', tuple(checked_low))
        object.__setattr__(self, 'high', tuple(checked_high))

    @classmethod
    def default(cls) -> SearchSpace:
        """The paper's six relations enabled over their full Table 2 ranges."""
        return cls()

    @classmethod
    def from_options(
        cls,
        enabled: Iterable[str] | None = None,
        ranges: Mapping[str, tuple[float, float]] | None = None,
    ) -> SearchSpace:
        """Build a search space from user options.

        Args:
            enabled: relation ids (or parameter names, numbers, 'mr3', or the groups 'paper',
                'underwater', 'all') to enable; None enables the paper's six.
            ranges: relation id -> (low, high) narrowing that relation's range.

        Raises:
            ParameterError: on an unknown relation, an empty selection, or a range outside its relation's.
        """
        if enabled is None:
            enabled = DEFAULT_RELATIONS
        if isinstance(enabled, str):
            enabled = [part for part in enabled.replace(',', ' ').split() if part]
        flags = [False] * N_RELATIONS
        for relation in _selected(enabled):
            flags[relation.number - 1] = True
        if not any(flags):
            raise ParameterError('at least one relation must be enabled')
        low = [relation.low for relation in RELATIONS]
        high = [relation.high for relation in RELATIONS]
        for name, bounds in (ranges or {}).items():
            relation = _lookup(name)
            try:
                lo, hi = bounds
            except (TypeError, ValueError):
                raise ParameterError(
                    f'{relation.name} range must be a pair (low, high), got {bounds!r}'
                ) from None
            low[relation.number - 1], high[relation.number - 1] = _check_range(relation, lo, hi)
        return cls(tuple(flags), tuple(low), tuple(high))

    @property
    def indices(self) -> np.ndarray:
        """Positions in RELATIONS of the enabled relations, in the fixed order."""
        return np.flatnonzero(self.enabled)

    @property
    def n_var(self) -> int:
        """Length of the genotype: a flag and a value per enabled relation."""
        return 2 * int(sum(self.enabled))

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper bounds (xl, xu) of the genotype: flags in [0, 1], values in their ranges."""
        index = self.indices
        xl = np.empty(self.n_var)
        xu = np.empty(self.n_var)
        xl[0::2] = 0.0
        xu[0::2] = 1.0
        xl[1::2] = np.asarray(self.low)[index]
        xu[1::2] = np.asarray(self.high)[index]
        return xl, xu

    @property
    def enabled_ids(self) -> tuple[str, ...]:
        """Ids of the enabled relations, in the fixed order."""
        return tuple(relation.id for relation, on in zip(RELATIONS, self.enabled, strict=True) if on)

    def as_record(self) -> dict[str, list]:
        """The space as stored with a search: enabled flags, low and high, one entry per relation.

        The lists stop after the paper's six unless a later relation is enabled, so a search that
        uses only the paper's relations records what it recorded before there were others.
        """
        last = max(len(PAPER_RELATIONS), int(self.indices[-1]) + 1)
        return {
            'enabled': list(self.enabled[:last]),
            'low': list(self.low[:last]),
            'high': list(self.high[:last]),
        }


def _check_range(relation: Relation, low: float, high: float) -> tuple[float, float]:
    allowed = f'[{relation.low:g}, {relation.high:g}]'
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        raise ParameterError(
            f'{relation.name} range must be numbers inside {allowed}, got ({low!r}, {high!r})'
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ParameterError(
            f'{relation.name} range ({low!r}, {high!r}) must be low <= high inside {allowed}'
        )
    return relation.check_value(lo), relation.check_value(hi)


@dataclass(frozen=True)
class Composition:
    """A composition of metamorphic relations: which are active and their parameters.

    The value of an inactive relation is stored as its nominal value, so two compositions that
    transform frames alike compare equal.
    """

    active: tuple[bool, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        active = tuple(bool(flag) for flag in _per_relation(self.active, 'active'))
        values = []
        for relation, on, value in zip(RELATIONS, active, _per_relation(self.values, 'values'), strict=True):
            values.append(relation.check_value(value) if on else relation.nominal)
        object.__setattr__(self, 'active', active)
        object.__setattr__(self, 'values', tuple(values))

    @classmethod
    def identity(cls) -> Composition:
        """The empty composition (order 0): the follow-up equals the source."""
        return cls((False,) * N_RELATIONS, tuple(relation.nominal for relation in RELATIONS))

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, float]) -> Composition:
        """Build a composition from relation id (or parameter name) -> value; named relations are active.

        Raises:
            ParameterError: on an unknown relation, a relation named twice, or a value outside its range.
        """
        active = [False] * N_RELATIONS
        values = [relation.nominal for relation in RELATIONS]
        for name, value in parameters.items():
            relation = _lookup(name)
            index = relation.number - 1
            if active[index]:
                raise ParameterError(f'{relation.name} is given more than once')
            active[index] = True
            values[index] = relation.check_value(value)
        return cls(tuple(active), tuple(values))

    @property
    def order(self) -> int:
        """Number of active relations, 0..6 for the paper's six (one more per further relation)."""
        return sum(self.active)

    @property
    def label(self) -> str:
        """The paper's label: 1-based numbers of the active relations, e.g. '{2,3}'; '{}' for identity."""
        numbers = (str(relation.number) for relation, on in zip(RELATIONS, self.active, strict=True) if on)
        return '{' + ','.join(numbers) + '}'

    @property
    def parameters(self) -> dict[str, float]:
        """Relation id -> value, for the active relations in the fixed order."""
        return {
            relation.id: value
            for relation, on, value in zip(RELATIONS, self.active, self.values, strict=True)
            if on
        }

    @property
    def key(self) -> tuple:
        """A hashable key; compositions with equal keys produce identical follow-up frames."""
        return tuple(
            (relation.number, round(value, KEY_DECIMALS) + 0.0)  # + 0.0 folds -0.0 into 0.0
            for relation, on, value in zip(RELATIONS, self.active, self.values, strict=True)
            if on
        )

    def __str__(self) -> str:
        inner = ', '.join(f'{name}={value:.4g}' for name, value in self.parameters.items())
        return f'{self.label} ({inner})' if inner else self.label


def decode(x: np.ndarray, space: SearchSpace | None = None) -> Composition:
    """Decode a genotype into a composition.

    The genotype holds a flag and a value for each relation the space enables, in the fixed order:
    ``x[2*k]`` is the flag of the k-th enabled relation (active when > 0.5), ``x[2*k+1]`` its
    parameter, clipped into the space's range. Relations the space does not enable are inactive.
    With the default space that is 12 variables, MR1..MR6.

    Raises:
        ParameterError: when x does not hold space.n_var finite numbers.
    """
    space = space or _DEFAULT_SPACE
    n_var = space.n_var
    try:
        genes = np.asarray(x, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ParameterError(f'a genotype must be {n_var} numbers') from None
    if genes.shape != (n_var,):
        raise ParameterError(f'a genotype must have {n_var} variables, got {genes.size}')
    if not np.all(np.isfinite(genes)):
        raise ParameterError('a genotype must hold finite numbers only')
    active = [False] * N_RELATIONS
    values = [relation.nominal for relation in RELATIONS]
    for k, i in enumerate(space.indices):
        active[i] = bool(genes[2 * k] > FLAG_THRESHOLD)
        values[i] = float(min(max(genes[2 * k + 1], space.low[i]), space.high[i]))
    return Composition(tuple(active), tuple(values))


def encode(composition: Composition, space: SearchSpace | None = None) -> np.ndarray:
    """The genotype of a composition in a space: flags 1.0 for active relations, 0.0 otherwise, and values.

    Raises:
        ParameterError: when the composition activates a relation the space does not enable.
    """
    space = space or _DEFAULT_SPACE
    outside = [
        relation.name
        for relation, on, enabled in zip(RELATIONS, composition.active, space.enabled, strict=True)
        if on and not enabled
    ]
    if outside:
        raise ParameterError(f'the search space does not enable {", ".join(outside)}')
    index = space.indices
    x = np.empty(space.n_var)
    x[0::2] = np.asarray(composition.active, dtype=float)[index]
    x[1::2] = np.asarray(composition.values)[index]
    return x


_DEFAULT_SPACE = SearchSpace()
