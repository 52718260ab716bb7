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


# Extras (secondary parameters, e.g. MR10's angle) by the name records and ranges give them:
# 'motion_blur_angle' -> (MR10, 0).
_EXTRA_BY_ID: dict[str, tuple[Relation, int]] = {
    extra_id: (_relation, k) for _relation in RELATIONS for k, extra_id in enumerate(_relation.extra_ids)
}


def _lookup(name: str, *, extras: bool = False) -> Relation:
    relation = _ALIASES.get(str(name).strip().lower())
    if relation is None:
        known = ', '.join(RELATION_BY_ID)
        groups = ', '.join(RELATION_GROUPS)
        also = f'; their extras: {", ".join(_EXTRA_BY_ID)}' if extras else ''
        raise ParameterError(
            f'unknown relation {name!r}; known relations: {known} (or the groups {groups}){also}'
        )
    return relation


def _target(name: str) -> tuple[Relation, int | None]:
    """The relation a parameter or range name refers to, and which of its extras (None: its own value)."""
    return _EXTRA_BY_ID.get(str(name).strip().lower()) or (_lookup(name, extras=True), None)


def _selected(names: Iterable[str]) -> list[Relation]:
    """The relations named by ids, aliases or group names ('paper', 'underwater', 'optics', 'all')."""
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


def _per_extra(values: Iterable[Iterable], what: str) -> tuple[tuple, ...]:
    """One tuple per relation with one entry per extra of that relation."""
    values = tuple(tuple(v) for v in _per_relation(values, what))
    for relation, entries in zip(RELATIONS, values, strict=True):
        if len(entries) != len(relation.extras):
            raise ParameterError(
                f'{what}: {relation.name} has {len(relation.extras)} extras, got {len(entries)}'
            )
    return values


