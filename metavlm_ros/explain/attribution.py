"""Attribution maps: where on a frame a model's score of a class came from, by gradients or occlusion."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import Prediction, VLMBackend
from metavlm_ros.models.pixel_path import PixelPath

__all__ = [
    'GRID',
    'INTEGRATED_GRADIENTS',
    'METHODS',
    'MIN_CELLS',
    'OCCLUSION',
    'AttributionMap',
    'ExampleMaps',
    'MapSettings',
    'Maps',
    'class_index',
    'difference_figures',
    'gradient_map',
    'mass_figures',
    'occlusion_grid',
    'occlusion_map',
    'pixel_scorer',
]

#: How maps are made: 'auto' takes gradients where the backend has them here, occlusion elsewhere.
METHODS = ('auto', 'gradients', 'occlusion')
#: The methods as records name them.
INTEGRATED_GRADIENTS = 'integrated_gradients'
OCCLUSION = 'occlusion'
#: The coarse grid (rows = columns) each map's mass is summarised on: coarse enough to name a region
#: of the frame, fine enough to tell a quadrant's half.
GRID = 4
#: The fewest cells an occlusion map is made of (2 x 2): it costs these frames and the frame itself.
MIN_CELLS = 4
#: Frame bytes (float32) one batch of integrated-gradients steps may hold with their gradients: a
#: 640 x 480 frame goes 36 steps at a time, a 4K one a step at a time (bounded memory on a robot).
_BATCH_BYTES = 2**28


@dataclass(frozen=True)
class MapSettings:
    """How attribution maps are made (docs/explain.md says why each value).

    Attributes:
        method: 'auto', 'gradients' or 'occlusion' (METHODS).
        steps: Integrated gradients' steps from the baseline to the frame (each a forward and a
            backward pass).
        budget: The most frames occlusion may have the model judge, over all maps together (for a
            served model, each frame one or more requests).
    """

    method: str = 'auto'
    #: On the demo CLIP's planted frames (test/explain/planted.py) the completeness gap is under
    #: 0.05 % of the score's rise at 32 steps, about 1 % at 16 and 5 to 25 % at 4 to 8.
    steps: int = 32
    #: Enough for a 6 x 10 grid on each of a full catalogue's maps (8 modes, 16 maps, 62 frames each).
    budget: int = 1000


@dataclass(frozen=True, eq=False)  # arrays: compared by identity, never by value
class AttributionMap:
    """Where a model's score of one class on one frame came from: each pixel's share of the mass.

    Attributes:
        mass: (H, W), non-negative, summing to 1; all zero when nothing on the frame moved the score.
        method: INTEGRATED_GRADIENTS or OCCLUSION.
        cls: The class attributed.
        score: The model's score of `cls` on the frame (a confidence; a count; for detections, the
            sum of the class's boxes' scores).
        frames_judged: Frames the model judged for the map (integrated gradients: forward and
            backward passes; occlusion: occluded frames and the frame itself).
        model_calls: The calls those frames took (batches).
        detail: The method's own figures: steps, baseline score and completeness gap; or the grid's
            rows and columns and its failed cells.
    """

    mass: np.ndarray
    method: str
    cls: str
    score: float
    frames_judged: int
    model_calls: int
    detail: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The map's numbers for modes.json: how it was made, and where its mass lies (`mass_figures`)."""
        return {
            'method': self.method,
            'class': self.cls,
            'score': _finite(self.score),
            'frames_judged': self.frames_judged,
            'model_calls': self.model_calls,
            **self.detail,
            **mass_figures(self.mass),
        }


@dataclass(frozen=True, eq=False)
class ExampleMaps:
    """The maps of one mode's example: its class's attribution on the source and on the follow-up."""

    example: dict
    source_frame: np.ndarray
    followup_frame: np.ndarray
    source: AttributionMap
    followup: AttributionMap

    @property
    def difference(self) -> np.ndarray:
        """Follow-up mass minus source mass, pixel by pixel: + where the model looks more after."""
        return self.followup.mass - self.source.mass

    def as_record(self) -> dict:
        """The numbers of both maps and their difference, and the scores the evidence recorded."""
        cls = self.source.cls
        recorded = {
            side: _finite((self.example.get(side) or {}).get(cls)) for side in ('source', 'followup')
        }  # fmt: skip
        return {
            'method': self.source.method,
            'class': cls,
            'recorded': recorded,
            'source': self.source.summary(),
            'followup': self.followup.summary(),
            'difference': difference_figures(self.source.mass, self.followup.mass),
            'frames_judged': self.source.frames_judged + self.followup.frames_judged,
        }


