"""Cells (campaign/cells.py): the campaign's images, its cells and their seeds."""

import numpy as np
import pytest

from metavlm_ros.campaign.cells import cell_seed, load_images, plan_cells
from metavlm_ros.campaign.config import parse_config
from metavlm_ros.common.errors import ParameterError
from test.campaign.configs import small_config


def test_cells_and_seeds(image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir)
    images = load_images(config.frames)
    assert [im.id for im in images] == ['img0', 'img1']
    cells = plan_cells(config, images)
    assert len(cells) == 1 * 2 * 2 * 2  # models x runs x images x algorithms
    assert len({c.id for c in cells}) == len(cells)
    # One seed per (model, run): both algorithms and all images of a run share it.
    expected = int(np.random.SeedSequence(5, spawn_key=(0, 1)).generate_state(1, dtype=np.uint32)[0])
    assert cell_seed(5, 0, 1) == expected
    assert {c.seed for c in cells if c.run == 1} == {expected}
    assert cell_seed(5, 0, 0) != expected and cell_seed(5, 1, 1) != expected


def test_ros1_bags_and_videos_are_campaign_sources(tmp_path, tiny_clip_dir):
    from metavlm_ros.footage.scenes import SceneGenerator
    from metavlm_ros.footage.video import write_video
    from test.footage.bag_helpers import stamps, write_ros1_scene

    scene = [SceneGenerator(64, 48, 5.0, seed=2, frames=5).frame(i) for i in range(5)]
    bag = write_ros1_scene(tmp_path / 'dive.bag', scene)
    video = write_video(tmp_path / 'dive.mkv', [rgb for rgb, _ in scene], fps=5.0)
    spec = {'sources': ['dive.bag', 'dive.mkv'], 'every': 2, 'start': 0.2}
    model = [{'backend': 'clip', 'model': str(tiny_clip_dir)}]
    images = load_images(parse_config({'frames': spec, 'models': model}, base_dir=tmp_path).frames)
    # Frames 1 and 3 of each, by the bag's stamps and the video's presentation times.
    s = stamps()
    assert [im.id for im in images] == [f'dive@{s[1]}', f'dive@{s[3]}', 'dive@200000000', 'dive@600000000']
    assert [(im.file, im.frame_index) for im in images] == [
        (str(bag), 1),
        (str(bag), 3),
        (str(video), 1),
        (str(video), 3),
    ]
    np.testing.assert_array_equal(images[0].rgb, scene[1][0])


def test_generated_scene_frames(tiny_clip_dir):
    spec = {'generate': {'count': 2, 'size': [64, 48], 'seed': 3}}
    config = parse_config({'frames': spec, 'models': [{'backend': 'clip', 'model': str(tiny_clip_dir)}]})
    images = load_images(config.frames)
    assert [im.id for im in images] == ['scene-003', 'scene-004']
    assert all(im.rgb.shape == (48, 64, 3) and im.rgb.dtype == np.uint8 for im in images)
    assert images[0].sha256 != images[1].sha256
    assert [im.sha256 for im in load_images(config.frames)] == [im.sha256 for im in images]  # deterministic
    with pytest.raises(ParameterError, match=r'frames.generate.size: must be \[width, height\]'):
        parse_config(
            {'frames': {'generate': {'size': [4, 4]}}, 'models': [{'backend': 'clip', 'model': '.'}]}
        )
