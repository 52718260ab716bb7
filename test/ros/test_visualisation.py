"""The side-by-side violation image (ros/visualisation.py): its layout and its labels."""

import numpy as np

from metavlm_ros.ros.visualisation import format_change, violation_image
from test.conftest import make_frame


def test_violation_image_layout_and_labels():
    source = make_frame(80, 60, seed=1)
    followup = np.zeros((30, 40, 3), np.uint8)
    picture = violation_image(
        source, followup, '{2}', {'animal': 0.2, 'trash': 0.1}, {'animal': 0.25, 'trash': 0.1}, height=60
    )
    assert picture.dtype == np.uint8 and picture.ndim == 3
    assert picture.shape[1] == 80 + 4 + 80  # the follow-up is brought to the source's height
    assert format_change('animal', 0.2, 0.25, 'confidence') == 'animal 0.200 -> 0.250 (+0.050)'
    assert format_change('animal', 2, 0, 'count') == 'animal 2 -> 0 (-2)'
