"""Campaign cells store their source frames: every follow-up renders again; the PNG budget is no identity."""

import json

import cv2
import pytest

from metavlm_ros.campaign.cells import verify_cell
from metavlm_ros.campaign.config import parse_config
from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.cli import main
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.results import read_jsonl
from test.conftest import make_frame


def _config(tmp_path, model_dir, **overrides):
    folder = tmp_path / 'images'
    folder.mkdir(exist_ok=True)
    cv2.imwrite(str(folder / 'img0.png'), cv2.cvtColor(make_frame(48, 36, seed=0), cv2.COLOR_RGB2BGR))
    data = {
        'frames': {'sources': [str(folder)]},
        'models': [{'backend': 'clip', 'model': str(model_dir), 'name': 'tiny-clip', 'device': 'cpu'}],
        'algorithms': ['nsga2'],
        'runs': 1,
        'population': 6,
        'evaluations': 24,
        **overrides,
    }
    return parse_config(data, base_dir=tmp_path)


def test_a_cells_follow_ups_render_again_byte_for_byte(tmp_path, tiny_clip_dir):
    config = _config(tmp_path, tiny_clip_dir, pareto_pngs='all')
    assert config.search_config('nsga2', 0).pareto_pngs is None
    # The budget changes which PNGs exist, never a record: not part of the campaign's identity.
    assert config.fingerprint() == _config(tmp_path, tiny_clip_dir).fingerprint()
    run_campaign(config, tmp_path / 'out', progress=False, threads=1)
    (cell,) = (tmp_path / 'out' / 'cells').iterdir()
    assert verify_cell(cell) is None, 'the source frame is one of the cell files its checksums cover'
    assert json.loads((cell / 'cell.json').read_text())['files'].keys() >= {
        f'sources/{p.name}' for p in (cell / 'sources').iterdir()
    }
    (summary,) = read_jsonl(cell / 'summary.jsonl')
    assert summary['warp'] == 'sequential' and summary['pareto']
    assert main(['render', str(cell), 'pareto', '--out', str(tmp_path / 'again')]) == 0
    for p in read_jsonl(cell / 'pareto.jsonl'):
        name = f'{p["image"]}_nsga2_s{p["seed"]}_e{p["index"]:05d}.png'
        assert (tmp_path / 'again' / name).read_bytes() == (cell / p['frame']).read_bytes()


def test_the_campaign_budget_defaults_and_is_checked(tmp_path, tiny_clip_dir):
    assert _config(tmp_path, tiny_clip_dir).pareto_pngs == 3
    assert 'pareto_pngs' not in _config(tmp_path, tiny_clip_dir).to_dict()
    assert _config(tmp_path, tiny_clip_dir, pareto_pngs=0).to_dict()['pareto_pngs'] == 0
    with pytest.raises(ParameterError, match='pareto_pngs: pareto PNGs must be a count'):
        _config(tmp_path, tiny_clip_dir, pareto_pngs='lots')
