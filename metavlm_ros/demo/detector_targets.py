"""What the demo detector is taught: batches with their boxes and patches matched to objects (the loss is
training/detection_loss.py's)."""

from __future__ import annotations

from typing import Any

import numpy as np

from metavlm_ros.demo.batches import random_augmentation
from metavlm_ros.demo.config import TrainingConfig
from metavlm_ros.demo.scenes import SceneSet, resize_square
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.training.detection_loss import dense_box_targets, detection_loss, matching_cost

__all__ = [
    'box_targets',
    'dense_box_targets',
    'detection_batch',
    'detection_loss',
]


def _moved_rows(rows: np.ndarray, composition: Any, width: int, height: int) -> np.ndarray:
    """Ground-truth rows (class, x0, y0, x1, y1 as frame fractions, area) moved by a composition's warp
    as the oracle moves a source's boxes (method/boxes.py expected_boxes, no tolerance); each edge the
    middle of its band. An object left mostly outside the frame gets area -1: neither object nor
    background."""
    from metavlm_ros.method.boxes import Detection, expected_boxes
    from metavlm_ros.method.relations import composition_matrix

    matrix = composition_matrix(composition, width, height)
    if matrix is None:
        return rows
    scale = np.array([width, height, width, height])
    found = [Detection(CLASSES[int(r[0])], 1.0, tuple(r[1:5] * scale)) for r in rows]
    moved = []
    for box in expected_boxes(found, matrix, width, height, tolerance=0.0):
        source = rows[box.source]
        edges = (np.asarray(box.outer) + np.asarray(box.inner)) / 2 / scale
        edges = np.concatenate([np.minimum(edges[:2], edges[2:]), np.maximum(edges[:2], edges[2:])])
        area = source[5] * abs(np.linalg.det(matrix[:, :2])) if box.required else -1.0
        moved.append([source[0], *edges, area])
    return np.asarray(moved, np.float32).reshape(-1, 6)


def detection_batch(
    train: SceneSet, idx: np.ndarray, rng: np.random.Generator, config: TrainingConfig
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One batch of model inputs and their objects: a fraction `detector_augment` of the frames
    transformed by a random composition of the relations (their objects moved by the same warp),
    half flipped left-right (and their boxes).

    Returns:
        (small, rows): (B, S, S, 3) uint8 inputs, and per frame its objects' rows (class, x0, y0, x1,
        y1 as fractions of the input, area; area -1 for an object to ignore).
    """
    from metavlm_ros.method.relations import apply_composition

    small = train.small[idx].copy()
    rows = [train.boxes[i].copy() for i in idx]
    if config.detector_augment and train.mid is not None:
        height, width = train.mid.shape[1:3]
        for j in np.flatnonzero(rng.random(len(idx)) < config.detector_augment):
            composition = random_augmentation(rng, config.detector_augment_magnitude)
            small[j] = resize_square(apply_composition(train.mid[idx[j]], composition), small.shape[1])
            rows[j] = _moved_rows(rows[j], composition, width, height)
    for j in np.flatnonzero(rng.random(len(idx)) < 0.5):
        small[j] = small[j, :, ::-1]
        rows[j][:, [1, 3]] = 1.0 - rows[j][:, [3, 1]]
    return small, rows


def box_targets(
    rows: list[np.ndarray], grid: int, min_area: float, predicted: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which patch answers which object. An object may be answered by a patch of the 3x3 around the
    one its centre lies in; objects and patches are matched one to one (Hungarian) at the least cost:
    with `predicted`, DETR's matching cost of what each patch answers now (minus its probability of
    the object's class, plus 5 L1 and 2 (1 - generalised IoU) of its box), as OWL-ViT is trained,
    restricted to those patches; without, the distance from the patch's centre to the object's.
    Objects smaller than `min_area` (a fraction of the frame) or to ignore (area -1) leave their
    centre's patch untaught, neither object nor background.

    Args:
        rows: per frame, its objects (class, x0, y0, x1, y1 as fractions, area).
        grid: the patch grid's side.
        min_area: the smallest object taught, as a fraction of the frame.
        predicted: (probabilities, boxes): per frame and patch, each class's probability and the box
            (centre x, centre y, width, height), as numpy arrays; None: match by distance.

    Returns:
        (classes, ignore, boxes): per frame and patch (row by row), the class index of its object or
        -1 for background; whether the patch is left out of the class loss; its object's box
        (centre x, centre y, width, height as fractions).
    """
    from scipy.optimize import linear_sum_assignment

    count = len(rows)
    classes = np.full((count, grid * grid), -1, np.int64)
    ignore = np.zeros((count, grid * grid), bool)
    boxes = np.zeros((count, grid * grid, 4), np.float32)
    middle = (np.stack(np.meshgrid(np.arange(grid), np.arange(grid)), axis=-1).reshape(-1, 2) + 0.5) / grid
    for frame, objects in enumerate(rows):
        centres = (objects[:, 1:3] + objects[:, 3:5]) / 2
        wanted = np.concatenate([centres, objects[:, 3:5] - objects[:, 1:3]], axis=1)
        cells = np.clip((centres * grid).astype(int), 0, grid - 1)
        taught = np.flatnonzero(objects[:, 5] >= min_area)
        # Each taught object's 3x3 patches around its centre's (one index per pair; off the grid: none).
        offsets = np.array([(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)])
        line, col = (cells[taught][:, None, 1] + offsets[:, 0]), (cells[taught][:, None, 0] + offsets[:, 1])
        row, near = np.nonzero((line >= 0) & (line < grid) & (col >= 0) & (col < grid))
        patch = line[row, near] * grid + col[row, near]
        k = taught[row]
        if predicted is None:
            pair = np.hypot(*(middle[patch] - centres[k]).T)
        else:
            probability = predicted[0][frame, patch, objects[k, 0].astype(int)]
            pair = matching_cost(probability, predicted[1][frame, patch], wanted[k])
        cost = np.full((len(taught), grid * grid), np.inf)
        cost[row, patch] = pair
        if len(taught):
            matched, patches = linear_sum_assignment(np.where(np.isfinite(cost), cost, 1e9))
            for row, patch in zip(matched, patches, strict=True):
                if np.isfinite(cost[row, patch]):
                    classes[frame, patch] = int(objects[taught[row], 0])
                    boxes[frame, patch] = wanted[taught[row]]
        for k in np.setdiff1d(np.arange(len(objects)), taught):
            patch = cells[k][1] * grid + cells[k][0]
            ignore[frame, patch] = classes[frame, patch] < 0
    return classes, ignore, boxes
