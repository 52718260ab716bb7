"""Training batches of the demo models: augmentation by the relations, pixels, losses, schedule."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from metavlm_ros.demo.config import TrainingConfig
from metavlm_ros.demo.scenes import SceneSet, resize_square
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'augmented_batch',
    'dense_loss',
    'distill_target',
    'lr_schedule',
    'normalised_pixels',
    'pad_rows',
    'paired_indices',
    'random_augmentation',
]


@functools.lru_cache(maxsize=8)
def _augmentation_space(magnitude: float) -> Any:
    """The paper's six relations, each range narrowed to `magnitude` of its maximum deviation around
    its nominal value, inside its own range (CLAHE upwards, downsampling downwards, the others either
    way)."""
    from metavlm_ros.method.encoding import SearchSpace
    from metavlm_ros.method.relations import PAPER_RELATIONS

    ranges = {
        r.id: (
            max(r.low, r.nominal - magnitude * r.max_deviation),
            min(r.high, r.nominal + magnitude * r.max_deviation),
        )
        for r in PAPER_RELATIONS
    }
    return SearchSpace.from_options(None, ranges)


def random_augmentation(rng: np.random.Generator, magnitude: float) -> Any:
    """A random composition of the paper's six relations at small magnitudes: one sample of the search's
    Rand (method/algorithms.py rand_genotypes) over their ranges narrowed to `magnitude`.

    The order k is uniform in 1..6, the k relations a uniform subset, and each parameter uniform within
    a fraction `magnitude` of the relation's maximum deviation from its nominal value, into its range.
    """
    from metavlm_ros.method.algorithms import rand_genotypes
    from metavlm_ros.method.encoding import decode

    space = _augmentation_space(float(magnitude))
    return decode(rand_genotypes(space, 1, rng)[0], space)


def paired_indices(
    rng: np.random.Generator, n: int, batch_size: int, pairs: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """A batch of `batch_size` frame indices whose last `pairs` repeat the first ones, and the mask
    of those repeats (to be transformed, for a consistency loss; None when `pairs` is 0).
    """
    idx = rng.choice(n, batch_size - pairs, replace=False)
    if not pairs:
        return idx, None
    idx = np.concatenate([idx, idx[:pairs]])
    return idx, np.arange(batch_size) >= batch_size - pairs


def augmented_batch(
    train: SceneSet,
    idx: np.ndarray,
    rng: np.random.Generator,
    config: TrainingConfig,
    always: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray]:
    """One batch of resized frames and their maps, some transformed by the relations, and flip flags.

    A fraction `config.augment` of the frames is transformed, and every frame `always` marks.

    A transformed frame's per-patch maps are moved by the same geometry (nearest cell), so the dense
    losses still point at the objects; its counts and caption do not change.
    """
    import cv2

    from metavlm_ros.method.relations import apply_composition, composition_matrix

    small = train.small[idx].copy()
    density = None if train.density is None else train.density[idx].copy()
    coverage = None if train.coverage is None else train.coverage[idx].copy()
    if config.augment and train.mid is not None:
        height, width = train.mid.shape[1:3]
        chosen = rng.random(len(idx)) < config.augment
        if always is not None:
            chosen |= always
        for j in np.flatnonzero(chosen):
            composition = random_augmentation(rng, config.augment_magnitude)
            small[j] = resize_square(apply_composition(train.mid[idx[j]], composition), config.image_size)
            # Where the relations move the pixels (method/relations.py's matrix fusion), as 3x3.
            moved = composition_matrix(composition, width, height)
            if moved is None:
                continue
            matrix = np.vstack([moved, [0.0, 0.0, 1.0]])
            for maps in (density, coverage):
                if maps is None:
                    continue
                grid = maps.shape[1]
                to_grid = np.diag([grid / width, grid / height, 1.0])
                cells = (to_grid @ matrix @ np.linalg.inv(to_grid))[:2]
                maps[j] = cv2.warpAffine(
                    maps[j], cells, (grid, grid), flags=cv2.INTER_NEAREST, borderValue=0
                ).reshape(maps[j].shape)
    flip = rng.random(len(idx)) < 0.5
    return small, density, coverage, flip


_MEAN = np.asarray([0.48145466, 0.4578275, 0.40821073], np.float32)
_STD = np.asarray([0.26862954, 0.26130258, 0.27577711], np.float32)


def normalised_pixels(
    small: np.ndarray, flip: np.ndarray | None = None, gain: np.ndarray | None = None
) -> Any:
    """Normalise resized uint8 images as the processors do (OpenAI CLIP mean and std).

    `flip` mirrors some frames left-right; `gain` scales brightness per frame (then clipped), which
    changes no label but keeps the models from reading presence off overall brightness.
    """
    import torch

    x = small.astype(np.float32) / 255.0
    if gain is not None:
        x = np.clip(x * gain[:, None, None, None], 0.0, 1.0)
    x = (x - _MEAN) / _STD
    if flip is not None:
        x[flip] = x[flip, :, ::-1]
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def lr_schedule(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


# A patch counts as showing a class when at least this fraction of its pixels does (a binary target:
# small objects give as strong a signal as large ones).
_COVERED = 0.005


def dense_loss(
    head: Any,
    tokens: Any,
    density: np.ndarray | None,
    coverage: np.ndarray | None,
    flip: np.ndarray,
    config: TrainingConfig,
) -> Any:
    """Dense losses on the vision tower's patch tokens: object centres and class coverage per patch.

    Dense supervision (every patch, every class) teaches a small ViT from scratch to find objects far
    faster than one label per frame. `head` maps a patch token to 2 x len(CLASSES) outputs: the
    expected number of object centres in the patch (Poisson loss; cell counts are also summed and
    compared with frame counts) and whether the patch shows each class (binary cross-entropy).
    Patch tokens follow the patch grid row by row, as the map cells do. Returns 0 when the data has
    no maps.
    """
    import torch
    from torch.nn import functional

    def cells(maps: np.ndarray) -> Any:
        maps = maps.copy()
        maps[flip] = maps[flip, :, ::-1]  # the frames were flipped left-right
        return torch.from_numpy(maps.reshape(len(maps), -1, maps.shape[-1]))

    out = head(tokens)
    loss = torch.zeros(())
    if density is not None and config.density_weight:
        target = cells(density)
        rate = functional.softplus(out[..., : len(CLASSES)])
        loss = loss + config.density_weight * (
            functional.poisson_nll_loss(rate, target, log_input=False)
            + functional.poisson_nll_loss(rate.sum(dim=1), target.sum(dim=1), log_input=False)
        )
    if coverage is not None and config.coverage_weight:
        covered = (cells(coverage) > _COVERED).float()
        loss = loss + config.coverage_weight * functional.binary_cross_entropy_with_logits(
            out[..., len(CLASSES) :], covered
        )
    return loss


def distill_target(cosine: Any, mean: Any, std: Any, config: TrainingConfig) -> Any:
    """The cosines a distilled CLIP should give: the starting CLIP's, standardised per prompt
    (`mean`, `std` over training frames) and mapped into the band, `band / 3` per standard
    deviation around the centre. Monotone per prompt, so each class keeps the starting CLIP's
    ranking of frames (and its ROC AUC)."""
    return config.clip_cosine_centre + (config.clip_cosine_band / 3) * (cosine - mean) / std


def pad_rows(rows: list[list[int]], pad: int) -> np.ndarray:
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad, np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
