"""Tests of `metavlm demo` end to end and of its report tables and montage."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from metavlm_ros import cli
from metavlm_ros.assurance.criteria import example_criteria, load_criteria
from metavlm_ros.assurance.water_envelopes import Boundary, water_conditions
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.record_format import SEARCH_SOURCE
from metavlm_ros.common.results import read_identity, read_jsonl
from metavlm_ros.demo.report import criterion, montage, pair_panel, pareto_plot, strongest, tabulate
from metavlm_ros.explain.modes import catalogue_of
from metavlm_ros.explain.sections import NO_MODES, TOP_MODES
from metavlm_ros.footage.frames import iter_frames
from metavlm_ros.method.water import water_index
from metavlm_ros.models.vlm import model_identity

DEMO_MODELS = Path(__file__).resolve().parents[2] / 'metavlm_ros' / 'models'


def _record(
    order, composition, hit, *, kind='confidence', strength=0.2, f_trans=1.0, failed=False, image='a'
):
    violation = {'count': hit} if kind == 'count' else {'0.01': True, '0.03': hit, '0.05': hit}
    key = 'count' if kind == 'count' else '0.05'
    return {
        'image': image,
        'kind': kind,
        'order': order,
        'composition': composition,
        'parameters': {},
        'f_trans': f_trans,
        'f_pred': strength,
        'violation': violation,
        'strength': {key: strength if hit else None},
        'failed': failed,
        'source': {'animal': 1.0},
        'followup': {'animal': 2.0 if hit else 1.0},
    }


def test_tabulate_counts_by_order_and_composition_by_hand():
    records = [
        _record(0, '{}', False),  # identity: never counted
        _record(1, '{1}', True),
        _record(1, '{1}', False),
        _record(1, '{3}', False),
        _record(2, '{1,3}', True),
        _record(2, '{1,3}', True, failed=True),  # failed probe: no judgement
    ]
    table = tabulate(records)
    assert table['by_order'] == {'1': [1, 3], '2': [1, 1]}
    # Ordered by violation rate: {1,3} 1/1, {1} 1/2, {3} 0/1.
    assert list(table['by_composition'].items()) == [('{1,3}', [1, 1]), ('{1}', [1, 2]), ('{3}', [0, 1])]


def test_tabulate_uses_the_count_criterion_for_count_models():
    records = [_record(1, '{2}', True, kind='count'), _record(1, '{2}', False, kind='count')]
    assert criterion(records[0]) == 'count'
    assert tabulate(records)['by_order'] == {'1': [1, 2]}


def test_strongest_keeps_one_per_composition_by_strength_then_f_trans():
    records = [
        _record(1, '{1}', True, strength=0.3, f_trans=0.5, image='a'),
        _record(1, '{1}', True, strength=0.3, f_trans=0.2, image='b'),  # same strength, smaller change wins
        _record(2, '{1,2}', True, strength=0.9),
        _record(1, '{4}', True, strength=0.1),
        _record(1, '{5}', False, strength=5.0),  # not a violation
    ]
    best = strongest(records, 2)
    assert [r['composition'] for r in best] == ['{1,2}', '{1}']
    assert best[1]['image'] == 'b'


def test_pair_panel_and_montage_shapes(frame):
    record = _record(2, '{1,2}', True)
    record['parameters'] = {'rotation': 2.0, 'scaling': 1.1}
    panel = pair_panel(frame, frame[::-1].copy(), record, 'demo clip | frame', height=60)
    assert panel.dtype == np.uint8 and panel.ndim == 3
    # Two 80-pixel-wide frames (160x120 scaled to height 60) and a 6-pixel gap.
    assert panel.shape[1] == 80 + 6 + 80
    tall = montage([panel, panel[:, :100]], gap=4)
    assert tall.shape == (2 * panel.shape[0] + 4, panel.shape[1], 3)
    with pytest.raises(InputError):
        montage([])


def test_demo_runs_end_to_end_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / 'demo'
    rc = cli.main(['demo', '--out', str(out), '--frames', '2', '--evaluations', '30'])
    printed = capsys.readouterr().out
    assert rc == 0
    assert (out / 'footage' / 'demo' / 'metadata.yaml').is_file()
    assert str(out / 'report.md') in printed
    report = json.loads((out / 'report.json').read_text())
    assert [s['results_dir'] for s in report['sections']] == [
        str(out / m) for m in ('clip', 'blip', 'detector')
    ]
    assert [s['kind'] for s in report['sections']] == ['confidence', 'count', 'detection']
    for section in report['sections']:
        records = read_jsonl(out / section['results_dir'] / 'evaluations.jsonl')
        assert records, 'the tester searched nothing'
        judged = [r for r in records if r['order'] > 0 and not r['failed']]
        assert sum(cell[1] for cell in section['by_order'].values()) == len(judged)
        hits = sum(r['violation'][criterion(r)] for r in judged)
        assert sum(cell[0] for cell in section['by_order'].values()) == hits
    text = (out / 'report.md').read_text()
    for title in ('demo CLIP', 'demo BLIP', 'demo detector'):
        assert f'## {title} through ROS' in text
    # The detector's evaluations judge boxes: each carries the match of the follow-up's objects to the
    # source's moved by the warp, and its violation is the match's (a lost, new, re-classed or displaced box).
    boxes = [
        r for r in read_jsonl(out / 'detector' / 'evaluations.jsonl') if r['order'] > 0 and not r['failed']
    ]
    assert boxes and all(set(r['violation']) == {'iou0.5'} for r in boxes)
    for r in boxes:
        match = r['boxes']
        broken = bool(match['lost'] or match['new'] or match['displaced'])  # a re-classed one is lost and new
        assert r['violation']['iou0.5'] == broken
    # The trade-off: the frames the tester searched, searched again by Rand with the same budget; the
    # report's hypervolumes are those the searches stored.
    assert '## Trade-off: NSGA-II against Rand' in text and '![f_trans against f_pred](trade_off.png)' in text
    # It ends with the example criteria's verdict on the demo CLIP and the gate against two updates of it.
    gate = out / 'assurance'
    verdict = json.loads((gate / 'verify-clip' / 'verdict.json').read_text())
    assert f'verdict (demo CLIP):   {verdict["overall"]}: ' in printed
    assert '## Acceptance criteria and the regression gate (demo CLIP)' in text
    assert [v['criterion'] for v in verdict['verdicts']] == [
        'small-changes', 'survey-roll', 'turbid-water', 'roll-envelope'
    ]  # fmt: skip
    models = {'int8': str(gate / 'models' / 'clip-int8'), 'v2': str(DEMO_MODELS / 'demo-clip-v2')}
    for update, model in models.items():
        compared = json.loads((gate / f'compare-{update}' / 'compare.json').read_text())
        called = 'REGRESSED' if compared['regressed'] else 'no regression'
        assert f'gate, {update:8}       {called}' in printed
        assert compared['configurations']['candidate']['models'] == [model]
        assert (gate / f'verify-{update}' / 'SHA256SUMS').is_file()
    assert (out / 'trade_off.png').stat().st_size > 10_000
    # The demo CLIP's failure modes: what `metavlm modes` finds in its two results directories, the top
    # ones in the report (rule, support, rates inside and outside), every one in OUT/modes.
    expected = catalogue_of([out / 'clip', out / 'clip_rand'])
    assert '## Failure modes (demo CLIP)' in text
    assert [m['rule'] for m in report['modes']] == [m.rule for m in expected.modes]
    assert f'failure modes:         {out / "modes" / "modes.md"}' in printed
    written = (out / 'modes' / 'modes.json').read_text().splitlines()
    assert [json.loads(line)['rule'] for line in written] == [m.rule for m in expected.modes]
    for rank, mode in enumerate(expected.modes[:TOP_MODES], start=1):
        assert f'| {rank} | {mode.rule} | {mode.violations_inside} | {mode.evaluations_inside} |' in text
    assert (NO_MODES in text) == (not expected.modes)
    for backend, title in (('clip', 'demo CLIP'), ('blip', 'demo BLIP'), ('detector', 'demo detector')):
        nsga2 = read_jsonl(out / backend / 'summary.jsonl')
        rand = read_jsonl(out / f'{backend}_rand' / 'summary.jsonl')
        assert {r['image'] for r in rand} == {r['image'] for r in nsga2}
        assert all(r['algorithm'] == 'random' and r['evaluations'] == 30 for r in rand)
        # Every results directory says what its searches were.
        assert read_identity(out / f'{backend}_rand')['settings']['algorithm'] == 'random'
        assert read_identity(out / f'{backend}_rand')['model']['weights_sha256']
        # The record of `metavlm search`, from the same builder; the tester's has the same shape.
        expected = model_identity(backend, 'demo', {'device': 'cpu'})
        assert read_identity(out / f'{backend}_rand')['model'] == expected
        assert read_identity(out / f'{backend}_rand')['source'] == dict(SEARCH_SOURCE)
        tester = read_identity(out / backend)
        # Through the perception node, the model as it identified itself: the same as in process.
        assert tester['model'] == expected
        assert tester['settings']['evaluations'] == 30 and tester['source']['endpoint'] == 'ros'
        assert set(tester) == set(read_identity(out / f'{backend}_rand')) == {'settings', 'model', 'source'}
        stored = report['trade_off']['hypervolume'][title]
        assert stored['nsga2'] == {r['image']: r['hypervolume'] for r in nsga2}
        assert stored['random'] == {r['image']: r['hypervolume'] for r in rand}
    if report.get('montage'):
        assert (out / 'strongest_violations.png').stat().st_size > 1000
    _check_water(out, report, text)
    # Each demo results directory (tester and Rand) renders its stored follow-ups again, byte for byte.
    for name in ('clip', 'clip_rand'):
        written = [p for p in read_jsonl(out / name / 'pareto.jsonl') if p['frame']]
        assert written, f'{name}: no follow-up PNG to compare with'
        for p in written:
            again = tmp_path / 'again' / name
            options = ['--image', p['image'], '--out', str(again)]
            assert cli.main(['render', str(out / name), str(p['index']), *options]) == 0
            (png,) = again.glob(f'*_e{p["index"]:05d}.png')
            assert png.read_bytes() == (out / name / p['frame']).read_bytes()
            png.unlink()


def _water_breaks(evidence: Path, key: str) -> dict[tuple[str, float], float]:
    """Per (frame, water index), the smallest range of MR12 water that broke the answer at `key`, as
    DuckDB reads the evidence's records (inf: none did); every record is `water` alone, judged."""
    import duckdb

    rows = duckdb.sql(
        f"""SELECT json ->> '$.image', CAST(json -> '$.parameters.water_type' AS DOUBLE),
                   min(CAST(json -> '$.parameters.water' AS DOUBLE))
                       FILTER (WHERE CAST(json -> '$.violation."{key}"' AS BOOLEAN)),
                   count(*) FILTER (WHERE CAST(json -> '$.order' AS INTEGER) <> 1
                                    OR json_keys(json -> '$.parameters')[1] <> 'water'
                                    OR CAST(json -> '$.failed' AS BOOLEAN))
            FROM read_ndjson_objects('{evidence}/*/evaluations.jsonl.gz') GROUP BY ALL"""
    ).fetchall()
    assert rows and all(other == 0 for *_, other in rows)
    return {(image, index): math.inf if broke is None else broke for image, index, broke, _ in rows}