@dataclass
class Maps:
    """The attribution maps of a catalogue's modes by rank, how they were made and what they cost."""

    settings: MapSettings
    method: str
    backend: str
    model: str
    by_rank: dict[int, ExampleMaps]
    notes: list[str] = field(default_factory=list)

    @property
    def frames_judged(self) -> int:
        return sum(m.source.frames_judged + m.followup.frames_judged for m in self.by_rank.values())


# --- the numbers behind a map ----------------------------------------------------------------------


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _bounds(length: int, parts: int) -> list[int]:
    return [round(length * k / parts) for k in range(parts + 1)]


def _cells(values: np.ndarray, rows: int, cols: int) -> np.ndarray:
    ys, xs = _bounds(values.shape[0], rows), _bounds(values.shape[1], cols)
    return np.array(
        [[values[ys[r] : ys[r + 1], xs[c] : xs[c + 1]].sum() for c in range(cols)] for r in range(rows)]
    )


def _cell(shares: np.ndarray, index: int) -> dict:
    row, col = divmod(int(index), shares.shape[1])
    return {'row': row, 'col': col, 'share': float(shares[row, col])}


def mass_figures(mass: np.ndarray) -> dict:
    """Where a map's mass lies: on a GRID x GRID grid, its top cell, centroid and spread.

    Returns:
        `grid`: each cell's share of the mass (rows top to bottom, columns left to right); `top_cell`:
        the cell holding most (`row`, `col` from 0, `share`); `centroid`: the mass's centre as
        shares of the width and height; `area_50`: the least share of the frame's pixels that holds
        half the mass (small: the model looked at one place; near 0.5: everywhere alike). The
        figures are null for a map without mass.
    """
    total = float(mass.sum())
    if not total > 0:
        return {'grid': None, 'top_cell': None, 'centroid': None, 'area_50': None}
    shares = _cells(mass, GRID, GRID) / total
    height, width = mass.shape
    ys, xs = np.mgrid[0:height, 0:width]
    ordered = np.sort(mass, axis=None)[::-1].cumsum() / total
    return {
        'grid': shares.round(6).tolist(),
        'top_cell': _cell(shares, shares.argmax()),
        'centroid': [float((mass * (xs + 0.5)).sum() / total / width),
                     float((mass * (ys + 0.5)).sum() / total / height)],
        'area_50': float((np.searchsorted(ordered, 0.5) + 1) / mass.size),
    }  # fmt: skip


def difference_figures(source: np.ndarray, followup: np.ndarray) -> dict:
    """How the mass moved from the source's map to the follow-up's.

    Returns:
        `moved`: the share of the mass that lies elsewhere on the follow-up (half the L1 distance of
        the two maps: 0 the same places, 1 none in common; null when a map has no mass); `grid`: each
        GRID cell's follow-up share minus its source share; `top_gain` and `top_loss`: the cells whose
        share rose and fell most.
    """
    if not (source.sum() > 0 and followup.sum() > 0):
        return {'moved': None, 'grid': None, 'top_gain': None, 'top_loss': None}
    change = _cells(followup, GRID, GRID) / followup.sum() - _cells(source, GRID, GRID) / source.sum()
    return {
        'moved': float(0.5 * np.abs(followup / followup.sum() - source / source.sum()).sum()),
        'grid': change.round(6).tolist(),
        'top_gain': _cell(change, change.argmax()),
        'top_loss': _cell(change, change.argmin()),
    }


def _normalised(values: np.ndarray) -> np.ndarray:
    values = np.nan_to_num(np.abs(values.astype(np.float64)), nan=0.0, posinf=0.0)
    total = values.sum()
    return values / total if total > 0 else np.zeros_like(values)


# --- the two methods -------------------------------------------------------------------------------


