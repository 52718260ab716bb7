"""Drawing the kinds of object (footage/drawing.py, footage/sprites.py): every kind draws, the same way
for the same look; the pixels of whole scenes are pinned by test_scenes_golden.py."""

import numpy as np
import pytest

from metavlm_ros.footage.drawing import Pen
from metavlm_ros.footage.sprites import SPRITES, random_params
from metavlm_ros.footage.truth import KIND_CLASS


def _drawn(kind: str, seed: int, t: float = 0.4) -> Pen:
    params = random_params(kind, np.random.default_rng(seed))
    pen = Pen(240, 240, 120.0, 120.0, 80.0, 0.3, 1.0)
    SPRITES[kind].draw(pen, params, t)
    return pen


def test_every_kind_of_the_ground_truth_has_a_sprite():
    assert set(SPRITES) == set(KIND_CLASS)


@pytest.mark.parametrize('kind', sorted(SPRITES))
def test_each_kind_draws_something_and_the_same_look_draws_the_same_pixels(kind):
    pen = _drawn(kind, seed=3)
    assert np.count_nonzero(pen.alpha) > 50
    # Colour only where the mask is: the scene composites the colour through the mask.
    assert not pen.rgb[pen.alpha == 0].any()
    again = _drawn(kind, seed=3)
    assert np.array_equal(pen.rgb, again.rgb) and np.array_equal(pen.alpha, again.alpha)