@dataclass(frozen=True)
class SearchSpace:
    """Which relations the search may activate, and the (possibly narrowed) range of each parameter.

    Every range must lie inside its relation's range (docs/method.md §1, §12). The genotype holds a
    flag and a value for each enabled relation only, then the extras of those relations (MR10's
    angle), so it grows with the relations a search uses; the default enables the paper's six (12
    variables). `extra_low` and `extra_high` hold one tuple per relation, one range per extra; an
    extra not narrowed spans its whole range, a prior (MR12's lamps and range prior) its nominal value.
    """

    enabled: tuple[bool, ...] = tuple(relation.id in DEFAULT_RELATIONS for relation in RELATIONS)
    low: tuple[float, ...] = tuple(relation.low for relation in RELATIONS)
    high: tuple[float, ...] = tuple(relation.high for relation in RELATIONS)
    extra_low: tuple[tuple[float, ...], ...] = tuple(
        tuple(extra.span[0] for extra in relation.extras) for relation in RELATIONS
    )
    extra_high: tuple[tuple[float, ...], ...] = tuple(
        tuple(extra.span[1] for extra in relation.extras) for relation in RELATIONS
    )

    def __post_init__(self) -> None:
        enabled = tuple(bool(flag) for flag in _per_relation(self.enabled, 'enabled'))
        low = _per_relation(self.low, 'low')
        high = _per_relation(self.high, 'high')
        extra_low = _per_extra(self.extra_low, 'extra_low')
        extra_high = _per_extra(self.extra_high, 'extra_high')
        checked_low, checked_high, checked_extras = [], [], []
        for relation, lo, hi, elo, ehi in zip(RELATIONS, low, high, extra_low, extra_high, strict=True):
            lo, hi = _check_range(relation, lo, hi)
            checked_low.append(lo)
            checked_high.append(hi)
            checked_extras.append(
                [_check_range(relation, *pair, k) for k, pair in enumerate(zip(elo, ehi, strict=True))]
            )
        object.__setattr__(self, 'enabled', enabled)
        object.__setattr__(self, 'low', tuple(checked_low))
        object.__setattr__(self, 'high', tuple(checked_high))
        object.__setattr__(self, 'extra_low', tuple(tuple(lo for lo, _ in pairs) for pairs in checked_extras))
        object.__setattr__(
            self, 'extra_high', tuple(tuple(hi for _, hi in pairs) for pairs in checked_extras)
        )

    @classmethod
    def default(cls) -> SearchSpace:
        """The paper's six relations enabled over their full Table 2 ranges."""
        return cls()

    @classmethod
    def from_record(cls, record: Mapping) -> SearchSpace:
        """The space a search stored (`as_record`, the `relations` of its settings): relations past the
        lists' end are off, at their full ranges; extras it does not name span their defaults (a prior
        stored before it existed was at its nominal value, as it is rendered).

        Raises:
            ParameterError: The record does not describe a space.
        """
        try:
            enabled = [bool(v) for v in record['enabled']]
            low = [float(v) for v in record['low']]
            high = [float(v) for v in record['high']]
            extras = dict(record.get('extras') or {})
        except (KeyError, TypeError, ValueError):
            raise ParameterError(f'not a stored search space: {record!r}') from None
        n = len(enabled)
        if not n <= N_RELATIONS or len(low) != n or len(high) != n:
            raise ParameterError(f'not a stored search space: {record!r}')
        extra_low = [[e.span[0] for e in r.extras] for r in RELATIONS]
        extra_high = [[e.span[1] for e in r.extras] for r in RELATIONS]
        for i, relation in enumerate(RELATIONS):
            for k, extra_id in enumerate(relation.extra_ids):
                if extra_id in extras:
                    extra_low[i][k], extra_high[i][k] = (float(v) for v in extras[extra_id])
        return cls(
            tuple(enabled) + (False,) * (N_RELATIONS - n),
            tuple(low) + tuple(r.low for r in RELATIONS[n:]),
            tuple(high) + tuple(r.high for r in RELATIONS[n:]),
            tuple(map(tuple, extra_low)),
            tuple(map(tuple, extra_high)),
        )

    @classmethod
    def from_options(
        cls,
        enabled: Iterable[str] | None = None,
        ranges: Mapping[str, tuple[float, float]] | None = None,
    ) -> SearchSpace:
        """Build a search space from user options.

        Args:
            enabled: relation ids (or parameter names, numbers, 'mr3', or the groups 'paper',
                'underwater', 'optics', 'all') to enable; None enables the paper's six.
            ranges: relation id -> (low, high) narrowing that relation's range, or an extra's id
                ('motion_blur_angle') -> (low, high) narrowing that extra's.

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
        extra_low = [[extra.span[0] for extra in relation.extras] for relation in RELATIONS]
        extra_high = [[extra.span[1] for extra in relation.extras] for relation in RELATIONS]
        for name, bounds in (ranges or {}).items():
            relation, k = _target(name)
            try:
                lo, hi = bounds
            except (TypeError, ValueError):
                what = relation.name if k is None else f'{relation.name} {relation.extras[k].name}'
                raise ParameterError(f'{what} range must be a pair (low, high), got {bounds!r}') from None
            i = relation.number - 1
            if k is None:
                low[i], high[i] = _check_range(relation, lo, hi)
            else:
                extra_low[i][k], extra_high[i][k] = _check_range(relation, lo, hi, k)
        return cls(
            tuple(flags), tuple(low), tuple(high), tuple(map(tuple, extra_low)), tuple(map(tuple, extra_high))
        )

    @property
    def indices(self) -> np.ndarray:
        """Positions in RELATIONS of the enabled relations, in the fixed order."""
        return np.flatnonzero(self.enabled)

    @property
    def n_var(self) -> int:
        """Length of the genotype: a flag and a value per enabled relation, then their extras."""
        return sum(
            2 + len(relation.extras) for relation, on in zip(RELATIONS, self.enabled, strict=True) if on
        )

    def extra_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper bounds of the genotype's tail: the extras of the enabled relations, in order."""
        index = self.indices
        low = [lo for i in index for lo in self.extra_low[i]]
        high = [hi for i in index for hi in self.extra_high[i]]
        return np.array(low, dtype=float), np.array(high, dtype=float)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper bounds (xl, xu) of the genotype: flags in [0, 1], values and extras in range."""
        index = self.indices
        n = 2 * index.size
        xl = np.empty(self.n_var)
        xu = np.empty(self.n_var)
        xl[0:n:2] = 0.0
        xu[0:n:2] = 1.0
        xl[1:n:2] = np.asarray(self.low)[index]
        xu[1:n:2] = np.asarray(self.high)[index]
        xl[n:], xu[n:] = self.extra_bounds()
        return xl, xu

    @property
    def enabled_ids(self) -> tuple[str, ...]:
        """Ids of the enabled relations, in the fixed order."""
        return tuple(relation.id for relation, on in zip(RELATIONS, self.enabled, strict=True) if on)

    def as_record(self) -> dict:
        """The space as stored with a search: enabled flags, low and high, one entry per relation.

        The lists stop after the paper's six unless a later relation is enabled, so a search that
        uses only the paper's relations records what it recorded before there were others. The
        extras' ranges of the enabled relations follow under `extras` (`{'motion_blur_angle':
        [low, high]}`), present only when an enabled relation has extras, so searches of different
        angle ranges have different records and the others' records are unchanged.
        """
        last = max(len(PAPER_RELATIONS), int(self.indices[-1]) + 1)
        record: dict = {
            'enabled': list(self.enabled[:last]),
            'low': list(self.low[:last]),
            'high': list(self.high[:last]),
        }
        extras = {
            extra_id: [lo, hi]
            for i in self.indices
            for extra_id, lo, hi in zip(
                RELATIONS[i].extra_ids, self.extra_low[i], self.extra_high[i], strict=True
            )
        }
        if extras:
            record['extras'] = extras
        return record


def _check_range(
    relation: Relation, low: float, high: float, extra: int | None = None
) -> tuple[float, float]:
    """A range (low, high) checked inside the relation's range, or inside that of its extra number `extra`."""
    bounds = relation if extra is None else relation.extras[extra]
    what = relation.name if extra is None else f'{relation.name} {bounds.name}'
    allowed = f'[{bounds.low:g}, {bounds.high:g}]'
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        raise ParameterError(
            f'{what} range must be numbers inside {allowed}, got ({low!r}, {high!r})'
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ParameterError(f'{what} range ({low!r}, {high!r}) must be low <= high inside {allowed}')
    if extra is None:
        return relation.check_value(lo), relation.check_value(hi)
    return relation.check_extra(extra, lo), relation.check_extra(extra, hi)


@dataclass(frozen=True)
class Composition:
    """A composition of metamorphic relations: which are active and their parameters.

    `extras` holds one tuple per relation with the values of its extras (MR10's angle; `()` for a
    relation without any); left out, every extra is nominal. The value and extras of an inactive
    relation are stored as their nominal values, so two compositions that transform frames alike
    compare equal.
    """

    active: tuple[bool, ...]
    values: tuple[float, ...]
    extras: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        active = tuple(bool(flag) for flag in _per_relation(self.active, 'active'))
        given = self.extras or tuple(relation.nominal_extras for relation in RELATIONS)
        values, extras = [], []
        for relation, on, value, extra in zip(
            RELATIONS, active, _per_relation(self.values, 'values'), _per_extra(given, 'extras'), strict=True
        ):
            values.append(relation.check_value(value) if on else relation.nominal)
            extras.append(relation.check_extras(extra) if on else relation.nominal_extras)
        object.__setattr__(self, 'active', active)
        object.__setattr__(self, 'values', tuple(values))
        object.__setattr__(self, 'extras', tuple(extras))

    @classmethod
    def identity(cls) -> Composition:
        """The empty composition (order 0): the follow-up equals the source."""
        return cls((False,) * N_RELATIONS, tuple(relation.nominal for relation in RELATIONS))

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, float]) -> Composition:
        """Build a composition from relation id (or parameter name) -> value; named relations are active.

        Extras are named by their ids (`motion_blur_angle`, as `parameters` gives them); an extra
        not named is nominal, so a record written before the relation had extras reads as it was.

        Raises:
            ParameterError: on an unknown relation, a relation or extra named twice, an extra whose
                relation is not named, or a value outside its range.
        """
        active = [False] * N_RELATIONS
        values = [relation.nominal for relation in RELATIONS]
        extras = [list(relation.nominal_extras) for relation in RELATIONS]
        named: set[tuple[int, int | None]] = set()
        for name, value in parameters.items():
            relation, k = _target(name)
            index = relation.number - 1
            if (index, k) in named:
                what = relation.name if k is None else relation.extra_ids[k]
                raise ParameterError(f'{what} is given more than once')
            named.add((index, k))
            if k is None:
                active[index] = True
                values[index] = relation.check_value(value)
            else:
                extras[index][k] = relation.check_extra(k, value)
        for index, k in named:
            if k is not None and not active[index]:
                relation = RELATIONS[index]
                raise ParameterError(f'{relation.extra_ids[k]} is given without {relation.id}')
        return cls(tuple(active), tuple(values), tuple(map(tuple, extras)))

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
        """Relation id -> value for the active relations in the fixed order, each followed by its
        extras' ids -> values (`{'motion_blur': 0.006, 'motion_blur_angle': 35.0}`)."""
        out = {}
        for relation, on, value, extras in zip(RELATIONS, self.active, self.values, self.extras, strict=True):
            if on:
                out[relation.id] = value
                out.update(zip(relation.extra_ids, extras, strict=True))
        return out

    @property
    def key(self) -> tuple:
        """A hashable key; compositions with equal keys produce identical follow-up frames."""
        return tuple(
            # + 0.0 folds -0.0 into 0.0
            (relation.number, *(round(v, KEY_DECIMALS) + 0.0 for v in (value, *extras)))
            for relation, on, value, extras in zip(
                RELATIONS, self.active, self.values, self.extras, strict=True
            )
            if on
        )

    def __str__(self) -> str:
        inner = ', '.join(f'{name}={value:.4g}' for name, value in self.parameters.items())
        return f'{self.label} ({inner})' if inner else self.label


def decode(x: np.ndarray, space: SearchSpace | None = None) -> Composition:
    """Decode a genotype into a composition.

    The genotype holds a flag and a value for each relation the space enables, in the fixed order:
    ``x[2*k]`` is the flag of the k-th enabled relation (active when > 0.5), ``x[2*k+1]`` its
    parameter, clipped into the space's range. After the 2n flags and values of n enabled relations
    come the extras of those relations, in the same order (MR10's angle), each clipped into its
    range: appended rather than interleaved so that a space without extras keeps its genotype, and
    the flags and values keep their places. Relations the space does not enable are inactive. With
    the default space that is 12 variables, MR1..MR6.

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
    extras = [relation.nominal_extras for relation in RELATIONS]
    tail = iter(genes[2 * space.indices.size :])
    for k, i in enumerate(space.indices):
        active[i] = bool(genes[2 * k] > FLAG_THRESHOLD)
        values[i] = float(min(max(genes[2 * k + 1], space.low[i]), space.high[i]))
        extras[i] = tuple(
            float(min(max(next(tail), lo), hi))
            for lo, hi in zip(space.extra_low[i], space.extra_high[i], strict=True)
        )
    return Composition(tuple(active), tuple(values), tuple(extras))


def encode(composition: Composition, space: SearchSpace | None = None) -> np.ndarray:
    """The genotype of a composition in a space: flags (1.0 active, 0.0 not), values, then extras.

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
    n = 2 * index.size
    x = np.empty(space.n_var)
    x[0:n:2] = np.asarray(composition.active, dtype=float)[index]
    x[1:n:2] = np.asarray(composition.values)[index]
    x[n:] = [value for i in index for value in composition.extras[i]]
    return x


_DEFAULT_SPACE = SearchSpace()
