"""The detection loss a detector is trained with: query slots matched one to one to the objects they must
answer (DETR's Hungarian matching, as OWL-ViT and Grounding DINO are trained), sigmoid cross-entropy on
every slot and class, L1 and generalised IoU on the matched slots' boxes (docs/harden.md)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    'CLASS_WEIGHT',
    'DENSE_BOX_REACH',
    'DENSE_REACH',
    'GIOU_WEIGHT',
    'L1_WEIGHT',
    'dense_box_targets',
    'detection_loss',
    'generalised_iou_np',
    'matching_cost',
    'slot_targets',
]

#: DETR's box loss weights (L1 on centre and size; 1 - generalised IoU), which OWL-ViT trains with and
#: matches slots to objects by.
L1_WEIGHT, GIOU_WEIGHT = 5.0, 2.0
#: Weight of the class loss, sigmoid cross-entropy over every slot and class. OWL-ViT trains with
#: RetinaNet's focal loss; on the demo's scenes it left the background patches at scores of 0.1-0.2 (a
#: tenth of the held-out detections right at the family's threshold 0.1), where the plain
#: cross-entropy pushes them down (docs/demo.md, "The demo detector").
CLASS_WEIGHT = 0.5
#: Dense targets (`dense_box_targets`, for detectors that suppress duplicates): a patch answers an
#: object when its centre lies within max(DENSE_REACH patches, a quarter of the object's side) of the
#: object's centre on both axes, and is taught the object's box (as background for its class) within
#: max(DENSE_BOX_REACH patches, half the object's side plus half a patch).
DENSE_REACH, DENSE_BOX_REACH = 0.75, 1.5


def generalised_iou_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Generalised IoU of matching rows of two (N, 4) centre-size box arrays."""
    a = np.concatenate([a[:, :2] - a[:, 2:] / 2, a[:, :2] + a[:, 2:] / 2], axis=1)
    b = np.concatenate([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], axis=1)
    overlap = np.clip(np.minimum(a[:, 2:], b[:, 2:]) - np.maximum(a[:, :2], b[:, :2]), 0, None).prod(axis=1)
    union = (a[:, 2:] - a[:, :2]).prod(axis=1) + (b[:, 2:] - b[:, :2]).prod(axis=1) - overlap
    hull = (np.maximum(a[:, 2:], b[:, 2:]) - np.minimum(a[:, :2], b[:, :2])).prod(axis=1)
    return overlap / np.maximum(union, 1e-9) - (hull - union) / np.maximum(hull, 1e-9)


