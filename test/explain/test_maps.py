"""A catalogue's maps written out: overlays, montage and numbers per mode, in modes.json, .md and .html."""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest

from metavlm_ros.explain.attribution import INTEGRATED_GRADIENTS, OCCLUSION
from metavlm_ros.explain.modes import attribute_modes, catalogue_of, map_settings_for
from metavlm_ros.explain.report import write_catalogue
from test.explain.planted import HEIGHT, WIDTH
from test.explain.region import TOP_RIGHT, RegionBackend

BUDGET = 20  # occlusion frames for the planted catalogue's two modes: 5 a map, a 2 x 2 grid on the quadrants


@pytest.fixture(scope='module')
def catalogue(planted_results):
    return catalogue_of([planted_results])


@pytest.fixture(scope='module')
def written(catalogue, planted_results, tmp_path_factory):
    """The catalogue written with the region double's maps, by each method, and the doubles."""
    out = {}
    for method in ('gradients', 'occlusion'):
        backend = RegionBackend(TOP_RIGHT)
        maps = attribute_modes(catalogue, backend, map_settings_for(method=method, steps=4, budget=BUDGET))
        directory = tmp_path_factory.mktemp(method) / 'modes'
        write_catalogue(catalogue, directory, [planted_results], maps)
        out[method] = (directory, backend, maps)
    return out


def _records(directory):
    return [json.loads(line) for line in (directory / 'modes.json').read_text(encoding='utf-8').splitlines()]


@pytest.mark.parametrize('method', ['gradients', 'occlusion'])
def test_each_mode_gets_overlays_a_montage_and_the_numbers(written, method):
    directory, _, _ = written[method]
    records = _records(directory)
    assert len(records) == 2
    for record in records:
        maps = record['maps']
        assert maps['method'] == (INTEGRATED_GRADIENTS if method == 'gradients' else OCCLUSION)
        assert maps['class'] == record['class'] and maps['backend'] == 'fake-region'
        for key in ('source', 'followup', 'difference'):
            image = cv2.imread(str(directory / maps['files'][key]))
            assert image.shape == (HEIGHT, WIDTH, 3), key
        montage = cv2.imread(str(directory / maps['files']['montage']))
        assert montage.shape == (2 * HEIGHT + 4, 3 * WIDTH + 8, 3)
        numbers = np.load(directory / maps['files']['numbers'])
        assert numbers['source'].shape == (48, 64) and numbers['source'].sum() == pytest.approx(1.0, abs=1e-5)
        assert np.allclose(numbers['difference'], numbers['followup'] - numbers['source'])
        # The double looks only at the top-right quadrant, on the source and the follow-up alike.
        for side in ('source', 'followup'):
            grid = np.array(maps[side]['grid'])
            assert grid[:2, 2:].sum() >= 0.8, (side, grid)
        assert 0 <= maps['difference']['moved'] <= 1
        # The model's score now beside the one the evidence recorded (another model: other numbers).
        assert maps['recorded']['source'] == record['example']['source'][record['class']]


def test_occlusion_keeps_to_its_budget_and_counts_every_frame(written):
    _, backend, maps = written['occlusion']
    assert maps.frames_judged == backend.frames_judged <= BUDGET
    per_map = [m.frames_judged for made in maps.by_rank.values() for m in (made.source, made.followup)]
    assert per_map == [5] * 4
    assert sum(r['maps']['frames_judged'] for r in _records(written['occlusion'][0])) == maps.frames_judged


def test_the_pages_show_each_montage_and_the_method(written):
    directory, _, _ = written['gradients']
    html = (directory / 'modes.html').read_text(encoding='utf-8')
    markdown = (directory / 'modes.md').read_text(encoding='utf-8')
    for rank in (1, 2):
        assert f'<img src="maps/{rank}-montage.png"' in html
        assert f'](maps/{rank}-montage.png)' in markdown
    assert 'integrated gradients' in markdown and 'frames judged' in markdown
    assert sorted(p.name for p in (directory / 'maps').iterdir()) == sorted(
        f'{rank}{suffix}'
        for rank in (1, 2)
        for suffix in ('-source.png', '-followup.png', '-difference.png', '-montage.png', '.npz')
    )


def test_a_mode_whose_source_frame_is_gone_has_no_map_and_a_note(planted_results, tmp_path):
    copy = tmp_path / 'search'
    shutil.copytree(planted_results, copy)
    catalogue = catalogue_of([copy])  # learnt while the frames were there: the same two modes
    for frame in (copy / 'sources').iterdir():
        frame.unlink()
    maps = attribute_modes(
        catalogue, RegionBackend(TOP_RIGHT), map_settings_for(method='auto', steps=2, budget=1)
    )
    assert maps.by_rank == {} and len(maps.notes) == 2
    assert all('no attribution map' in note and 'missing' in note for note in maps.notes)
