"""The box oracle: source detections moved through a composition's warp, matched to the follow-up's.

A detection answer lists objects: class, score and an axis-aligned box (x1, y1, x2, y2) in the
frame's pixels. A geometric relation moves every pixel by the composition's affine matrix
(`composition_matrix`), so it moves the objects: the follow-up should hold each source object
where the warp put it. Where the warp rotates or shears, an axis-aligned box is not carried to one:
the object's true box in the follow-up lies between two boxes this module computes from the mapped
box (`ExpectedBox`: its corners' hull from outside, and its sides from inside), and a found box
anywhere in that band is exact (docs/method.md, "Detections"). Objects pushed out of the frame are
no longer expected; objects cut by the border are clipped to it; an object left mostly outside is
"either": found or not, it counts for nothing (as COCO's ignored regions).

Matching is class by class, Hungarian (scipy's `linear_sum_assignment`) on the tolerant IoU; f_pred
is 1 - the panoptic quality of the match (Kirillov et al., CVPR 2019): sum of matched IoUs over
matched + (lost + new) / 2, in [0, 1], 0 for the same objects in the same places.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from metavlm_ros.common.errors import ParameterError

__all__ = [
    'DEFAULT_IOU_THRESHOLD',
    'DEFAULT_MIN_VISIBLE',
    'DEFAULT_PIXEL_TOLERANCE',
    'BoxMatch',
    'Detection',
    'ExpectedBox',
    'SourceAccuracy',
    'compare_detections',
    'expected_boxes',
    'source_accuracy',
    'tolerant_iou',
]

#: A matched pair below this IoU is a displaced object, a violation (the PASCAL VOC / COCO AP50 bar).
DEFAULT_IOU_THRESHOLD = 0.5
#: An object whose mapped box keeps less than this share of its area inside the frame is "either":
#: neither expected nor new if found.
DEFAULT_MIN_VISIBLE = 0.5
#: Pixels each band is widened by on both sides: boxes are drawn to whole pixels, and a warp's
#: interpolation blurs an edge by one more (test/method/test_boxes.py measures a perfect detector).
DEFAULT_PIXEL_TOLERANCE = 1.5


@dataclass(frozen=True)
class Detection:
    """One object a model found: its class (of the configured vocabulary), score, and box
    (x1, y1, x2, y2) in the pixels of the frame it was given, x1 < x2, y1 < y2."""

    cls: str
    score: float
    box: tuple[float, float, float, float]

    def as_record(self) -> dict:
        return {'class': self.cls, 'score': self.score, 'box': list(self.box)}

    @classmethod
    def from_record(cls, record: Mapping) -> Detection:
        return cls(str(record['class']), float(record['score']), tuple(float(v) for v in record['box']))

    def scaled(self, sx: float, sy: float) -> Detection:
        """The same object in the pixels of a frame `sx` times as wide and `sy` times as high."""
        x1, y1, x2, y2 = self.box
        return Detection(self.cls, self.score, (x1 * sx, y1 * sy, x2 * sx, y2 * sy))


@dataclass(frozen=True)
class ExpectedBox:
    """Where a source object must be in the follow-up: its true box's edges lie in bands.

    `outer` is the box of the mapped box's four corners (no point of the object lies outside it);
    `inner` holds each edge's other limit: the object touches each side of its source box, so its
    follow-up box reaches at least as far as one point of each mapped side (x1 <= inner[0],
    y1 <= inner[1], x2 >= inner[2], y2 >= inner[3]). Both are clipped to the frame. Without rotation
    or shear inner == outer: the band is the box itself. `required`: visible enough to be expected.
    """

    cls: str
    outer: tuple[float, float, float, float]
    inner: tuple[float, float, float, float]
    required: bool
    source: int | None  # the index of the source detection it carries; None: a pasted object (§13)

    def as_record(self) -> dict:
        return {
            'class': self.cls,
            'box': list(self.outer),
            'inner': list(self.inner),
            'required': self.required,
        }


def _check_box(box: Sequence[float]) -> np.ndarray:
    b = np.asarray(box, dtype=float).reshape(-1)
    if b.size != 4 or not np.all(np.isfinite(b)) or b[2] < b[0] or b[3] < b[1]:
        raise ParameterError(f'a box is (x1, y1, x2, y2) with x1 <= x2 and y1 <= y2, got {list(box)!r}')
    return b


def expected_boxes(
    detections: Sequence[Detection],
    matrix: np.ndarray | None,
    width: int,
    height: int,
    min_visible: float = DEFAULT_MIN_VISIBLE,
    tolerance: float = DEFAULT_PIXEL_TOLERANCE,
) -> list[ExpectedBox]:
    """The source's detections carried through a warp (2x3, source pixel -> follow-up pixel; None: no
    pixel moves), clipped to the (width, height) frame; those wholly outside it are left out.

    Args:
        detections: The source frame's detections.
        matrix: The composition's affine matrix (`composition_matrix`), or None.
        width: The frame's width in pixels (the follow-up's is the same).
        height: Its height.
        min_visible: The share of the mapped box's area that must stay inside the frame for the
            object to be expected; below it, the object is "either" (`required` False).
        tolerance: Pixels each edge's band is widened by on both sides.
    """
    m = np.eye(3)[:2] if matrix is None else np.asarray(matrix, dtype=float).reshape(2, 3)
    frame = np.array([0.0, 0.0, float(width), float(height)])
    expected = []
    for index, detection in enumerate(detections):
        x1, y1, x2, y2 = _check_box(detection.box)
        corners = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]])
        mapped = corners @ m[:, :2].T + m[:, 2]
        sides = np.stack([mapped, np.roll(mapped, -1, axis=0)], axis=1)  # 4 sides, 2 ends each, (x, y)
        outer = np.concatenate([mapped.min(axis=0), mapped.max(axis=0)]) + [
            -tolerance,
            -tolerance,
            tolerance,
            tolerance,
        ]
        clipped = np.concatenate([np.maximum(outer[:2], frame[:2]), np.minimum(outer[2:], frame[2:])])
        visible = np.prod(np.clip(clipped[2:] - clipped[:2], 0, None))
        if visible <= 0:
            continue  # pushed out of the frame: no longer expected
        area = np.prod(outer[2:] - outer[:2])
        # Each mapped side holds a point of the object (it touched each side of its source box): the
        # box reaches at least the nearest end of the farthest such side in each direction. Only the
        # sides wholly inside the frame count: a point of one cut by the border may be gone.
        inside = [s for s in sides if np.all((s >= frame[:2] - tolerance) & (s <= frame[2:] + tolerance))]
        inner = clipped[[2, 3, 0, 1]]  # no side inside: no edge is held, anywhere in the box goes
        if inside:
            ends = np.array(inside)
            inner = np.array([
                ends[:, :, 0].max(axis=1).min(), ends[:, :, 1].max(axis=1).min(),
                ends[:, :, 0].min(axis=1).max(), ends[:, :, 1].min(axis=1).max(),
            ]) + [tolerance, tolerance, -tolerance, -tolerance]  # fmt: skip
        inner = np.clip(inner, np.tile(clipped[:2], 2), np.tile(clipped[2:], 2))
        required = area <= 0 or visible / area >= min_visible
        expected.append(
            ExpectedBox(
                detection.cls, tuple(map(float, clipped)), tuple(map(float, inner)), bool(required), index
            )
        )
    return expected


def tolerant_iou(expected: Sequence[ExpectedBox], found: Sequence[Detection]) -> np.ndarray:
    """(len(expected), len(found)) IoUs of each found box with the box inside the expected one's band
    nearest to it (each edge clamped into its band): 1 for a box anywhere in the band.

    Where the band is the box itself (no rotation or shear) this is the plain IoU.
    """
    if not expected or not found:
        return np.zeros((len(expected), len(found)))
    outer = np.array([e.outer for e in expected])[:, None, :]
    inner = np.array([e.inner for e in expected])[:, None, :]
    f = np.array([_check_box(d.box) for d in found])[None, :, :]
    low = np.concatenate(
        [outer[..., :2], inner[..., 2:]], axis=-1
    )  # x1, y1 from the outer edge; x2, y2 from the inner
    high = np.concatenate([inner[..., :2], outer[..., 2:]], axis=-1)
    nearest = np.clip(f, np.minimum(low, high), np.maximum(low, high))
    nearest = np.concatenate(
        [np.minimum(nearest[..., :2], nearest[..., 2:]), np.maximum(nearest[..., :2], nearest[..., 2:])],
        axis=-1,
    )
    top_left = np.maximum(f[..., :2], nearest[..., :2])
    bottom_right = np.minimum(f[..., 2:], nearest[..., 2:])
    overlap = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
    union = (
        np.prod(f[..., 2:] - f[..., :2], axis=-1)
        + np.prod(nearest[..., 2:] - nearest[..., :2], axis=-1)
        - overlap
    )
    with np.errstate(invalid='ignore', divide='ignore'):
        return np.where(union > 0, overlap / union, 0.0)


@dataclass(frozen=True)
class BoxMatch:
    """Expected boxes matched to the follow-up's detections, and what changed.

    `pairs`: (expected index, found index, IoU) of every match with a required expected box;
    `lost`: required expected boxes left unmatched; `new`: found boxes matched to nothing;
    `reclassed`: (expected, found) among those, overlapping by the IoU threshold or more: one object
    whose class changed; `displaced`: the pairs below the IoU threshold.
    """

    pairs: tuple[tuple[int, int, float], ...]
    lost: tuple[int, ...]
    new: tuple[int, ...]
    reclassed: tuple[tuple[int, int], ...]
    displaced: tuple[tuple[int, int, float], ...]
    iou_threshold: float
    ignored: tuple[int, ...] = field(default=())  # found boxes matched to an "either" box

    @property
    def f_pred(self) -> float:
        """1 - panoptic quality: 1 - sum(IoU) / (matched + (lost + new) / 2), in [0, 1]; 0 when nothing
        was expected and nothing found."""
        matched = len(self.pairs)
        denominator = matched + 0.5 * (len(self.lost) + len(self.new))
        if denominator == 0:
            return 0.0
        return float(min(1.0, max(0.0, 1.0 - sum(iou for _, _, iou in self.pairs) / denominator)))

    @property
    def violation(self) -> bool:
        """A lost object, a new one, a changed class, or a matched pair below the IoU threshold."""
        return bool(self.lost or self.new or self.displaced)


def compare_detections(
    expected: Sequence[ExpectedBox], found: Sequence[Detection], iou_threshold: float = DEFAULT_IOU_THRESHOLD
) -> BoxMatch:
    """Match the follow-up's detections to the expected boxes, class by class (Hungarian on the
    tolerant IoU; a pair that does not overlap is no match)."""
    if not 0.0 < iou_threshold <= 1.0:
        raise ParameterError(f'the IoU threshold must lie in (0, 1], got {iou_threshold!r}')
    iou = tolerant_iou(expected, found)
    pairs, ignored = [], []
    matched_expected, matched_found = set(), set()
    for cls in sorted({e.cls for e in expected} | {d.cls for d in found}):
        rows = [i for i, e in enumerate(expected) if e.cls == cls]
        cols = [j for j, d in enumerate(found) if d.cls == cls]
        if not rows or not cols:
            continue
        sub = iou[np.ix_(rows, cols)]
        for r, c in zip(*linear_sum_assignment(sub, maximize=True), strict=True):
            if sub[r, c] <= 0:
                continue
            i, j = rows[r], cols[c]
            matched_expected.add(i)
            matched_found.add(j)
            if expected[i].required:
                pairs.append((i, j, float(sub[r, c])))
            else:
                ignored.append(j)
    lost = [i for i, e in enumerate(expected) if e.required and i not in matched_expected]
    new = [j for j in range(len(found)) if j not in matched_found]
    reclassed = []
    taken: set[int] = set()
    for i in lost:
        candidates = [
            j
            for j in new
            if j not in taken and found[j].cls != expected[i].cls and iou[i, j] >= iou_threshold
        ]
        if candidates:
            j = max(candidates, key=lambda j: iou[i, j])
            taken.add(j)
            reclassed.append((i, j))
    displaced = [p for p in pairs if p[2] < iou_threshold]
    return BoxMatch(
        tuple(pairs),
        tuple(lost),
        tuple(new),
        tuple(reclassed),
        tuple(displaced),
        iou_threshold,
        tuple(ignored),
    )


@dataclass(frozen=True)
class SourceAccuracy:
    """A detection answer against a frame's ground truth: true positives (a true object found, same
    class, IoU at the threshold or more), false positives, false negatives, and the rates."""

    true_positives: int
    false_positives: int
    false_negatives: int
    iou_threshold: float

    @property
    def precision(self) -> float:
        found = self.true_positives + self.false_positives
        return self.true_positives / found if found else 1.0

    @property
    def recall(self) -> float:
        there = self.true_positives + self.false_negatives
        return self.true_positives / there if there else 1.0

    @property
    def correct(self) -> bool:
        """Every object found and nothing else: the frame is one the model gets right."""
        return self.false_positives == 0 and self.false_negatives == 0

    def as_record(self) -> dict:
        return {
            'true_positives': self.true_positives,
            'false_positives': self.false_positives,
            'false_negatives': self.false_negatives,
            'precision': self.precision,
            'recall': self.recall,
            'iou_threshold': self.iou_threshold,
        }


def source_accuracy(
    truth: Sequence[Detection],
    found: Sequence[Detection],
    width: int,
    height: int,
    iou_threshold: float = 0.5,
) -> SourceAccuracy:
    """How right a detection answer is on a frame whose true objects are known (the project's own
    footage): the same class-by-class Hungarian matching as the oracle, the true boxes taken as they
    are (a pixel's tolerance: ground truth and answers are drawn to whole pixels)."""
    expected = expected_boxes(truth, None, width, height, min_visible=0.0, tolerance=DEFAULT_PIXEL_TOLERANCE)
    match = compare_detections(expected, found, iou_threshold)
    hits = len(match.pairs) - len(match.displaced)
    return SourceAccuracy(hits, len(found) - hits, len(expected) - hits, iou_threshold)
