"""Held-out evaluation of the demo models: presence AUC, count accuracy and robustness."""

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
    'count_metrics',
    'evaluate_blip',
    'evaluate_clip',
    'presence_auc',
    'robustness',
    'robustness_frames',
    'robustness_lines',
    'roc_auc',
]


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
            violation counting as larger than any (None when most frames have none).
    """
    from metavlm_ros.method.search import SearchConfig, run_search

    hits: dict[str, dict[int, int]] = {}
    totals: dict[str, dict[int, int]] = {}
    smallest: dict[str, list[float | None]] = {}
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
    }


def robustness_lines(name: str, figures: dict[str, Any], frames: int, evaluations: int) -> list[str]:
    """The robustness figures as printed by the training command, one line per criterion."""
    lines = []
    for key, rates in figures['rate'].items():
        label = 'count change' if key == 'count' else f'Th {key}'
        median = figures['median_smallest'][key]
        lines.append(
            f'{name} robustness (Rand, {evaluations} evaluations x {frames} held-out frames), {label}: '
            'violation rate by order '
            + ' '.join(f'{order}:{rate:.3f}' for order, rate in rates.items())
            + '; median smallest violating f_trans '
            + ('none' if median is None else f'{median:.3f}')
        )
    return lines


def answer_examples(texts: Sequence[str], scenes: SceneSet, n: int = 3) -> list[tuple[str, str]]:
    """The first few (answer, ground-truth caption) pairs."""
    return list(zip(texts[:n], scenes.captions[:n], strict=False))