def _check_water(out: Path, report: dict, text: str) -> None:
    """The demo models in Jerlov water: per type, the median over the frames of the smallest range added
    that broke the answer, as the evidence kept under OUT/water holds it."""
    water = report['water']
    assert water['types'] == ['I', 'II', 'III', '1C', '5C', '9C'] and water['range_max'] == 10.0
    assert water['frames'] == [f.id for f in iter_frames([out / 'footage' / 'demo'])]  # --frames 2: both
    assert '## The demo models in Jerlov water (MR12 water)' in text
    assert water['criteria_sha256'] == load_criteria(example_criteria('demo_water.yaml')).sha256
    assert sorted(p.name for p in (out / 'water').iterdir()) == [
        f'verify-{m}' for m in ('blip', 'clip', 'detector')
    ]
    models = water['models']
    assert list(models) == ['demo CLIP', 'demo BLIP', 'demo detector']
    assert [m['key'] for m in models.values()] == ['0.05', 'count', 'iou0.5']
    for title, model in models.items():
        results = Path(model['results_dir'])
        assert (results / 'SHA256SUMS').is_file() and (results / 'verdict.json').is_file()
        breaks = _water_breaks(results / 'evidence', model['key'])
        assert {index for _, index in breaks} == {water_index(t) for t in water['types']}
        for name, cell in model['boundaries'].items():
            found = sorted(breaks[(image, water_index(name))] for image in water['frames'])
            median = found[(len(found) - 1) // 2]  # the lower median, as the envelope's figure
            assert cell['frames'] == len(found)
            assert cell['censored'] == sum(math.isinf(b) for b in found), (title, name)
            if math.isinf(median):
                assert cell['beyond_range'] and cell['median'] == water['range_max'], (title, name)
            else:
                assert not cell['beyond_range'], (title, name)
                assert cell['median'] == pytest.approx(median, abs=1e-9), (title, name)
                assert 0 < median <= water['range_max']
    for name in water['types']:
        cells = [m['boundaries'][name] for m in models.values()]
        shown = ['> 10 m' if c['beyond_range'] else f'{c["median"]:.2f} m' for c in cells]
        family = 'oceanic' if name in ('I', 'II', 'III') else 'coastal'
        assert f'| {name} ({family}) | {" | ".join(shown)} |' in text


def test_water_cells_say_beyond_the_range_only_when_the_median_frame_held(tmp_path):
    # Three frames: the lower median is the second smallest; it held when two of the three held.
    assert Boundary(10.0, 3, 2).text(10.0) == '> 10 m' and Boundary(10.0, 3, 2).beyond_range
    assert Boundary(10.0, 3, 1).text(10.0) == '10.00 m'  # broke at 10 m itself, one frame held
    # Two frames: the lower median is the smaller; it held only when both did.
    assert Boundary(0.5, 2, 1).text(10.0) == '0.50 m' and not Boundary(10.0, 2, 1).beyond_range
    assert Boundary(10.0, 2, 2).beyond_range
    assert Boundary(None, 3, 0).text(10.0) == 'no evidence'
    with pytest.raises(ParameterError, match=r'small-changes: must be an envelope claim on water'):
        water_conditions(load_criteria(example_criteria()))
    # A claim at a depth too: the table says "at the surface", so it is refused rather than mislabelled.
    deep = tmp_path / 'deep.yaml'
    deep.write_text(
        'format: 1\nname: deep\ncriteria:\n  - {id: deep, kind: envelope, relation: water, at_least: 1, '
        'frames: 0.5, within: {water_type: [II, II], water_depth: [10, 10]}}\n'
    )
    with pytest.raises(ParameterError, match=r'deep: must be .* and no other condition'):
        water_conditions(load_criteria(deep))
    assert water_conditions(load_criteria(example_criteria('demo_water.yaml')))[-1] == (
        '9C',
        'Jerlov 9C, at the surface',
    )


def test_pareto_plot_draws_each_algorithm_in_its_colour(tmp_path):
    import cv2

    records = [
        _record(1, '{1}', True, f_trans=t, strength=p) for t, p in ((0.2, 0.5), (0.8, 1.5), (1.0, 0.7))
    ]
    path = pareto_plot({'model A': {'random': records}, 'model B': {'nsga2': records}}, tmp_path / 'p.png')
    image = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB).astype(int)
    left, right = image[:, : image.shape[1] // 2], image[:, image.shape[1] // 2 :]

    def has(part, rgb):
        return bool((np.abs(part - rgb).sum(axis=2) < 30).any())

    # Rand is drawn blue and only in the first panel, NSGA-II red and only in the second.
    blue, red = (0x1F, 0x77, 0xB4), (0xD6, 0x27, 0x28)
    assert has(left, blue) and not has(left, red)
    assert has(right, red) and not has(right, blue)


def test_demo_refuses_to_overwrite_without_flag_and_foreign_directories(tmp_path, capsys):
    foreign = tmp_path / 'mine'
    foreign.mkdir()
    (foreign / 'notes.txt').write_text('keep me')
    assert cli.main(['demo', '--out', str(foreign), '--frames', '1']) == 2
    assert 'pass --overwrite' in capsys.readouterr().err
    assert cli.main(['demo', '--out', str(foreign), '--frames', '1', '--overwrite']) == 2
    assert 'does not look like a metavlm demo directory' in capsys.readouterr().err
    assert (foreign / 'notes.txt').read_text() == 'keep me'


@pytest.mark.parametrize('flag', ['--frames', '--evaluations'])
def test_demo_rejects_non_positive_budgets(tmp_path, capsys, flag):
    assert cli.main(['demo', '--out', str(tmp_path / 'd'), flag, '0']) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / 'd').exists()


