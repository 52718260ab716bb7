"""`metavlm modes --maps` end to end with a tiny CLIP: gradients, occlusion on a budget, bad input refused."""

from __future__ import annotations

import json

import cv2
import pytest

from metavlm_ros.cli import main


def _model(tiny_clip_dir) -> list[str]:
    return ['--backend', 'clip', '--model', str(tiny_clip_dir), '--device', 'cpu']


def _records(directory):
    return [json.loads(line) for line in (directory / 'modes.json').read_text(encoding='utf-8').splitlines()]


def test_maps_by_gradients_through_the_command(planted_results, tiny_clip_dir, tmp_path, capsys):
    out = tmp_path / 'modes'
    argv = [
        'modes',
        str(planted_results),
        '--out',
        str(out),
        '--maps',
        *_model(tiny_clip_dir),
        '--map-steps',
        '4',
    ]
    assert main(argv) == 0
    assert 'maps: 2 mode(s) by integrated gradients, 24 frames judged' in capsys.readouterr().err
    for record in _records(out):
        maps = record['maps']
        assert maps['method'] == 'integrated_gradients' and maps['backend'] == 'clip'
        assert maps['source']['steps'] == 4 and maps['source']['top_cell'] is not None
        assert cv2.imread(str(out / maps['files']['montage'])) is not None
    # The evidence is of the planted double, the maps of CLIP: the page says so.
    assert 'the evidence is of backend fake-planted' in (out / 'modes.md').read_text(encoding='utf-8')


def test_maps_by_occlusion_keep_to_the_budget(planted_results, tiny_clip_dir, tmp_path):
    out = tmp_path / 'modes'
    argv = ['modes', str(planted_results), '--out', str(out), '--maps', *_model(tiny_clip_dir),
            '--map-method', 'occlusion', '--map-budget', '24']  # fmt: skip
    assert main(argv) == 0
    records = _records(out)
    # 24 frames for four maps: 6 a map pays for a 2 x 2 grid and the frame (5).
    assert [r['maps']['frames_judged'] for r in records] == [10, 10]
    assert all(r['maps']['source']['rows'] * r['maps']['source']['cols'] == 4 for r in records)


@pytest.mark.parametrize(
    'extra, message',
    [
        (['--maps'], '--maps needs the model the evidence is of'),
        (['--model', 'DIR'], '--model: only with --maps'),
        (['--map-budget', '10'], '--map-budget: only with --maps'),
        (['--maps', 'MODEL', '--map-budget', '0'], '--map-budget must be at least 1'),
        (['--maps', 'MODEL', '--map-steps', '0'], '--map-steps must be at least 1'),
        (['--maps', 'MODEL', '--map-method', 'occlusion', '--map-budget', '8'],
         '4 occlusion maps need at least 20 frames judged'),
        (['--maps', 'MODEL', '--classes', 'animal', 'vegetation', 'object'], "class 'trash'"),
    ],
)  # fmt: skip
def test_bad_map_options_are_one_line_and_exit_2(
    planted_results, tiny_clip_dir, tmp_path, capsys, extra, message
):
    named = {'MODEL': _model(tiny_clip_dir), 'DIR': [str(tiny_clip_dir)]}
    extra = [arg for item in extra for arg in named.get(item, [item])]
    out = tmp_path / 'out'
    assert main(['modes', str(planted_results), '--out', str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: ') and message in err and err.count('\n') == 1, err
    assert not out.exists()
