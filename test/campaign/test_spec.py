"""The parsed configuration (campaign/spec.py): its identity, its fingerprint and the searches it asks for."""

import pytest

from metavlm_ros.campaign.report import build_report, write_report
from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.common.results import read_jsonl
from test.campaign.configs import small_config


def test_campaigns_warp_sequentially_by_default_and_say_so(tmp_path, image_dir, tiny_clip_dir):
    config = small_config(image_dir, tiny_clip_dir, runs=1, algorithms=['random'], evaluations=6)
    assert (config.warp, config.search_config('random', 0).warp) == ('sequential', 'sequential')
    fused = small_config(image_dir, tiny_clip_dir, warp='fused')
    assert fused.search_config('nsga2', 0).warp == 'fused'
    assert fused.fingerprint() != config.fingerprint()  # the warps change the follow-up frames
    with pytest.raises(ParameterError, match="warp: must be one of fused, sequential, got 'bilinear'"):
        small_config(image_dir, tiny_clip_dir, warp='bilinear')
    with pytest.raises(ParameterError, match='threads: must be >= 1, got 0'):
        small_config(image_dir, tiny_clip_dir, threads=0)
    run_campaign(config, tmp_path / 'out', progress=False)
    summaries = [read_jsonl(p)[0] for p in (tmp_path / 'out' / 'cells').glob('*/summary.jsonl.gz')]
    assert len(summaries) == 2 and {s['warp'] for s in summaries} == {'sequential'}
    (path,) = write_report(build_report(tmp_path / 'out'), tmp_path / 'report', plots=False)
    assert '- Warps: sequential (resampled after every relation, as the paper' in path.read_text()


def test_the_blur_angle_range_narrows_every_cell_and_is_part_of_the_campaign_identity(
    tmp_path, image_dir, tiny_clip_dir
):
    def config(**ranges):
        relations = {'enabled': ['motion_blur'], **({'ranges': ranges} if ranges else {})}
        return small_config(
            image_dir, tiny_clip_dir, runs=1, algorithms=['random'], evaluations=6, relations=relations
        )

    heave, roaming = config(motion_blur_angle=[90, 90]), config()
    assert heave.identity()['extras'] == {'motion_blur_angle': [90.0, 90.0]}
    assert roaming.identity()['extras'] == {'motion_blur_angle': [-90.0, 90.0]}
    assert heave.fingerprint() != roaming.fingerprint()
    # A campaign without motion blur keeps the identity it had.
    plain = small_config(image_dir, tiny_clip_dir, relations={'enabled': ['paper', 'turbidity']})
    assert 'extras' not in plain.identity()
    run_campaign(heave, tmp_path / 'out', progress=False, threads=1)
    records = [
        r for path in (tmp_path / 'out' / 'cells').glob('*/evaluations.jsonl.gz') for r in read_jsonl(path)
    ]
    assert len(records) == 2 * 6 and all(r['parameters']['motion_blur_angle'] == 90.0 for r in records)
    with pytest.raises(
        ParameterError, match=r'MR10 motion_blur angle -100.0 is outside the allowed range'
    ) as bad:
        config(motion_blur_angle=[-100, 0])
    assert '\n' not in str(bad.value)
