"""Follow-ups rendered again from the stored source frame match the PNGs the search wrote, byte for byte."""

import json

import numpy as np
import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.errors import ResultsError
from metavlm_ros.common.results import ResultsStore, read_jsonl, source_digest
from metavlm_ros.method.render import find_search, render_search
from metavlm_ros.method.search import SearchConfig, run_search
from test.conftest import make_frame
from test.fakes import BlackCountBackend, ImageStatsBackend


def _search(
    out, frame, *, warp='fused', pareto_pngs='all', seed=1, backend=None, working_size=None, budget=60
):
    config = SearchConfig(
        population=10,
        evaluations=budget,
        seed=seed,
        warp=warp,
        pareto_pngs=pareto_pngs,
        working_size=working_size,
    )
    with ResultsStore(out) as store:
        return run_search(frame, backend or BlackCountBackend(), config, image_id='f', store=store)


@pytest.mark.parametrize('warp', ['fused', 'sequential'])
def test_every_pareto_member_renders_to_the_png_the_search_wrote(tmp_path, warp):
    # Shrunk to a working size first: the source is stored as searched, not as given.
    result = _search(tmp_path / 'out', make_frame(200, 150), warp=warp, working_size=96)
    pareto = read_jsonl(tmp_path / 'out' / 'pareto.jsonl')
    assert len(pareto) >= 2 and all(p['frame'] for p in pareto)
    code = main(['render', str(tmp_path / 'out'), 'pareto', '--out', str(tmp_path / 'again')])
    assert code == 0
    for p in pareto:
        rendered = tmp_path / 'again' / f'f_nsga2_s1_e{p["index"]:05d}.png'
        # Ties share the PNG of their first copy; each copy renders to the same bytes.
        assert rendered.read_bytes() == (tmp_path / 'out' / p['frame']).read_bytes()
    (summary,) = read_jsonl(tmp_path / 'out' / 'summary.jsonl')
    assert summary['warp'] == warp and max(result.source_size) == 200
    source = tmp_path / 'out' / summary['source_frame']
    assert source.name == f'{summary["source_sha256"]}.png' and summary['working_size'] == 96


def test_any_evaluation_renders_as_the_search_judged_it(tmp_path, frame):
    result = _search(tmp_path / 'out', frame, pareto_pngs=0, backend=ImageStatsBackend())
    summary = find_search(tmp_path / 'out')
    indices = [ev.index for ev in result.evaluations[::7]]
    frames = render_search(tmp_path / 'out', summary, indices)
    backend = ImageStatsBackend()
    for index in indices:
        ev = result.evaluations[index]
        # The model's answer on the re-rendered frame is the follow-up the record holds.
        assert backend.predict([frames[index]])[0].values == ev.followup.values
    assert not (tmp_path / 'out' / 'frames').exists()


def test_the_source_frame_is_stored_once_for_every_search_of_it(tmp_path, frame):
    _search(tmp_path / 'out', frame, seed=1, pareto_pngs=0)
    _search(tmp_path / 'out', frame, seed=2, pareto_pngs=0)
    summaries = read_jsonl(tmp_path / 'out' / 'summary.jsonl')
    assert len({s['source_frame'] for s in summaries}) == 1
    assert [p.name for p in (tmp_path / 'out' / 'sources').iterdir()] == [f'{source_digest(frame)}.png']
    with pytest.raises(ResultsError, match='2 of its 2 searches match'):
        find_search(tmp_path / 'out')
    assert find_search(tmp_path / 'out', seed=2)['seed'] == 2


def test_a_damaged_or_missing_source_frame_is_named_and_nothing_is_rendered(tmp_path, frame, capsys):
    _search(tmp_path / 'out', frame, pareto_pngs=0)
    (source,) = (tmp_path / 'out' / 'sources').iterdir()
    data = bytearray(source.read_bytes())
    damaged = make_frame(seed=9)
    from metavlm_ros.common.images import encode_png

    source.write_bytes(encode_png(damaged))
    assert main(['render', str(tmp_path / 'out'), '0', '--out', str(tmp_path / 'r')]) == 2
    assert 'do not match the sha256' in capsys.readouterr().err
    source.unlink()
    assert main(['render', str(tmp_path / 'out'), '0', '--out', str(tmp_path / 'r')]) == 2
    assert 'is missing' in capsys.readouterr().err
    source.write_bytes(bytes(data))
    assert main(['render', str(tmp_path / 'out'), '99999', '--out', str(tmp_path / 'r')]) == 2
    assert 'has no evaluation 99999' in capsys.readouterr().err
    assert main(['render', str(tmp_path / 'out'), 'x', '--out', str(tmp_path / 'r')]) == 2
    assert main(['render', str(tmp_path / 'out'), '0', '--out', str(tmp_path / 'out' / 'r')]) == 2
    assert 'inside the results directory' in capsys.readouterr().err
    assert not (tmp_path / 'r').exists() and not (tmp_path / 'out' / 'r').exists()
    assert main(['render', str(tmp_path / 'out'), '0', '--out', str(tmp_path / 'r')]) == 0


def test_metavlm_search_takes_the_budget_and_its_pngs_render_again(tmp_path, tiny_clip_dir):
    from metavlm_ros.common.images import encode_png

    (tmp_path / 'in').mkdir()
    (tmp_path / 'in' / 'a.png').write_bytes(encode_png(make_frame(seed=4)))
    args = [
        'search',
        str(tmp_path / 'in'),
        '--backend',
        'clip',
        '--model',
        str(tiny_clip_dir),
        '--device',
        'cpu',
    ]
    args += ['--population', '6', '--evaluations', '24', '--quiet', '--out', str(tmp_path / 'out')]
    assert main([*args, '--pareto-pngs', 'all']) == 0
    pareto = read_jsonl(tmp_path / 'out' / 'pareto.jsonl')
    assert main(['render', str(tmp_path / 'out'), 'pareto', '--out', str(tmp_path / 'again')]) == 0
    for p in pareto:
        assert (tmp_path / 'again' / f'a_nsga2_s0_e{p["index"]:05d}.png').read_bytes() == (
            tmp_path / 'out' / p['frame']
        ).read_bytes()
    assert main([*args[:-1], str(tmp_path / 'bad'), '--pareto-pngs', 'many']) == 2
    assert not (tmp_path / 'bad').exists()
    identity = json.loads((tmp_path / 'out' / 'search.json').read_text())
    assert 'pareto_pngs' not in json.dumps(identity), 'the budget changes no record: not in the identity'
    assert np.asarray(pareto).size
