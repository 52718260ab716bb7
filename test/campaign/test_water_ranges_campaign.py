"""Campaigns over the footage's own ranges (`water_ranges: truth`): each cell searches MR12 over its
frame's range map, keeps the map beside its source frame and renders its follow-ups again."""

import json
import pickle
import shutil

import cv2
import numpy as np
import pytest

from metavlm_ros.campaign.cells import load_images
from metavlm_ros.campaign.config import parse_config
from metavlm_ros.campaign.report import build_report, write_report
from metavlm_ros.campaign.runner import _searched_frames, run_campaign
from metavlm_ros.cli import main
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.images import encode_png
from metavlm_ros.common.range_maps import read_source_ranges
from metavlm_ros.common.results import read_jsonl, read_source_frame
from metavlm_ros.footage.ranges import load_ranges_png
from metavlm_ros.method.render import render_followup, render_search


@pytest.fixture
def scenes(tmp_path):
    out = tmp_path / 'scenes'
    assert main(['scenes', '--out', str(out), '--format', 'png', '--size', '64x48', '--frames', '2']) == 0
    return out


def _data(folder, model_dir, **overrides):
    return {
        'frames': {'sources': [str(folder)]},
        'models': [{'backend': 'clip', 'model': str(model_dir), 'name': 'tiny-clip', 'device': 'cpu'}],
        'algorithms': ['nsga2'],
        'runs': 2,
        'population': 6,
        'evaluations': 12,
        'relations': {'enabled': ['rotation', 'water']},
        'water_ranges': 'truth',
        **overrides,
    }


def _config(folder, model_dir, **overrides):
    return parse_config(_data(folder, model_dir, **overrides), base_dir=folder.parent)


def test_a_campaign_over_the_footages_ranges_keeps_each_map_and_renders_again(
    tmp_path, scenes, tiny_clip_dir
):
    config = _config(scenes, tiny_clip_dir)
    assert config.search_config('nsga2', 0).water_ranges == 'truth'
    run_campaign(config, tmp_path / 'out', progress=False, threads=1)
    record = json.loads((tmp_path / 'out' / 'campaign.json').read_text())
    assert record['config']['water_ranges'] == 'truth'
    for image in record['images']:
        truth = load_ranges_png(scenes / 'ranges' / f'{image["id"]}.png')
        assert image['ranges_sha256'] == load_images(config.frames, 'truth')[image['index']].ranges_sha256
        assert truth.shape == (image['height'], image['width'])
    cells = sorted((tmp_path / 'out' / 'cells').iterdir())
    differ = False
    assert len(cells) == 2 * 2  # runs x frames
    for cell in cells:
        (summary,) = read_jsonl(cell / 'summary.jsonl')
        assert summary['relations'] == ['rotation', 'water']
        assert (cell / summary['source_ranges']).is_file(), 'the map is a file of the cell'
        assert summary['source_ranges'] in json.loads((cell / 'cell.json').read_text())['files']
        # The map searched is the footage's own (the campaign searches the full 64x48 frame).
        image = summary['image']
        stored = read_source_ranges(cell, summary)
        np.testing.assert_array_equal(stored, load_ranges_png(scenes / 'ranges' / f'{image}.png'))
        # Cells carry no search.json: the campaign's record (its fingerprint) stands for their settings.
        assert json.loads((cell / 'cell.json').read_text())['fingerprint'] == record['fingerprint']
        # The follow-ups the search wrote render again byte for byte, over its map, and not over the priors.
        records = {r['index']: r for r in read_jsonl(cell / 'pareto.jsonl') if r.get('frame')}
        assert records
        again = render_search(cell, summary, sorted(records))
        for index, r in records.items():
            assert encode_png(again[index]) == (cell / r['frame']).read_bytes()
            if r['parameters'].get('water'):
                source = read_source_frame(cell, summary)
                priors = render_followup(source, r, summary['warp'])
                differ = differ or not np.array_equal(priors, again[index])
    assert differ, 'some follow-up of water differs over the map from the priors'
    (report,) = write_report(build_report(tmp_path / 'out'), tmp_path / 'report', plots=False)
    assert "- Water ranges: truth (MR12 at each pixel's range from the frame's map" in report.read_text()

    # The same folder without its maps: refused in one line naming a frame, before any cell ran.
    shutil.rmtree(scenes / 'ranges')
    with pytest.raises(InputError) as refused:
        run_campaign(_config(scenes, tiny_clip_dir), tmp_path / 'bare', progress=False)
    assert 'no range map' in str(refused.value) and 'frame_000000.png' in str(refused.value)
    assert '\n' not in str(refused.value)
    assert not (tmp_path / 'bare').exists()