def _earlier_demo(out):
    """A directory as an earlier demo left it (its names, a results PNG), checked after a refusal."""
    (out / 'footage').mkdir(parents=True)
    (out / 'report.md').write_text('# an earlier demo\n')
    (out / 'clip' / 'frames').mkdir(parents=True)
    (out / 'clip' / 'frames' / 'old.png').write_bytes(b'an earlier follow-up frame')
    (out / 'clip' / 'evaluations.jsonl').write_text('{"index": 0}\n')
    return {p.relative_to(out): p.read_bytes() for p in out.rglob('*') if p.is_file()}


def _same(out, before):
    return {p.relative_to(out): p.read_bytes() for p in out.rglob('*') if p.is_file()} == before


def test_demo_overwrite_checks_everything_before_it_touches_the_earlier_demo(tmp_path, capsys, monkeypatch):
    import shutil

    from metavlm_ros.commands import demo
    from metavlm_ros.models import model_files

    out = tmp_path / 'demo'
    before = _earlier_demo(out)

    def no_run(*args, **kwargs):
        raise AssertionError('the demo started although a check failed')

    monkeypatch.setattr(demo, 'run_demo', no_run)
    # A damaged demo model: refused in one line, the earlier demo whole.
    shipped = model_files._DEMO_ROOT
    models = tmp_path / 'models'
    for backend in demo.DEMO_MODELS:
        shutil.copytree(shipped / f'demo-{backend}', models / f'demo-{backend}')
    weights = models / 'demo-blip' / 'model.safetensors'
    weights.write_bytes(weights.read_bytes()[:1000])
    monkeypatch.setattr(model_files, '_DEMO_ROOT', models)
    assert cli.main(['demo', '--out', str(out), '--frames', '1', '--overwrite']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm: error: ') and 'damaged weights' in err and '\n' not in err, err
    assert _same(out, before)
    monkeypatch.setattr(model_files, '_DEMO_ROOT', shipped)
    # Not enough room on its disk: refused, the earlier demo whole.
    monkeypatch.setattr(demo, 'DEMO_BYTES', 2**62)
    assert cli.main(['demo', '--out', str(out), '--frames', '1', '--overwrite']) == 2
    err = capsys.readouterr().err.strip()
    assert 'MiB free on its disk' in err and '\n' not in err, err
    assert _same(out, before)
    # Something else in it: never replaced.
    (out / 'notes.txt').write_text('mine')
    monkeypatch.setattr(demo, 'DEMO_BYTES', 1)
    assert cli.main(['demo', '--out', str(out), '--frames', '1', '--overwrite']) == 2
    assert 'holds files a demo does not write (notes.txt)' in capsys.readouterr().err
    (out / 'notes.txt').unlink()
    assert _same(out, before)


def _fake_demo(seen, parent):
    """A stand-in for run_demo that notes what it starts in and writes a one-line report."""

    def fake_run(directory, **kwargs):
        # The new demo starts in an empty directory under the same name; the old one is gone whole.
        seen['listing'] = sorted(p.name for p in directory.iterdir())
        seen['siblings'] = sorted(p.name for p in parent.iterdir())
        (directory / 'report.md').write_text('# the new demo\n')
        paths = {
            'report': 'report.md',
            'report_json': 'report.json',
            'trade_off': 'trade_off.png',
            'bag': 'footage',
        }
        return {
            'seconds': 1.0,
            'results': {},
            'montage': None,
            'assurance': {'verdict': 'PASS', 'regressions': {}},
            **{k: directory / v for k, v in paths.items()},
        }

    return fake_run


def test_demo_overwrite_replaces_the_earlier_demo_whole_once_it_can_start(tmp_path, monkeypatch):
    from metavlm_ros.commands import demo

    out = tmp_path / 'demo'
    _earlier_demo(out)
    seen = {}
    fake_run = _fake_demo(seen, tmp_path)
    monkeypatch.setattr(demo, 'run_demo', fake_run)
    assert cli.main(['demo', '--out', str(out), '--frames', '1', '--overwrite']) == 0
    assert seen == {'listing': [], 'siblings': ['demo']}
    assert sorted(p.name for p in out.iterdir()) == ['report.md']
    assert not (out / 'clip' / 'frames' / 'old.png').exists()


@pytest.mark.parametrize(
    ('also', 'words'), [(['nsga2'], "unknown algorithm 'nsga2'"), (['mobo', 'mobo'], 'twice')]
)
def test_demo_also_takes_registered_algorithms_beside_its_own_each_once(tmp_path, capsys, also, words):
    assert cli.main(['demo', '--out', str(tmp_path / 'd'), '--also', *also]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('metavlm: error: --also') and words in err and '\n' not in err
    assert not (tmp_path / 'd').exists()


def test_demo_also_searches_the_tester_frames_with_mobo_and_reports_it_beside_rand(
    tmp_path, capsys, monkeypatch
):
    out = tmp_path / 'demo'
    assert (
        cli.main(['demo', '--out', str(out), '--frames', '1', '--evaluations', '40', '--also', 'mobo']) == 0
    )
    report = json.loads((out / 'report.json').read_text())
    text = (out / 'report.md').read_text()
    assert '| model | frame | NSGA-II | Rand | mobo |' in text
    assert '## Trade-off: NSGA-II against Rand and mobo' in text and '(and mobo, asked with --also)' in text
    for backend, title in (('clip', 'demo CLIP'), ('blip', 'demo BLIP'), ('detector', 'demo detector')):
        tester = read_jsonl(out / backend / 'summary.jsonl')
        mobo = read_jsonl(out / f'{backend}_mobo' / 'summary.jsonl')
        # The frames the tester searched, searched again by mobo with the same budget.
        assert mobo and {r['image'] for r in mobo} == {r['image'] for r in tester}
        assert all(r['algorithm'] == 'mobo' and r['evaluations'] == 40 for r in mobo)
        assert read_identity(out / f'{backend}_mobo')['settings']['algorithm'] == 'mobo'
        stored = report['trade_off']['hypervolume'][title]
        assert stored['mobo'] == {r['image']: r['hypervolume'] for r in mobo}
    # An earlier demo with such a directory is still a demo: --overwrite replaces it (the new demo itself
    # stood in for: a third real run would check nothing more).
    from metavlm_ros.commands import demo

    seen = {}
    monkeypatch.setattr(demo, 'run_demo', _fake_demo(seen, tmp_path))
    assert cli.main(['demo', '--out', str(out), '--frames', '1', '--evaluations', '10', '--overwrite']) == 0
    assert seen['listing'] == [] and not (out / 'clip_mobo').exists()
