"""A stand-in model with planted failure modes, and the synthetic frames it is searched on."""

from __future__ import annotations

import math

import numpy as np

from metavlm_ros.method.prediction import Prediction, VLMBackend
from test.conftest import make_frame

CLASSES = ('animal', 'vegetation', 'object', 'trash')
#: What the model answers when nothing planted fires.
BASE = {'animal': 0.3, 'vegetation': 0.5, 'object': 0.5, 'trash': 0.6}
#: The planted modes: (a) trash drops by DROP when the follow-up is rotated by more than
#: ROTATION_DEG (counter-clockwise, the rotation relation's + sign) and the source frame is dark;
#: (b) animal rises by RISE when the frame was downsampled below DOWNSAMPLING_SCALE.
ROTATION_DEG = 2.0
DOWNSAMPLING_SCALE = 0.95
DROP = RISE = 0.2
#: Source frames: make_frame scaled towards black (dark), as made, or towards white (bright).
LIGHTS = {'dark': 0.3, 'normal': 1.0, 'bright': -0.5}
DARK_BELOW = 0.33  # mean grey level (0..1) of the follow-up's non-black pixels: dark sources lie below
WIDTH, HEIGHT = 160, 120
_MARKER = np.array((255, 0, 255), np.uint8)
_MARKER_X = 0.35  # markers at the centre row, this share of the width left and right of the centre


def planted_frame(seed: int, light: str) -> np.ndarray:
    """A make_frame, darkened or brightened, with sensor noise and two magenta markers on its centre row.

    The markers give the rotation (the tilt of the line through them: shear moves both alike, zoom
    and translation keep the tilt); the noise makes every row differ from the next, so the rows that
    nearest-neighbour downsampling repeats show.
    """
    frame = make_frame(WIDTH, HEIGHT, seed=seed).astype(np.float32)
    factor = LIGHTS[light]
    frame = frame * factor if factor > 0 else 255 - (255 - frame) * -factor
    noise = np.random.default_rng(100 + seed).normal(0, 12, frame.shape)
    frame = np.clip(frame + noise, 0, 255).astype(np.uint8)
    cy, half = HEIGHT // 2, 3
    for cx in (round(WIDTH / 2 - _MARKER_X * WIDTH), round(WIDTH / 2 + _MARKER_X * WIDTH)):
        frame[cy - half : cy + half, cx - half : cx + half] = _MARKER
    return frame


def rotation_deg(frame: np.ndarray) -> float:
    """The tilt of the line through the two markers, in degrees (0 when a marker is not found)."""
    band = slice(frame.shape[0] // 2 - 15, frame.shape[0] // 2 + 15)  # where rotation and zoom leave them
    red, green, blue = (frame[band, :, k].astype(np.int16) for k in range(3))
    ys, xs = np.nonzero((red > 180) & (blue > 180) & (green < 80))
    middle = frame.shape[1] / 2
    left, right = xs < middle, xs >= middle
    if left.sum() < 4 or right.sum() < 4:
        return 0.0
    dy = ys[right].mean() - ys[left].mean()
    dx = xs[right].mean() - xs[left].mean()
    return -math.degrees(math.atan2(dy, dx))


def repeated_rows(frame: np.ndarray) -> int:
    """How many rows repeat the one above exactly (black rows aside: a zoom-out's border)."""
    lit = frame.max(axis=(1, 2)) > 0
    same = np.all(frame[1:] == frame[:-1], axis=(1, 2))
    return int(np.sum(same & lit[1:] & lit[:-1]))


def brightness(frame: np.ndarray) -> float:
    lit = frame.max(axis=2) > 0
    return float(frame[lit].mean()) / 255 if lit.any() else 0.0


#: Downsampling by s repeats about HEIGHT - int(HEIGHT * s) rows, 6 at s 0.95: the double fires on
#: more, which it sees from about s 0.947 down (rows are 1/120 of a scale apart; a repeat can fall
#: on a row it leaves aside).
_REPEATS = HEIGHT - int(HEIGHT * DOWNSAMPLING_SCALE)


class PlantedBackend(VLMBackend):
    """A confidence-type model that answers BASE, except under the two planted conditions.

    Stateless: each answer is a function of the frame it is given, and each condition a function of
    the follow-up's pixels and of the source (its darkness survives every relation).
    """

    kind = 'confidence'
    name = 'fake-planted'
    model_id = 'fake-planted'
    classes = CLASSES

    def predict(self, frames):
        out = []
        for frame in frames:
            values = dict(BASE)
            if rotation_deg(frame) > ROTATION_DEG and brightness(frame) < DARK_BELOW:
                values['trash'] -= DROP
            if repeated_rows(frame) > _REPEATS:
                values['animal'] += RISE
            out.append(Prediction(kind='confidence', values=values))
        return out
