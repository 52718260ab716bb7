"""Metamorphic relations: Table 2's six (docs/method.md §1), underwater and optics (§12), insertion (§13)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import cv2
import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.extra import Extra
from metavlm_ros.method.insertion import INSERTION_EXTRAS, INSERTION_FUNCTIONS, INSERTION_PARAMETERS
from metavlm_ros.method.underwater import UNDERWATER_EXTRAS, UNDERWATER_FUNCTIONS, UNDERWATER_PARAMETERS
from metavlm_ros.method.water_ranges import check_ranges, warp_ranges
from metavlm_ros.method.water_scene import WATER_EXTRAS, WATER_FUNCTIONS, WATER_PARAMETERS, WATER_PHRASES

__all__ = [
    'DEFAULT_RELATIONS',
    'INSERTION_RELATIONS',
    'OPTICS_RELATIONS',
    'PAPER_RELATIONS',
    'RELATIONS',
    'RELATION_BY_ID',
    'RELATION_GROUPS',
    'UNDERWATER_RELATIONS',
    'WARPS',
    'Extra',
    'Relation',
    'apply_composition',
    'apply_relation',
    'composition_matrix',
    'relation_matrix',
]

# Values within this distance of a range bound count as inside it: decoded genotypes and
# configuration files carry float noise that must not turn into a user-facing error.
_RANGE_TOLERANCE = 1e-9

CLAHE_TILES = (16, 16)

# How a composition's geometric relations are resampled (docs/method.md §8): 'fused' composes
# adjacent affine relations into one warp (one interpolation); 'sequential' resamples after every
# relation, as the paper's code does.
WARPS = ('fused', 'sequential')


class Composed(Protocol):
    """What apply_composition reads of a composition (encoding.Composition): flags, values, extras."""

    active: Sequence[bool]
    values: Sequence[float]
    extras: Sequence[Sequence[float]]


def _in_range(what: str, value: float, low: float, high: float) -> float:
    """``value`` as a float clipped into [low, high] when it lies there (within float noise).

    Raises:
        ParameterError: when the value is not a finite number inside [low, high]; ``what`` names it.
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f'{what} must be a number, got {value!r}') from None
    if not math.isfinite(number) or not (low - _RANGE_TOLERANCE <= number <= high + _RANGE_TOLERANCE):
        raise ParameterError(f'{what} {value!r} is outside the allowed range [{low:g}, {high:g}]')
    return min(max(number, low), high)