def pixel_scorer(backend: VLMBackend) -> Callable[[Any], Any] | None:
    """The backend's class scores as a function of a frame's pixels that torch differentiates, or None.

    A backend may give its own `pixel_scores(pixels)`: frames as a float tensor (N, 3, H, W) of
    0..255 values in, scores (N, classes) out, or None where it has none (the detectors: each class's
    detection scores summed; BLIP and a counting chat VLM: their own answer's log-probability; a yes/no
    chat VLM: its confidences; LLaVA-1.5's and the Qwen families' processors among the chat VLMs'). An
    in-process contrastive backend (CLIP, SigLIP) gives `scores(image_inputs)`, which a frame's pixels
    reach through its processor's steps made differentiable (`PixelPath.differentiable_pixel_values`).
    Anything else has none here: a served model, a chat VLM whose processor tiles frames, SigLIP 2's
    NaFlex patches, a torchvision image processor but Qwen's (docs/explain.md has the table).
    """
    own = getattr(backend, 'pixel_scores', None)
    if callable(own):
        return own
    scores = getattr(backend, 'scores', None)
    path = PixelPath.from_processor(getattr(backend, 'processor', None))
    if backend.kind != 'confidence' or not callable(scores) or path is None:
        return None

    def from_pixels(pixels: Any) -> Any:
        values = path.differentiable_pixel_values(pixels.to(backend.device), backend.dtype)
        return scores({'pixel_values': values})

    return from_pixels


def class_index(backend: VLMBackend, cls: str) -> int:
    """Where `cls` lies among the backend's classes (its scores' column).

    Raises:
        ParameterError: The backend does not judge `cls`.
    """
    if cls not in backend.classes:
        raise ParameterError(
            f'class {cls!r}: the model judges {", ".join(backend.classes)}; give it the classes of the '
            'evidence (--classes)'
        )
    return list(backend.classes).index(cls)


def _tensor(frame: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None].float()


def _baseline(frame: np.ndarray) -> np.ndarray:
    # The frame's mean colour everywhere: its content gone, its light and colour cast kept, so a
    # dark or blue frame is not explained by being dark or blue.
    colour = frame.reshape(-1, 3).mean(axis=0).round().astype(np.uint8)
    return np.broadcast_to(colour, frame.shape).copy()


@dataclass
class _Counter:
    frames: int = 0
    calls: int = 0
    first: Any = None

    def add(self, frames: int, output: Any) -> None:
        if self.first is None:
            self.first = output
        self.frames += frames
        self.calls += 1


