"""The demo models' data: rendered synthetic scenes with their ground truth, cached on disk."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.demo.config import ENVIRONMENTS, HELDOUT_SEED, TrainingConfig
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'SceneSet',
    'datasets',
    'demo_truth',
    'detector_datasets',
    'heldout_set',
    'render_scenes',
    'resize_square',
]


@dataclass
class SceneSet:
    """Rendered frames with their ground truth.

    Attributes:
        frames: full-size RGB frames (kept for the held-out set, which is judged through the backends).
        small: frames resized to the model input size exactly as the processors do, (N, S, S, 3) uint8.
        counts: per-class object counts, (N, len(CLASSES)) int (after the labelling rule, if any).
        captions: Table 1 answers from the same ground truth.
        density / coverage: per patch cell and class, object centres and covered fraction.
        generator_counts: per-class counts under the scene generator's own rule (every object it
            calls visible, however small in the model input); equal to `counts` without a rule.
        environments: the environment of each frame ('pool', 'shallow', 'deep').
        mid: frames resized to a 16:9 size between the render and the model input, (N, h, w, 3)
            uint8, for augmenting with the metamorphic relations in the footage's aspect (training
            only; None when not rendered).
        boxes: per frame, its ground-truth objects (after the labelling rule, if any) as a (k, 6)
            float32 array: class index (of CLASSES), x0, y0, x1, y1 as fractions of the frame's width
            and height, and the fraction of the frame the object's visible pixels cover.
    """

    frames: list[np.ndarray]
    small: np.ndarray
    counts: np.ndarray
    captions: list[str]
    density: np.ndarray | None = None
    coverage: np.ndarray | None = None
    generator_counts: np.ndarray | None = None
    environments: list[str] | None = None
    mid: np.ndarray | None = None
    boxes: list[np.ndarray] | None = None


def demo_truth(truth: Any, image_size: int, min_pixels: int) -> Any:
    """The ground truth under a labelling rule: the generator's, less the objects whose visible
    part covers fewer than `min_pixels` pixels once the frame is resized to the model input.

    The generator's own rule is set for full-resolution footage and keeps objects down to 0.04 % of
    the frame, a 3x3 speck in a 128x128 input. Each box's 'area' (the fraction of the frame its
    visible pixels cover) gives its size in the input: the processors squash the frame to a square.
    """
    if min_pixels <= 0:
        return truth
    boxes = [b for b in truth.boxes if b['area'] * image_size * image_size >= min_pixels]
    counts = dict.fromkeys(truth.counts, 0)
    kind_counts = dict.fromkeys(truth.kind_counts, 0)
    for box in boxes:
        counts[box['class']] += 1
        kind_counts[box['kind']] += 1
    return replace(truth, counts=counts, kind_counts=kind_counts, boxes=boxes)


def _coverage(labels: np.ndarray, truth: Any, grid: int) -> np.ndarray:
    """Per patch cell of the model input, the fraction of its pixels showing each class.

    Only objects in the ground truth count (what the visibility rule calls visible); `labels` is the
    generator's object-id map, squashed to the square grid as the processors squash the frame.
    """
    import cv2

    cells = np.zeros((grid, grid, len(CLASSES)), np.float32)
    for index, cls in enumerate(CLASSES):
        ids = [box['id'] for box in truth.boxes if box['class'] == cls]
        if ids:
            mask = np.isin(labels, ids).astype(np.float32)
            cells[..., index] = cv2.resize(mask, (grid, grid), interpolation=cv2.INTER_AREA)
    return cells


def _density(truth: Any, width: int, height: int, grid: int) -> np.ndarray:
    """Per patch cell of the model input, the number of visible objects of each class centred there."""
    cells = np.zeros((grid, grid, len(CLASSES)), np.float32)
    for box in truth.boxes:
        x0, y0, x1, y1 = box['box']
        # The processors squash the frame to a square, so cells are frame fractions on both axes.
        col = min(grid - 1, int((x0 + x1) / 2 / width * grid))
        row = min(grid - 1, int((y0 + y1) / 2 / height * grid))
        cells[row, col, CLASSES.index(box['class'])] += 1
    return cells


def _box_rows(truth: Any, width: int, height: int) -> np.ndarray:
    """A frame's ground truth as SceneSet.boxes rows: class, x0, y0, x1, y1 (frame fractions), area."""
    rows = [
        [CLASSES.index(b['class']), b['box'][0] / width, b['box'][1] / height, b['box'][2] / width]
        + [b['box'][3] / height, b['area']]
        for b in truth.boxes
    ]
    return np.asarray(rows, np.float32).reshape(-1, 6)


def resize_square(frame: np.ndarray, size: int) -> np.ndarray:
    """Resize as the CLIP and BLIP image processors do (PIL bicubic to a square, no crop)."""
    from PIL import Image

    return np.asarray(Image.fromarray(frame).resize((size, size), Image.BICUBIC))


