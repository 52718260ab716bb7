"""Fixtures of the bag tests: one scene and its mcap bag, written once per module."""

import pytest

from metavlm_ros.footage.bag_writer import write_bag
from metavlm_ros.footage.scenes import SceneGenerator
from test.footage.bag_helpers import FPS, N


@pytest.fixture(scope='module')
def scene():
    gen = SceneGenerator(64, 48, FPS, seed=21, environment='shallow', frames=N)
    return [gen.frame(i) for i in range(N)]


@pytest.fixture(scope='module')
def mcap_bag(tmp_path_factory, scene):
    return write_bag(tmp_path_factory.mktemp('bags') / 'demo', scene, fps=FPS)