def gradient_map(backend: VLMBackend, frame: np.ndarray, cls: str, steps: int) -> AttributionMap:
    """The integrated gradients (captum) of the class's score in the frame's pixels.

    The path runs from the baseline (the frame's mean colour everywhere) to the frame in `steps`
    steps; a pixel's mass is the magnitude of its attribution, summed over its channels. The map's
    `detail` holds `completeness_gap`: the attributions' sum minus the score's rise from the baseline,
    near 0 when the steps were enough.

    Raises:
        ParameterError: The backend has no gradients here (`pixel_scorer`), or does not judge `cls`.
    """
    import torch
    from captum.attr import IntegratedGradients

    scorer = pixel_scorer(backend)
    if scorer is None:
        raise ParameterError(
            f'--map-method gradients: backend {backend.name} gives no gradients here; use occlusion'
        )
    index = class_index(backend, cls)
    counter = _Counter()

    def forward(pixels: Any) -> Any:
        out = scorer(pixels)[:, index].float()
        counter.add(len(pixels), out)
        return out

    inputs, baseline = _tensor(frame), _tensor(_baseline(frame))
    height, width = frame.shape[:2]
    batch = max(1, min(getattr(backend, 'batch_size', steps), _BATCH_BYTES // (2 * 12 * height * width)))
    with torch.no_grad():
        score, baseline_score = (float(v) for v in forward(torch.cat([inputs, baseline])))
    with torch.enable_grad():
        attributions = IntegratedGradients(forward).attribute(
            inputs, baselines=baseline, n_steps=steps, internal_batch_size=batch
        )
    attributions = attributions.detach().cpu().double()
    return AttributionMap(
        mass=_normalised(attributions[0].abs().sum(dim=0).numpy()),
        method=INTEGRATED_GRADIENTS,
        cls=cls,
        score=score,
        frames_judged=counter.frames,
        model_calls=counter.calls,
        detail={
            'steps': steps,
            'baseline_score': _finite(baseline_score),
            'completeness_gap': _finite(float(attributions.sum()) - (score - baseline_score)),
        },
    )


def occlusion_grid(frames: int, width: int, height: int) -> tuple[int, int]:
    """The rows and columns of the finest occlusion grid that `frames` judged frames pay for.

    A map costs one frame per cell and the frame itself. Of the grids within that, cells no more than
    twice as wide as high (or high as wide) are preferred, then more cells, then squarer ones.

    Raises:
        ParameterError: `frames` pays for fewer than MIN_CELLS cells.
    """
    cells = frames - 1
    if cells < MIN_CELLS:
        raise ParameterError(
            f'an occlusion map needs at least {MIN_CELLS + 1} frames judged (a 2 x 2 grid and the frame '
            f'itself), got {frames}'
        )
    best: tuple = ()
    for rows in range(1, min(cells, height) + 1):
        cols = min(cells // rows, width)
        skew = abs(math.log((width / cols) / (height / rows)))
        key = (skew <= math.log(2), rows * cols, -skew)
        best = max(best, (key, rows, cols)) if best else (key, rows, cols)
    return best[1], best[2]


def _score_of(prediction: Prediction, cls: str) -> float:
    if prediction.error:
        return math.nan
    if prediction.kind == 'detection':
        # A box's score falls before the box goes: their sum moves with every occluded cell.
        return float(sum(d.score for d in prediction.detections if d.cls == cls))
    value = prediction.values.get(cls)
    return float(value) if value is not None else math.nan


def occlusion_map(backend: VLMBackend, frame: np.ndarray, cls: str, frames: int) -> AttributionMap:
    """The class's score lost when each cell of a grid is occluded (captum's FeatureAblation).

    Calls only the backend's public `predict`, so any model works, a served one included. The grid
    is the finest `frames` judged frames pay for (`occlusion_grid`); each cell in turn takes the
    baseline (the frame's mean colour) and the model judges the frame; a cell's mass is the
    magnitude of the score's change, spread over its pixels. A cell whose frame got no readable
    answer has none, and `detail` counts it (`failed_cells`).

    Raises:
        ParameterError: `frames` pays for fewer than MIN_CELLS cells.
    """
    import torch
    from captum.attr import FeatureAblation

    class_index(backend, cls)
    height, width = frame.shape[:2]
    rows, cols = occlusion_grid(frames, width, height)
    ys, xs = _bounds(height, rows), _bounds(width, cols)
    cell = np.zeros((height, width), np.int64)
    for r in range(rows):
        for c in range(cols):
            cell[ys[r] : ys[r + 1], xs[c] : xs[c + 1]] = r * cols + c
    counter = _Counter()

    def forward(pixels: Any) -> Any:
        # The pixels are whole numbers (the frame's, or the baseline's): the frames judged are exact.
        batch = list(pixels.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())
        out = torch.tensor([_score_of(p, cls) for p in backend.predict(batch)], dtype=torch.float64)
        counter.add(len(batch), out)
        return out

    per_eval = max(1, min(getattr(backend, 'batch_size', 1), rows * cols))
    attributions = FeatureAblation(forward).attribute(
        _tensor(frame),
        baselines=_tensor(_baseline(frame)),
        feature_mask=torch.from_numpy(cell)[None, None],
        perturbations_per_eval=per_eval,
    )
    changes = attributions[0, 0].numpy()
    per_cell = np.array([changes[ys[r], xs[c]] for r in range(rows) for c in range(cols)])
    areas = np.bincount(cell.ravel(), minlength=rows * cols)
    density = np.nan_to_num(np.abs(per_cell), nan=0.0) / np.maximum(areas, 1)
    return AttributionMap(
        mass=_normalised(density[cell]),
        method=OCCLUSION,
        cls=cls,
        score=float(counter.first[0]) if counter.first is not None else math.nan,
        frames_judged=counter.frames,
        model_calls=counter.calls,
        detail={'rows': rows, 'cols': cols, 'failed_cells': int(np.isnan(per_cell).sum())},
    )