def _render_scene(job: tuple) -> tuple[list, ...]:
    """Render `count` frames of one scene, 3 s apart: full frames, resized, counts, captions, maps."""
    import cv2

    from metavlm_ros.footage.scenes import SceneGenerator
    from metavlm_ros.footage.truth import caption

    seed, width, height, environment, count, image_size, keep, grid, min_pixels, mid_size = job
    generator = SceneGenerator(width, height, 10, seed, environment=environment)
    frames, small, counts, captions, density, coverage, generator_counts = [], [], [], [], [], [], []
    mid, boxes = [], []
    for k in range(count):
        rgb, full_truth, labels = generator.render(k * 30)
        truth = demo_truth(full_truth, image_size, min_pixels)
        if keep:
            frames.append(rgb)
        if mid_size is not None:
            same = tuple(mid_size) == (width, height)
            mid.append(rgb if same else cv2.resize(rgb, tuple(mid_size), interpolation=cv2.INTER_AREA))
        small.append(resize_square(rgb, image_size))
        generator_counts.append([int(full_truth.counts.get(c, 0)) for c in CLASSES])
        counts.append([int(truth.counts.get(c, 0)) for c in CLASSES])
        captions.append(caption(truth))
        density.append(_density(truth, width, height, grid))
        coverage.append(_coverage(labels, truth, grid))
        boxes.append(_box_rows(truth, width, height))
    environments = [environment] * count
    return frames, small, counts, captions, density, coverage, generator_counts, environments, mid, boxes


def render_scenes(
    n_frames: int,
    seed: int,
    *,
    frames_per_scene: int = 10,
    sizes: Sequence[tuple[int, int]] = ((384, 216),),
    image_size: int = 128,
    keep_frames: bool = False,
    workers: int = 1,
    grid: int = 8,
    min_input_pixels: int = 0,
    mid_size: tuple[int, int] | None = None,
) -> SceneSet:
    """Render synthetic scenes and their Table 1 captions.

    Scene j uses seed `seed + j`, environment ENVIRONMENTS[j % 3] and size sizes[j % len(sizes)]; it
    contributes `frames_per_scene` frames 3 s apart, so the camera and the objects have moved. The
    result does not depend on `workers`.

    Args:
        n_frames: number of frames.
        seed: seed of the first scene.
        frames_per_scene: frames taken from each scene.
        sizes: (width, height) of the rendered frames, cycled over scenes.
        image_size: side of the resized copies in `small`.
        keep_frames: keep the full-size frames (memory: width*height*3 bytes each).
        workers: processes rendering scenes in parallel.
        grid: side of the per-class maps in `density` and `coverage` (the models' patch grid).
        min_input_pixels: a labelling rule (see demo_truth); 0: the generator's ground truth.
        mid_size: (width, height) of the `mid` copies kept for augmentation; None: none kept.

    Returns:
        The SceneSet.
    """
    jobs = []
    for j in range(math.ceil(n_frames / frames_per_scene)):
        width, height = sizes[j % len(sizes)]
        count = min(frames_per_scene, n_frames - j * frames_per_scene)
        environment = ENVIRONMENTS[j % len(ENVIRONMENTS)]
        jobs.append(
            (seed + j, width, height, environment, count, image_size, keep_frames, grid, min_input_pixels)
            + (mid_size,)
        )
    if workers > 1:
        from multiprocessing import get_context

        with get_context('spawn').Pool(workers) as pool:
            parts = pool.map(_render_scene, jobs, chunksize=4)
    else:
        parts = [_render_scene(job) for job in jobs]
    frames = [f for part in parts for f in part[0]]
    small = np.stack([f for part in parts for f in part[1]])
    counts = np.asarray([c for part in parts for c in part[2]], np.int64)
    captions = [c for part in parts for c in part[3]]
    density = np.stack([d for part in parts for d in part[4]])
    coverage = np.stack([c for part in parts for c in part[5]])
    generator_counts = np.asarray([c for part in parts for c in part[6]], np.int64)
    environments = [e for part in parts for e in part[7]]
    mid = np.stack([m for part in parts for m in part[8]]) if mid_size is not None else None
    boxes = [b for part in parts for b in part[9]]
    return SceneSet(
        frames, small, counts, captions, density, coverage, generator_counts, environments, mid, boxes
    )


def heldout_set(
    n_frames: int = 300,
    *,
    size: tuple[int, int] = (384, 216),
    image_size: int = 128,
    workers: int = 1,
    min_input_pixels: int = 0,
) -> SceneSet:
    """The fixed held-out set: scenes from HELDOUT_SEED, one size, full frames kept.

    `min_input_pixels` applies a labelling rule to `counts` (see demo_truth); `generator_counts`
    always holds the scene generator's own.

    The first n frames of a larger held-out set are the same frames, so a test may judge a prefix.
    """
    return render_scenes(
        n_frames,
        HELDOUT_SEED,
        frames_per_scene=3,
        sizes=(size,),
        image_size=image_size,
        keep_frames=True,
        workers=workers,
        min_input_pixels=min_input_pixels,
    )


