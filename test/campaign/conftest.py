"""Fixtures of the campaign tests: a folder of two images, the fixed campaign's report (once per module)."""

import pytest

from metavlm_ros.campaign.report import build_report
from test.campaign.campaign_results import FIXTURE
from test.conftest import write_frames


@pytest.fixture(scope='module')
def report():
    return build_report(FIXTURE)


@pytest.fixture
def image_dir(tmp_path):
    return write_frames(tmp_path / 'images', 2, 48, 36, stem='img')
