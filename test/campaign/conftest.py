"""Fixtures of the campaign tests: a folder of two images, the fixed campaign's report (once per module)."""

import cv2
import pytest

from metavlm_ros.campaign.report import build_report
from test.campaign.campaign_results import FIXTURE
from test.conftest import make_frame


@pytest.fixture(scope='module')
def report():
    return build_report(FIXTURE)


@pytest.fixture
def image_dir(tmp_path):
    folder = tmp_path / 'images'
    folder.mkdir()
    for i in range(2):
        cv2.imwrite(str(folder / f'img{i}.png'), cv2.cvtColor(make_frame(48, 36, seed=i), cv2.COLOR_RGB2BGR))
    return folder