def _cached_scenes(cache: Path | None, key: dict, render: Callable[[], SceneSet]) -> SceneSet:
    """Render once per key; later runs with the same key load the arrays from `cache`."""
    if cache is None:
        return render()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    path = cache / f'scenes-{digest}.npz'
    if path.is_file():
        data = np.load(path, allow_pickle=False)
        frames = list(data['frames']) if 'frames' in data else []
        optional = {
            name: data[name] if name in data else None
            for name in ('density', 'coverage', 'generator_counts', 'mid')
        }
        captions = [str(c) for c in data['captions']]
        environments = [str(e) for e in data['environments']] if 'environments' in data else None
        boxes = None
        if 'box_rows' in data:
            # Stored as one (M, 6) array and each frame's number of rows (an npz holds no ragged list).
            boxes = np.split(data['box_rows'], np.cumsum(data['box_counts'])[:-1])
        return SceneSet(
            frames,
            data['small'],
            data['counts'],
            captions,
            **optional,
            environments=environments,
            boxes=boxes,
        )
    scenes = render()
    cache.mkdir(parents=True, exist_ok=True)
    arrays = {'small': scenes.small, 'counts': scenes.counts, 'captions': np.asarray(scenes.captions)}
    if scenes.environments is not None:
        arrays['environments'] = np.asarray(scenes.environments)
    for name in ('density', 'coverage', 'generator_counts', 'mid'):
        if getattr(scenes, name) is not None:
            arrays[name] = getattr(scenes, name)
    if scenes.boxes is not None:
        arrays['box_rows'] = np.concatenate([np.zeros((0, 6), np.float32), *scenes.boxes])
        arrays['box_counts'] = np.asarray([len(b) for b in scenes.boxes], np.int64)
    if scenes.frames:
        arrays['frames'] = np.stack(scenes.frames)
    np.savez(path.with_suffix('.tmp.npz'), **arrays)
    path.with_suffix('.tmp.npz').replace(path)
    return scenes


def datasets(
    config: TrainingConfig, *, cache: Path | None = None, log: Callable[[str], None] = print
) -> tuple[SceneSet, SceneSet]:
    """Render (or load from `cache`) the training set and the held-out set of a config."""
    train_key = {
        'set': 'train',
        'n': config.train_frames,
        'seed': config.seed,
        'per_scene': config.frames_per_scene,
        'sizes': config.scene_sizes,
        'image_size': config.image_size,
        'density_grid': config.image_size // config.patch_size,
        'maps': ['density', 'coverage'],
        'min_input_pixels': config.min_input_pixels,
    }
    if config.augment:
        train_key['mid'] = list(config.augment_size)
    log(f'rendering {config.train_frames} training frames ...')
    train = _cached_scenes(
        cache,
        train_key,
        lambda: render_scenes(
            config.train_frames,
            config.seed * 100_000,
            frames_per_scene=config.frames_per_scene,
            sizes=config.scene_sizes,
            image_size=config.image_size,
            workers=config.workers,
            grid=config.image_size // config.patch_size,
            min_input_pixels=config.min_input_pixels,
            mid_size=config.augment_size if config.augment else None,
        ),
    )
    log(f'rendering {config.heldout_frames} held-out frames ...')
    held_key = {
        'set': 'heldout',
        'n': config.heldout_frames,
        'image_size': config.image_size,
        'min_input_pixels': config.min_input_pixels,
    }
    heldout = _cached_scenes(
        cache,
        held_key,
        lambda: heldout_set(
            config.heldout_frames,
            image_size=config.image_size,
            workers=config.workers,
            min_input_pixels=config.min_input_pixels,
        ),
    )
    return train, heldout


def detector_datasets(
    config: TrainingConfig, *, cache: Path | None = None, log: Callable[[str], None] = print
) -> tuple[SceneSet, SceneSet]:
    """Render (or load from `cache`) the demo detector's training set and the held-out set, with boxes.

    The training scenes are the first of the CLIP's (seeds from `config.seed * 100000`), each giving
    `detector_frames_per_scene` frames; the held-out set is the fixed one (`heldout_set`) under the
    scene generator's own ground truth.
    """
    augment = config.detector_augment > 0
    train_key = {
        'set': 'detector-train',
        'n': config.detector_train_frames,
        'seed': config.seed,
        'per_scene': config.detector_frames_per_scene,
        'sizes': config.scene_sizes,
        'image_size': config.detector_image_size,
        'mid': list(config.augment_size) if augment else None,
        'boxes': 1,
    }
    log(f'rendering {config.detector_train_frames} detector training frames ...')
    train = _cached_scenes(
        cache,
        train_key,
        lambda: render_scenes(
            config.detector_train_frames,
            config.seed * 100_000,
            frames_per_scene=config.detector_frames_per_scene,
            sizes=config.scene_sizes,
            image_size=config.detector_image_size,
            workers=config.workers,
            grid=config.detector_image_size // config.patch_size,
            mid_size=config.augment_size if augment else None,
        ),
    )
    log(f'rendering {config.heldout_frames} held-out frames ...')
    held_key = {
        'set': 'heldout',
        'n': config.heldout_frames,
        'image_size': config.detector_image_size,
        'boxes': 1,
    }
    heldout = _cached_scenes(
        cache,
        held_key,
        lambda: heldout_set(
            config.heldout_frames, image_size=config.detector_image_size, workers=config.workers
        ),
    )
    return train, heldout