def matching_cost(probability: np.ndarray, answered: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """DETR's cost of a slot answering an object, pair by pair: minus the slot's probability of the
    object's class, plus 5 L1 and 2 (1 - generalised IoU) of its box (centre-size fractions)."""
    l1 = np.abs(answered - wanted).sum(axis=1)
    return -probability + L1_WEIGHT * l1 + GIOU_WEIGHT * (1 - generalised_iou_np(answered, wanted))


def slot_targets(
    objects: list[np.ndarray], probabilities: np.ndarray, answered: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which slot answers which object, frame by frame: every object matched to one slot of all the
    frame's slots at the least `matching_cost` (scipy's Hungarian), the rest background.

    Args:
        objects: per frame, its objects as rows (class index, cx, cy, w, h as fractions, taught): an
            object whose `taught` is 0 is matched (so no other object takes its slot) but its slot is
            left out of the loss, neither object nor background (an object the oracle does not require).
        probabilities: (frames, slots, classes) what each slot answers now.
        answered: (frames, slots, 4) each slot's box now (cx, cy, w, h as fractions).

    Returns:
        (classes, ignore, boxes) as `detection_loss` takes them: per frame and slot its object's class
        index or -1 for background; whether the slot is left out; its object's box.
    """
    from scipy.optimize import linear_sum_assignment

    count, slots = probabilities.shape[:2]
    classes = np.full((count, slots), -1, np.int64)
    ignore = np.zeros((count, slots), bool)
    boxes = np.zeros((count, slots, 4), np.float32)
    for frame, rows in enumerate(objects):
        if not len(rows):
            continue
        kinds = rows[:, 0].astype(int)
        wanted = rows[:, 1:5]
        pairs_answered = np.repeat(answered[frame][None], len(rows), axis=0).reshape(-1, 4)
        pairs_wanted = np.repeat(wanted, slots, axis=0)
        probability = probabilities[frame][:, kinds].T.reshape(-1)
        cost = matching_cost(probability, pairs_answered, pairs_wanted).reshape(len(rows), slots)
        for row, slot in zip(*linear_sum_assignment(cost), strict=True):
            if rows[row, 5]:
                classes[frame, slot] = kinds[row]
                boxes[frame, slot] = wanted[row]
            else:
                ignore[frame, slot] = True
    return classes, ignore, boxes


def dense_box_targets(
    rows: list[np.ndarray], grid: int, min_area: float, centres: list[np.ndarray] | None = None
) -> tuple[np.ndarray, ...]:
    """Every patch near an object's centre answers it (one object, many patches, as FCOS and YOLO are
    taught; the detector's class-wise non-maximum suppression keeps one box). A patch answers an object
    whose centre is within max(DENSE_REACH patches, a quarter of its side) on both axes, smaller objects
    first (a larger one keeps the patches they leave, or else the free patch nearest its centre); a wider
    ring around each object is taught its box but not its class, so that a patch firing beside an object
    answers that object's box and the suppression merges it. Objects smaller than `min_area` or to
    ignore (area -1) leave the patches they would answer untaught, neither object nor background.

    Args:
        rows: per frame, its objects (class index, x0, y0, x1, y1 as fractions of the frame, area).
        grid: the patch grid's side (patches row by row; a patch's side is 1 / grid).
        min_area: the smallest object taught, as a fraction of the frame.
        centres: per frame, each patch's centre as fractions of the frame (OWLv2's patches tile the
            frame padded to a square); None: the grid over the frame.

    Returns:
        (classes, ignore, boxes, box_taught): per frame and patch (row by row) the class index of its
        object or -1 for background, whether the patch is left out of the class loss, the box it is
        taught (centre x, centre y, width, height as fractions), and whether its box is taught.
    """
    count, patches = len(rows), grid * grid
    classes = np.full((count, patches), -1, np.int64)
    ignore = np.zeros((count, patches), bool)
    boxes = np.zeros((count, patches, 4), np.float32)
    box_taught = np.zeros((count, patches), bool)
    middle = (np.stack(np.meshgrid(np.arange(grid), np.arange(grid)), axis=-1).reshape(-1, 2) + 0.5) / grid
    for frame, objects in enumerate(rows):
        if centres is not None:
            middle = centres[frame]
        sizes = objects[:, 3:5] - objects[:, 1:3]
        taught = objects[:, 5] >= min_area
        for k in np.argsort(sizes.prod(axis=1), kind='stable'):
            centre, size = (objects[k, 1:3] + objects[k, 3:5]) / 2, sizes[k]
            offset = np.abs(middle - centre)
            near = (offset <= np.maximum(DENSE_REACH / grid, size / 4)).all(axis=1)
            # The patch the centre lies in always (on a custom layout, the one whose centre is nearest).
            row, col = (min(int(v * grid), grid - 1) for v in centre[::-1])
            near[row * grid + col if centres is None else np.argmin(np.hypot(*offset.T))] = True
            free = classes[frame] < 0
            if not taught[k]:
                ignore[frame, near & free] = True
                continue
            mine = near & free
            if not free.any():
                continue  # every patch answers a smaller object already: this one is left untaught
            if not mine.any():
                mine[np.flatnonzero(free)[np.argmin(np.hypot(*offset[free].T))]] = True
            classes[frame, mine] = int(objects[k, 0])
            ignore[frame, mine] = False
            ring = (offset <= np.maximum(DENSE_BOX_REACH / grid, size / 2 + 0.5 / grid)).all(axis=1)
            box = mine | (ring & free & ~box_taught[frame])
            boxes[frame, box] = np.concatenate([centre, size])
            box_taught[frame, box] = True
    return classes, ignore, boxes, box_taught


def _corners(box: Any) -> Any:
    import torch

    return torch.cat([box[..., :2] - box[..., 2:] / 2, box[..., :2] + box[..., 2:] / 2], dim=-1)


def _generalised_iou(a: Any, b: Any) -> Any:
    """Generalised IoU of matching rows of two (N, 4) centre-size box tensors."""
    import torch

    a, b = _corners(a), _corners(b)
    low, high = torch.maximum(a[:, :2], b[:, :2]), torch.minimum(a[:, 2:], b[:, 2:])
    overlap = (high - low).clamp(min=0).prod(dim=1)
    area_a, area_b = (a[:, 2:] - a[:, :2]).prod(dim=1), (b[:, 2:] - b[:, :2]).prod(dim=1)
    union = area_a + area_b - overlap
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).prod(dim=1)
    return overlap / union.clamp(min=1e-9) - (hull - union) / hull.clamp(min=1e-9)


def detection_loss(
    logits: Any,
    predicted: Any,
    classes: np.ndarray,
    ignore: np.ndarray,
    boxes: np.ndarray,
    box_taught: np.ndarray | None = None,
) -> tuple[Any, Any, Any, Any]:
    """The detection losses on the slots given their objects (`slot_targets`): sigmoid cross-entropy of
    every slot and class (slots left out excepted), and on the slots with an object, L1 on its box's
    centre and size and 1 - generalised IoU; each summed and divided by the number of objects.

    Args:
        box_taught: per frame and slot, whether its box is taught (`boxes` holds it); None: the slots
            with an object. The box terms are then divided by the number of such slots.

    Returns:
        (loss, classes, l1, giou) tensors: the weighted sum and its three terms.
    """
    import torch
    from torch.nn import functional

    labels = torch.from_numpy(classes).to(logits.device)
    target = functional.one_hot(labels.clamp(min=0), logits.shape[-1]).float() * (labels >= 0)[..., None]
    weight = torch.from_numpy(~ignore).float().to(logits.device)[..., None]
    objects = max(1, int((classes >= 0).sum()))
    entropy = functional.binary_cross_entropy_with_logits(
        logits.float(), target, weight=weight.expand_as(logits), reduction='sum'
    )
    chosen = labels >= 0 if box_taught is None else torch.from_numpy(box_taught).to(predicted.device)
    taught = objects if box_taught is None else max(1, int(box_taught.sum()))
    truth = torch.from_numpy(boxes).to(predicted.device)[chosen]
    l1 = functional.l1_loss(predicted[chosen].float(), truth, reduction='sum') / taught
    giou = (1 - _generalised_iou(predicted[chosen].float(), truth)).sum() / taught
    entropy = entropy / objects
    return CLASS_WEIGHT * entropy + L1_WEIGHT * l1 + GIOU_WEIGHT * giou, entropy, l1, giou
