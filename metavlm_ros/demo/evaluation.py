"""Held-out evaluation of the demo models: presence AUC, count accuracy, box accuracy and robustness."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from metavlm_ros.demo.config import ENVIRONMENTS, SECTION_TOKENS
from metavlm_ros.demo.scenes import SceneSet
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.models.counts import parse_counts

__all__ = [
    'answer_examples',
    'auc_by_environment',
    'blip_answers',
    'clip_scores',
    'F_TRANS_BINS',
    'count_metrics',
    'criterion_label',
    'detection_accuracy',
    'evaluate_blip',
    'evaluate_clip',
    'presence_auc',
    'robustness',
    'robustness_frames',
    'robustness_lines',
    'roc_auc',
    'violation_rate_between',
]


#: Edges of the f_trans bins the robustness figures also give violation rates in: from changes well
#: inside one relation's range (f_trans is 1 for one relation at its largest deviation) to compositions
#: of several at large deviations.
F_TRANS_BINS = (0.0, 0.25, 0.5, 1.0, 2.0, 6.0)


def criterion_label(key: str) -> str:
    """A violation criterion of the robustness figures in words: 'count change', 'Th 0.05' or
    'objects at IoU 0.5' (a lost, new or reclassed object, or a box moved below that IoU)."""
    if key == 'count':
        return 'count change'
    if key.startswith('iou'):
        return f'objects at IoU {key[3:]}'
    return f'Th {key}'


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve (Mann-Whitney form, ties counted half); nan with one label only."""
    from scipy.stats import rankdata

    scores = np.asarray(scores, float)
    labels = np.asarray(labels, bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def clip_scores(backend: Any, scenes: SceneSet, batch_size: int = 64) -> np.ndarray:
    """Class confidences (cosine to the class prompts) of a confidence-type backend, (N, classes)."""
    scores = []
    for start in range(0, len(scenes.frames), batch_size):
        scores += [
            [p.values[c] for c in CLASSES] for p in backend.predict(scenes.frames[start : start + batch_size])
        ]
    return np.asarray(scores)


def presence_auc(scores: np.ndarray, counts: np.ndarray) -> dict[str, float]:
    """Per class, the ROC AUC of the class scores against presence (count > 0)."""
    present = counts > 0
    return {c: roc_auc(scores[:, i], present[:, i]) for i, c in enumerate(CLASSES)}


def auc_by_environment(scores: np.ndarray, scenes: SceneSet) -> dict[str, dict[str, float]]:
    """presence_auc within the frames of each environment.

    The environments differ in how often each class shows (deep frames show animals far less often
    than pool frames), so a model that only recognises the environment already scores an AUC well
    above 0.5 over all frames; within one environment it scores 0.5.
    """
    environments = np.asarray(scenes.environments)
    return {
        e: presence_auc(scores[environments == e], scenes.counts[environments == e])
        for e in ENVIRONMENTS
        if (environments == e).any()
    }


def evaluate_clip(backend: Any, scenes: SceneSet, batch_size: int = 64) -> dict[str, float]:
    """Zero-shot class presence of a confidence-type backend on a SceneSet (its `counts`).

    Returns:
        Per class, the ROC AUC of the class confidence (cosine to the class prompt) against presence.
    """
    return presence_auc(clip_scores(backend, scenes, batch_size), scenes.counts)


def blip_answers(backend: Any, scenes: SceneSet | Sequence[np.ndarray], batch_size: int = 32) -> list[str]:
    """The answer text of a count-type backend for every frame of a SceneSet (or of a list of frames)."""
    frames = scenes.frames if isinstance(scenes, SceneSet) else scenes
    texts = []
    for start in range(0, len(frames), batch_size):
        texts += [p.text for p in backend.predict(frames[start : start + batch_size])]
    return texts


def count_metrics(texts: Sequence[str], counts: np.ndarray) -> dict[str, Any]:
    """Counting quality of answers against per-class counts.

    Returns:
        'parsed': fraction of answers in the Table 1 format (all four sections present);
        'exact': per class, fraction of frames whose parsed count equals the ground truth;
        'presence': per class, fraction whose parsed presence (count > 0) equals the ground truth.
    """
    predicted = np.asarray([[parse_counts(t)[c] for c in CLASSES] for t in texts])
    parsed = [all(h in t for h in SECTION_TOKENS.values()) for t in texts]
    exact = predicted == counts
    presence = (predicted > 0) == (counts > 0)
    return {
        'parsed': float(np.mean(parsed)),
        'exact': {c: float(exact[:, i].mean()) for i, c in enumerate(CLASSES)},
        'presence': {c: float(presence[:, i].mean()) for i, c in enumerate(CLASSES)},
    }


def evaluate_blip(backend: Any, scenes: SceneSet, batch_size: int = 32) -> dict[str, Any]:
    """Counting quality of a count-type backend on a SceneSet (its `counts`): count_metrics plus
    'examples', a few (answer, ground-truth caption) pairs."""
    texts = blip_answers(backend, scenes, batch_size)
    return count_metrics(texts, scenes.counts) | {'examples': answer_examples(texts, scenes)}


def detection_accuracy(
    backend: Any,
    scenes: SceneSet,
    *,
    iou_threshold: float = 0.5,
    small_pixels: int = 16,
    batch_size: int = 32,
) -> dict[str, Any]:
    """How right a detection-type backend is on the frames of a SceneSet against their true boxes
    (`scenes.boxes`), matched as the tool matches them on its own footage (method/boxes.py
    source_accuracy: class by class, Hungarian on IoU, a true positive at `iou_threshold` or more).

    Returns:
        'precision', 'recall': over all frames' objects; 'per_class': class -> {'precision',
        'recall'}; 'frames_correct': share of frames with every object found and nothing else;
        'recall_small' / 'recall_large': recall over the objects covering fewer / at least
        `small_pixels` pixels of a `scenes.small` input; 'objects', 'found': how many.
    """
    from metavlm_ros.method.boxes import Detection, source_accuracy

    side = scenes.small.shape[1]
    tally = {c: np.zeros(3, int) for c in (*CLASSES, 'small', 'large')}  # true pos., false pos., false neg.
    correct = 0
    for start in range(0, len(scenes.frames), batch_size):
        frames = scenes.frames[start : start + batch_size]
        for offset, (frame, prediction) in enumerate(zip(frames, backend.predict(frames), strict=True)):
            height, width = frame.shape[:2]
            rows = scenes.boxes[start + offset]
            truth = [
                Detection(CLASSES[int(r[0])], 1.0, tuple(r[1:5] * [width, height, width, height]))
                for r in rows
            ]
            small = rows[:, 5] * side * side < small_pixels
            right = True
            # Matching is class by class, so each class's tally is the frame's matching restricted to it.
            for index, cls in enumerate(CLASSES):
                mine = rows[:, 0] == index
                found = [d for d in prediction.detections if d.cls == cls]
                got = source_accuracy(
                    [t for t, m in zip(truth, mine, strict=True) if m], found, width, height, iou_threshold
                )
                tally[cls] += [got.true_positives, got.false_positives, got.false_negatives]
                right = right and got.correct
                for name, size in (('small', small), ('large', ~small)):
                    subset = [t for t, m in zip(truth, mine & size, strict=True) if m]
                    # Recall only: a found box matched to no object of this size is not an error of it.
                    got = source_accuracy(subset, found, width, height, iou_threshold)
                    tally[name] += [got.true_positives, 0, got.false_negatives]
            correct += right
    total = sum(tally[c] for c in CLASSES)

    def rates(counts: np.ndarray) -> dict[str, float]:
        hits, false, missed = (int(v) for v in counts)
        return {
            'precision': hits / (hits + false) if hits + false else math.nan,
            'recall': hits / (hits + missed) if hits + missed else math.nan,
        }

    return {
        **rates(total),
        'per_class': {c: rates(tally[c]) for c in CLASSES},
        'frames_correct': correct / len(scenes.frames),
        'recall_small': rates(tally['small'])['recall'],
        'recall_large': rates(tally['large'])['recall'],
        'small_pixels': small_pixels,
        'iou_threshold': iou_threshold,
        'objects': int(total[0] + total[2]),
        'found': int(total[0] + total[1]),
    }


def robustness_frames(scenes: SceneSet, n: int = 20) -> list[np.ndarray]:
    """Up to `n` full frames of a held-out set, one per scene and spread over the environments:
    every 15th frame (the held-out set takes 3 frames per scene and cycles the 3 environments)."""
    return scenes.frames[::15][:n]


def robustness(
    backend: Any, frames: Sequence[np.ndarray], *, evaluations: int = 300, seed: int = 0
) -> dict[str, Any]:
    """How robust a model is to the metamorphic relations: the search's random baseline on each frame.

    One `run_search` with algorithm 'random' per frame (seed `seed + i`, population 30), judging
    violations as the tester does (every threshold of DEFAULT_THRESHOLDS for a confidence-type
    model, any count change for a count-type one).

    Returns:
        'rate': per violation criterion ('0.05', ..., or 'count'), order (1..6) -> violation rate
            over all frames' evaluations of that order;
        'evaluations': per criterion, order -> number of evaluations of that order;
        'smallest': per criterion, per frame, the smallest f_trans of a violating evaluation
            (None: the frame had none);
        'median_smallest': per criterion, the median over frames of 'smallest', a frame without a
            violation counting as larger than any (None when most frames have none);
        'rate_by_f_trans' / 'evaluations_by_f_trans': per criterion, per bin of F_TRANS_BINS (its
            lower edge as a string, e.g. '0.25' for [0.25, 0.5)), the violation rate and the number
            of evaluations; small changes against large ones whatever their order.
    """
    from metavlm_ros.method.search import SearchConfig, run_search

    hits: dict[str, dict[int, int]] = {}
    totals: dict[str, dict[int, int]] = {}
    smallest: dict[str, list[float | None]] = {}
    binned: dict[str, np.ndarray] = {}  # per criterion, per bin: violations, evaluations
    edges = np.asarray(F_TRANS_BINS)
    for i, frame in enumerate(frames):
        config = SearchConfig(algorithm='random', evaluations=evaluations, seed=seed + i)
        result = run_search(frame, backend, config, image_id=f'frame{i}')
        for key, table in result.violations_by_order.items():
            for order, (violations, total) in table.items():
                hits.setdefault(key, {})[order] = hits.get(key, {}).get(order, 0) + violations
                totals.setdefault(key, {})[order] = totals.get(key, {}).get(order, 0) + total
        for key in result.violations_by_order:
            violating = [
                ev.f_trans for ev in result.evaluations if not ev.failed and ev.violation.get(key, False)
            ]
            smallest.setdefault(key, []).append(min(violating) if violating else None)
            counts = binned.setdefault(key, np.zeros((len(edges) - 1, 2), int))
            for ev in result.evaluations:
                if not ev.failed and ev.composition.order:
                    where = min(len(edges) - 2, int(np.searchsorted(edges, ev.f_trans, side='right')) - 1)
                    counts[where] += [bool(ev.violation.get(key, False)), 1]
    median: dict[str, float | None] = {}
    for key, values in smallest.items():
        ordered = sorted(math.inf if v is None else v for v in values)
        middle = float(np.median(ordered)) if ordered else math.inf
        median[key] = None if math.isinf(middle) else middle
    return {
        'rate': {k: {o: hits[k][o] / totals[k][o] for o in sorted(totals[k])} for k in sorted(totals)},
        'evaluations': {k: dict(sorted(v.items())) for k, v in sorted(totals.items())},
        'smallest': smallest,
        'median_smallest': median,
        'rate_by_f_trans': {
            k: {f'{edges[b]:g}': int(v) / int(n) for b, (v, n) in enumerate(counts) if n}
            for k, counts in sorted(binned.items())
        },
        'evaluations_by_f_trans': {
            k: {f'{edges[b]:g}': int(n) for b, (_, n) in enumerate(counts) if n}
            for k, counts in sorted(binned.items())
        },
    }


def violation_rate_between(figures: dict[str, Any], key: str, low: float, high: float) -> float | None:
    """The violation rate of robustness figures over the evaluations whose f_trans lies in [low, high),
    pooled over the F_TRANS_BINS bins inside it (`low` and `high` are bin edges); None when none."""
    rates, counts = figures['rate_by_f_trans'][key], figures['evaluations_by_f_trans'][key]
    inside = [f'{e:g}' for e in F_TRANS_BINS[:-1] if low <= e < high]
    total = sum(counts.get(b, 0) for b in inside)
    return sum(rates[b] * counts[b] for b in inside if b in counts) / total if total else None


def robustness_lines(name: str, figures: dict[str, Any], frames: int, evaluations: int) -> list[str]:
    """The robustness figures as printed by the training command, one line per criterion."""
    lines = []
    for key, rates in figures['rate'].items():
        label = criterion_label(key)
        median = figures['median_smallest'][key]
        lines.append(
            f'{name} robustness (Rand, {evaluations} evaluations x {frames} held-out frames), {label}: '
            'violation rate by order '
            + ' '.join(f'{order}:{rate:.3f}' for order, rate in rates.items())
            + '; median smallest violating f_trans '
            + ('none' if median is None else f'{median:.3f}')
            + _small_and_large(figures, key)
        )
    return lines


def _small_and_large(figures: dict[str, Any], key: str) -> str:
    """'; at f_trans < 0.5 ..., at f_trans >= 2 ...' where the figures have rates by f_trans."""
    if key not in figures.get('rate_by_f_trans', {}):
        return ''
    small, large = (violation_rate_between(figures, key, *span) for span in ((0.0, 0.5), (2.0, math.inf)))
    return (
        '; at f_trans < 0.5 '
        + ('-' if small is None else f'{small:.3f}')
        + ', at f_trans >= 2 '
        + ('-' if large is None else f'{large:.3f}')
    )


def answer_examples(texts: Sequence[str], scenes: SceneSet, n: int = 3) -> list[tuple[str, str]]:
    """The first few (answer, ground-truth caption) pairs."""
    return list(zip(texts[:n], scenes.captions[:n], strict=False))