def test_water_ranges_is_checked_and_in_the_identity_only_when_truth(tmp_path, scenes, tiny_clip_dir):
    with pytest.raises(
        ParameterError, match=r"water_ranges: must be one of prior, truth, got 'depth'"
    ) as bad:
        _config(scenes, tiny_clip_dir, water_ranges='depth')
    assert '\n' not in str(bad.value)
    with pytest.raises(ParameterError, match=r"water_ranges: 'truth' is for MR12 water"):
        _config(scenes, tiny_clip_dir, relations={'enabled': ['rotation']})
    prior = _config(scenes, tiny_clip_dir, water_ranges='prior')
    data = _data(scenes, tiny_clip_dir)
    del data['water_ranges']
    unset = parse_config(data, base_dir=tmp_path)
    assert unset.fingerprint() == prior.fingerprint() and unset.to_dict() == prior.to_dict()
    assert 'water_ranges' not in prior.identity() and 'water_ranges' not in unset.identity()
    assert prior.search_config('nsga2', 0).water_ranges == 'prior'
    truth = _config(scenes, tiny_clip_dir)
    assert truth.identity()['water_ranges'] == 'truth' and truth.fingerprint() != prior.fingerprint()


def test_shrunk_frames_carry_their_maps_shrunk_alike(scenes, tiny_clip_dir):
    config = _config(scenes, tiny_clip_dir, frames={'sources': [str(scenes)], 'size': 32})
    full, shrunk = (
        load_images(_config(scenes, tiny_clip_dir).frames, 'truth'),
        load_images(config.frames, 'truth'),
    )
    for big, small in zip(full, shrunk, strict=True):
        assert small.rgb.shape[:2] == small.ranges.shape == (24, 32)
        expected = cv2.resize(big.ranges, (32, 24), interpolation=cv2.INTER_NEAREST)
        np.testing.assert_array_equal(small.ranges, expected)
    assert all(im.ranges is None for im in load_images(config.frames))  # the priors: no maps read
    # What each cell is sent (a PreparedFrame with its map) pickles for worker processes and Dask.
    sent = pickle.loads(pickle.dumps(_searched_frames(config, shrunk)))
    for image in shrunk:
        np.testing.assert_array_equal(sent[image.index].rgb, image.rgb)
        np.testing.assert_array_equal(sent[image.index].ranges, image.ranges)


def test_generated_scenes_carry_the_ranges_of_their_own_render(tiny_clip_dir, tmp_path):
    from metavlm_ros.footage.ranges import render_with_ranges
    from metavlm_ros.footage.scenes import SceneGenerator

    frames = {'generate': {'count': 1, 'size': [64, 48], 'seed': 3}}
    (image,) = load_images(_config(tmp_path, tiny_clip_dir, frames=frames).frames, 'truth')
    rgb, _, ranges = render_with_ranges(SceneGenerator(width=64, height=48, seed=3), 0)
    np.testing.assert_array_equal(image.rgb, rgb)
    np.testing.assert_array_equal(image.ranges, ranges)
    (plain,) = load_images(_config(tmp_path, tiny_clip_dir, frames=frames).frames)
    assert plain.ranges is None and plain.sha256 == image.sha256  # the same pixels either way