def _warp(frame: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    height, width = frame.shape[:2]
    return cv2.warpAffine(
        frame,
        matrix,
        (width, height),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=(0, 0, 0),
    )


def _clahe(frame: np.ndarray, clip_limit: float) -> np.ndarray:
    lab = cv2.cvtColor(frame, cv2.COLOR_RGB2LAB)
    clahe = cv2.createCLAHE(clipLimit=float(clip_limit), tileGridSize=CLAHE_TILES)
    # Equalise L in place inside the LAB image rather than splitting and merging channels.
    lab[..., 0] = clahe.apply(np.ascontiguousarray(lab[..., 0]))
    return cv2.cvtColor(lab, cv2.COLOR_LAB2RGB)


def _downsample(frame: np.ndarray, scale: float) -> np.ndarray:
    height, width = frame.shape[:2]
    small = (max(1, int(width * scale)), max(1, int(height * scale)))
    if small == (width, height):
        return frame
    reduced = cv2.resize(frame, small, interpolation=cv2.INTER_NEAREST)
    return cv2.resize(reduced, (width, height), interpolation=cv2.INTER_NEAREST)


# The geometric relations' 2x3 forward affine matrices (source pixel -> follow-up pixel). Pixel
# centres sit at integer coordinates, so the image centre is ((W-1)/2, (H-1)/2); about that centre,
# an affine zoom equals cv2.resize by z followed by a centred crop or black pad.
def _rotation_matrix(angle: float, width: int, height: int) -> np.ndarray:
    # Positive angles turn the content counter-clockwise on screen, as OpenCV defines it.
    return cv2.getRotationMatrix2D(((width - 1) / 2.0, (height - 1) / 2.0), float(angle), 1.0)


def _scaling_matrix(zoom: float, width: int, height: int) -> np.ndarray:
    return cv2.getRotationMatrix2D(((width - 1) / 2.0, (height - 1) / 2.0), 0.0, float(zoom))


def _shear_matrix(shear: float, width: int, height: int) -> np.ndarray:
    # x' = x + k*y with the origin at the top-left corner, as in the paper's code.
    return np.array([[1.0, float(shear), 0.0], [0.0, 1.0, 0.0]])


def _translation_matrix(shift: float, width: int, height: int) -> np.ndarray:
    return np.array([[1.0, 0.0, float(int(width * shift))], [0.0, 1.0, 0.0]])


@dataclass(frozen=True)
class Relation:
    """One metamorphic relation: its parameter, nominal value, range, maximum deviation (f_trans) and
    how it transforms a frame.

    A relation is one entry of RELATIONS (the registry every caller reads). `apply(frame, value)`
    transforms a checked RGB uint8 frame by a checked value. A geometric relation gives `matrix`
    instead, `matrix(value, width, height)` -> its 2x3 forward affine matrix: adjacent geometric
    relations then fuse into one warp (docs/method.md §8). `changes_at_nominal` marks a relation
    whose nominal value still changes a frame (MR3: CLAHE at clip 1). A relation with `extras`
    (secondary parameters, e.g. MR10's angle) receives their values after its own:
    `apply(frame, value, *extras)`. `phrase`, where given, says a region of the relation in its own
    words: `phrase(ranges)`, ranges by id for the relation and each extra ('Jerlov II to 5C, up to 4 m').
    `takes_ranges` marks a relation that uses the frame's range to the scene per pixel, where the
    footage has one: `apply(frame, value, *extras, ranges=map)`.
    """

    number: int
    id: str
    parameter: str
    nominal: float
    low: float
    high: float
    max_deviation: float
    apply: Callable[..., np.ndarray] | None = field(default=None, compare=False, repr=False)
    matrix: Callable[[float, int, int], np.ndarray] | None = field(default=None, compare=False, repr=False)
    changes_at_nominal: bool = False
    extras: tuple[Extra, ...] = ()
    phrase: Callable[[Mapping[str, tuple[float, float]]], str] | None = field(
        default=None, compare=False, repr=False
    )
    #: Whether `apply` reads the frame's range map where the search has one (`ranges=`, MR12).
    takes_ranges: bool = False

    def __post_init__(self) -> None:
        if (self.apply is None) == (self.matrix is None):
            raise ValueError(f'{self.name} needs exactly one of apply and matrix')
        if self.matrix is not None and self.extras:
            raise ValueError(f'{self.name}: a geometric relation fuses by its one value and takes no extras')

    @property
    def extra_ids(self) -> tuple[str, ...]:
        """How records, ranges and parameters name the extras, e.g. 'motion_blur_angle'."""
        return tuple(f'{self.id}_{extra.name}' for extra in self.extras)

    @property
    def nominal_extras(self) -> tuple[float, ...]:
        """The extras' nominal values (those of an inactive relation)."""
        return tuple(extra.nominal for extra in self.extras)

    @property
    def name(self) -> str:
        """The relation as users see it, e.g. 'MR1 rotation'."""
        return f'MR{self.number} {self.id}'

    @property
    def geometric(self) -> bool:
        """Whether the relation is an affine warp (it gives a matrix, and fuses with its neighbours)."""
        return self.matrix is not None

    def check_value(self, value: float) -> float:
        """Return ``value`` as a float when it lies in the relation's range.

        Raises:
            ParameterError: when the value is not a finite number inside [low, high].
        """
        return _in_range(f'{self.name} {self.parameter}', value, self.low, self.high)

    def check_extra(self, k: int, value: float) -> float:
        """Return the value of the k-th extra as a float when it lies in that extra's range.

        Raises:
            ParameterError: when the value is not a finite number inside the extra's range.
        """
        extra = self.extras[k]
        return extra.snap(_in_range(f'{self.name} {extra.name}', value, extra.low, extra.high))

    def check_extras(self, values: Sequence[float]) -> tuple[float, ...]:
        """The extras' values checked, the missing trailing ones at their nominal values.

        Raises:
            ParameterError: on more values than extras, or a value outside its extra's range.
        """
        if len(values) > len(self.extras):
            raise ParameterError(f'{self.name} takes {len(self.extras)} extra values, got {len(values)}')
        return (
            tuple(self.check_extra(k, v) for k, v in enumerate(values)) + self.nominal_extras[len(values) :]
        )

    def is_identity(self, value: float) -> bool:
        """Whether the relation leaves every frame unchanged at ``value``.

        True at the nominal value for every relation except those that change a frame even there
        (MR3: CLAHE at clip 1).
        """
        return not self.changes_at_nominal and value == self.nominal

    def transform(
        self, frame: np.ndarray, value: float, extras: Sequence[float] = (), ranges: np.ndarray | None = None
    ) -> np.ndarray:
        """Apply the relation to a checked frame at checked values (the frame itself at identity);
        `ranges`, the frame's range map, reaches only a relation that takes one."""
        if self.matrix is None:
            if self.takes_ranges and ranges is not None:
                return self.apply(frame, value, *extras, ranges=ranges)
            return self.apply(frame, value, *extras)
        if self.is_identity(value):
            return frame
        height, width = frame.shape[:2]
        return _warp(frame, self.matrix(value, width, height))


PAPER_RELATIONS: tuple[Relation, ...] = (
    Relation(1, 'rotation', 'angle', 0.0, -5.0, 5.0, 5.0, matrix=_rotation_matrix),
    Relation(2, 'scaling', 'zoom', 1.0, 0.7, 1.3, 0.3, matrix=_scaling_matrix),
    Relation(
        3, 'histogram_equalization', 'clip_limit', 1.0, 1.0, 2.0, 1.0, apply=_clahe, changes_at_nominal=True
    ),
    Relation(4, 'downsampling', 'scale', 1.0, 0.9, 1.0, 0.1, apply=_downsample),
    Relation(5, 'shear', 'shear', 0.0, -0.15, 0.15, 0.15, matrix=_shear_matrix),
    Relation(6, 'translation', 'shift', 0.0, -0.03, 0.03, 0.03, matrix=_translation_matrix),
)


def _opt_in(
    parameters: dict[str, tuple[str, str, float, float, float, float]],
    functions: dict[str, Callable[..., np.ndarray]],
    extras: Mapping[str, tuple[tuple[str, str, float, float, float] | Extra, ...]],
    first: int,
    phrases: Mapping[str, Callable[[Mapping[str, tuple[float, float]]], str]] | None = None,
    ranged: Sequence[str] = (),
) -> tuple[Relation, ...]:
    """Relations from a module's parameter table, numbered from `first` in the table's order; extras
    given as (name, unit, nominal, low, high) rows or as `Extra`s; those `ranged` take range maps."""
    return tuple(
        Relation(
            number,
            rid,
            name,
            nominal,
            low,
            high,
            deviation,
            apply=functions[rid],
            extras=tuple(
                extra if isinstance(extra, Extra) else Extra(*extra) for extra in extras.get(rid, ())
            ),
            phrase=(phrases or {}).get(rid),
            takes_ranges=rid in ranged,
        )
        for number, (rid, (name, _, nominal, low, high, deviation)) in enumerate(
            parameters.items(), start=first
        )
    )


# Opt-in relations beyond the paper (docs/method.md §12), numbered after its six: the underwater
# ones, then water as optics describes it (Jerlov's water types, range and depth; docs/underwater.md).
UNDERWATER_RELATIONS: tuple[Relation, ...] = _opt_in(
    UNDERWATER_PARAMETERS, UNDERWATER_FUNCTIONS, UNDERWATER_EXTRAS, len(PAPER_RELATIONS) + 1
)
OPTICS_RELATIONS: tuple[Relation, ...] = _opt_in(
    WATER_PARAMETERS,
    WATER_FUNCTIONS,
    WATER_EXTRAS,
    len(PAPER_RELATIONS) + len(UNDERWATER_RELATIONS) + 1,
    WATER_PHRASES,
    ranged=('water',),
)
# Object insertion (docs/method.md §13), numbered last: it pastes into the follow-up as every other
# relation left it, so its box is in the follow-up's pixels. It changes what a model should answer
# (one more object), so it is named on its own and is no part of the group 'all'.
INSERTION_RELATIONS: tuple[Relation, ...] = _opt_in(
    INSERTION_PARAMETERS,
    INSERTION_FUNCTIONS,
    INSERTION_EXTRAS,
    len(PAPER_RELATIONS) + len(UNDERWATER_RELATIONS) + len(OPTICS_RELATIONS) + 1,
)
# Every relation a search may use, in the fixed order a composition applies them.
RELATIONS: tuple[Relation, ...] = (
    PAPER_RELATIONS + UNDERWATER_RELATIONS + OPTICS_RELATIONS + INSERTION_RELATIONS
)
RELATION_BY_ID: dict[str, Relation] = {relation.id: relation for relation in RELATIONS}
# A search that names no relations uses the paper's six, so paper mode stays the paper's.
DEFAULT_RELATIONS: tuple[str, ...] = tuple(relation.id for relation in PAPER_RELATIONS)
# Names that stand for several relations wherever relations are selected.
RELATION_GROUPS: dict[str, tuple[str, ...]] = {
    'paper': DEFAULT_RELATIONS,
    'underwater': tuple(relation.id for relation in UNDERWATER_RELATIONS),
    'optics': tuple(relation.id for relation in OPTICS_RELATIONS),
    # Every relation that keeps the answer (insertion changes it: named on its own).
    'all': tuple(relation.id for relation in PAPER_RELATIONS + UNDERWATER_RELATIONS + OPTICS_RELATIONS),
}

_IDENTITY = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


def _relation(relation_id: str) -> Relation:
    try:
        return RELATION_BY_ID[relation_id]
    except KeyError:
        known = ', '.join(RELATION_BY_ID)
        raise ParameterError(f'unknown relation {relation_id!r}; known relations: {known}') from None


def relation_matrix(relation_id: str, value: float, width: int, height: int) -> np.ndarray:
    """The 2x3 forward affine matrix (source pixel -> follow-up pixel) of a geometric relation.

    Args:
        relation_id: the id of a geometric relation ('rotation', 'scaling', 'shear', 'translation').
        value: the relation's parameter (degrees, zoom factor, shear coefficient, shift fraction).
        width: frame width W in pixels.
        height: frame height H in pixels.

    Raises:
        ParameterError: for a relation that is not geometric or an unknown relation.
    """
    relation = _relation(relation_id)
    if relation.matrix is None:
        raise ParameterError(f'{relation.name} is not a geometric relation')
    return relation.matrix(value, width, height)


def _then(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The 2x3 matrix applying ``first`` and then ``second``."""
    return second[:, :2] @ first + np.hstack([np.zeros((2, 2)), second[:, 2:]])


def composition_matrix(composition: Composed, width: int, height: int) -> np.ndarray | None:
    """The 2x3 matrix that moves a pixel as a composition's active geometric relations do, in order.

    The relations between them (CLAHE, downsampling, the underwater ones) move no pixel, so this is
    the fused warp's matrix when none of those is active. None when no geometric relation is active.
    """
    matrix = None
    for relation, active, value in zip(RELATIONS, composition.active, composition.values, strict=True):
        if active and relation.geometric:
            step = relation.matrix(relation.check_value(value), width, height)
            matrix = step if matrix is None else _then(matrix, step)
    return matrix


def _flush(frame: np.ndarray, matrix: np.ndarray | None) -> np.ndarray:
    """Apply accumulated geometry, skipping a product that came out as the identity."""
    if matrix is None or np.allclose(matrix, _IDENTITY, rtol=0.0, atol=1e-12):
        return frame
    return _warp(frame, matrix)


def apply_relation(
    frame: np.ndarray, relation_id: str, value: float, *extras: float, ranges: np.ndarray | None = None
) -> np.ndarray:
    """Apply one metamorphic relation to a frame.

    Args:
        frame: RGB uint8 array of shape (H, W, 3).
        relation_id: one of the ids in RELATIONS, e.g. 'rotation' or 'turbidity'.
        value: the relation's parameter, inside its range.
        *extras: the relation's extras in order (e.g. MR10's angle), inside their ranges; those not
            given are nominal.
        ranges: the frame's range to the scene per pixel, metres (H, W), for a relation that takes
            one (MR12); other relations ignore it.

    Returns:
        A new RGB uint8 array of the same shape (never the input array itself).

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: for an unknown relation or a value outside its range.
    """
    frame = check_frame(frame)
    relation = _relation(relation_id)
    if ranges is not None:
        ranges = check_ranges(ranges, frame)
    out = relation.transform(frame, relation.check_value(value), relation.check_extras(extras), ranges)
    return out.copy() if out is frame else out


def apply_composition(
    frame: np.ndarray, composition: Composed, fuse: bool = True, ranges: np.ndarray | None = None
) -> np.ndarray:
    """Apply the active relations of a composition in the fixed order of RELATIONS (MR1, MR2, ...).

    With ``fuse`` (the default), consecutive geometric relations (rotation and scaling, shear and
    translation, and all four when MR3 and MR4 are inactive) are composed into one 2x3 matrix and
    applied by a single ``cv2.warpAffine``: one interpolation instead of several, and much faster.
    ``fuse=False`` applies them one at a time.

    Args:
        frame: RGB uint8 array of shape (H, W, 3).
        composition: which relations are active and their parameters.
        fuse: compose consecutive geometric relations into one warp.
        ranges: the frame's range to the scene per pixel, metres (H, W), for the relations that take
            one (MR12); moved by the geometric relations before them, as their pixels were.

    Returns:
        A new RGB uint8 array of the same shape (never the input array itself).

    Raises:
        InputError: when the frame is not RGB uint8 (H, W, 3).
        ParameterError: when a parameter lies outside its relation's range.
    """
    frame = check_frame(frame)
    height, width = frame.shape[:2]
    if ranges is not None:
        ranges = check_ranges(ranges, frame)
    out = frame
    pending = None  # geometric matrices accumulated while fusing, not yet applied
    moved = None  # every geometric matrix so far: where the range map's pixels went
    for relation, active, value, extras in zip(
        RELATIONS, composition.active, composition.values, composition.extras, strict=True
    ):
        if not active:
            continue
        value = relation.check_value(value)
        if relation.geometric and not relation.is_identity(value):
            matrix = relation.matrix(value, width, height)
            moved = matrix if moved is None else _then(moved, matrix)
        if relation.geometric and fuse:
            if not relation.is_identity(value):
                pending = matrix if pending is None else _then(pending, matrix)
            continue
        out = _flush(out, pending)
        pending = None
        here = None
        if relation.takes_ranges and ranges is not None:
            here = ranges if moved is None else warp_ranges(ranges, moved)
        out = relation.transform(out, value, relation.check_extras(extras), here)
    out = _flush(out, pending)
    return out.copy() if out is frame else out
