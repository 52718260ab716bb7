"""`metavlm export`: real results directories to MCAP, read back with the mcap library, and bad input."""

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.results import read_jsonl, record_key
from metavlm_ros.footage.bags import iter_bag_frames
from test.conftest import make_frame
from test.viewer.mcap_decode import read_mcap

SCENES = ['--frames', '3', '--size', '64x48', '--fps', '5', '--environment', 'deep']


@pytest.fixture(scope='module')
def bag_search(tmp_path_factory, tiny_clip_dir):
    """A real `metavlm search` on two frames of a real bag: (bag, results directory, another bag)."""
    root = tmp_path_factory.mktemp('export')
    bag, other = root / 'dive.mcap', root / 'other.mcap'
    assert main(['scenes', '--out', str(bag), '--seed', '4', *SCENES]) == 0
    assert main(['scenes', '--out', str(other), '--seed', '5', *SCENES]) == 0
    results = root / 'res'
    args = ['--population', '6', '--evaluations', '12', '--max-frames', '2', '--out', str(results)]
    assert (
        main(['search', '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet', str(bag), *args]) == 0
    )
    return bag, results, other


def expected_changed(record):
    # Independent of the exporter: Eq. 4 (counts differ by >= 1) or Eq. 5 at the smallest violated threshold.
    limit = 1.0 if record['kind'] == 'count' else min(float(t) for t, v in record['violation'].items() if v)
    return [c for c in record['source'] if abs(record['followup'][c] - record['source'][c]) >= limit]


def violations_of(results):
    return [
        r for r in read_jsonl(results / 'evaluations.jsonl') if r['order'] and any(r['violation'].values())
    ]


def test_export_holds_every_violation_at_its_frame_time_with_its_overlay(bag_search, tmp_path, capsys):
    bag, results, _ = bag_search
    out = tmp_path / 'run.mcap'
    assert main(['export', str(results), '--mcap', str(out), '--bag', str(bag)]) == 0
    assert str(out) in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ['run.mcap']  # no scratch left
    data = read_mcap(out)
    topics = data['topics']

    expected = violations_of(results)
    assert expected, 'the tiny CLIP search should find violations'
    logged = topics['/metavlm/violations']
    assert len(logged) == len(expected)
    by_key = {record_key(m): (t, m) for t, m, _ in logged}
    for record in expected:
        time, message = by_key[record_key(record)]
        assert time == record['stamp_ns'] == message['stamp_ns']
        assert message['composition'] == record['composition'] and message['f_pred'] == record['f_pred']
        assert message['changed'] == expected_changed(record)
    assert all(schema.encoding == 'jsonschema' for _, _, schema in logged)
    schema = json.loads(logged[0][2].data)
    assert schema['title'] == 'metavlm.Violation' and 'f_trans' in schema['required']

    # Each saved follow-up (the non-dominated violations' PNGs) is on the image topic, annotated.
    framed = [r for r in read_jsonl(results / 'pareto.jsonl') if r['frame'] and any(r['violation'].values())]
    images = topics['/metavlm/followup/image']
    annotations = topics['/metavlm/followup/annotations']
    assert len(images) == len(annotations) == len(framed) > 0
    for record in framed:
        stamp = record['stamp_ns']
        image = next(m for t, m, _ in images if t == stamp)
        assert image.format == 'png' and image.data == (results / record['frame']).read_bytes()
        assert image.timestamp.seconds * 10**9 + image.timestamp.nanos == stamp
        (note,) = [m for t, m, _ in annotations if t == stamp]
        text = '\n'.join(t.text for t in note.texts)
        assert record['composition'] in text and f'f_trans {record["f_trans"]:.4f}' in text
        assert f'f_pred {record["f_pred"]:.4f}' in text
        assert all(f'{c} ' in text for c in expected_changed(record))

    # Source frames: the bag's own pixels, at their stamps.
    bag_frames = {f.stamp_ns: f.rgb for f in iter_bag_frames(bag)}
    sources = topics['/metavlm/source/image']
    assert sorted(t for t, _, _ in sources) == sorted({r['stamp_ns'] for r in expected})
    for time, message, _ in sources:
        rgb = cv2.imdecode(np.frombuffer(message.data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
        assert np.array_equal(rgb, bag_frames[time])

    # The bag merged as it is: every message of every topic.
    assert len(topics['/camera/image_raw']) == 3 and all(
        s.encoding == 'ros2msg' for _, _, s in topics['/camera/image_raw']
    )
    summaries = topics['/metavlm/summary']
    assert [m['hypervolume'] for _, m, _ in summaries] == [
        s['hypervolume'] for s in read_jsonl(results / 'summary.jsonl')
    ]
    identity = data['metadata']['metavlm.identity']
    assert identity['model.backend'] == 'clip' and identity['settings.population'] == '6'
    assert data['attachments']['metavlm/search.json'] == (results / 'search.json').read_bytes()


def test_image_files_are_laid_one_second_per_search(tmp_path, tiny_clip_dir):
    images = tmp_path / 'frames'
    images.mkdir()
    for seed in (1, 2):
        cv2.imwrite(str(images / f'f{seed}.png'), make_frame(64, 48, seed=seed)[..., ::-1])
    results = tmp_path / 'res'
    args = ['--population', '6', '--evaluations', '12', '--out', str(results), str(images)]
    assert main(['search', '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet', *args]) == 0
    out = tmp_path / 'images.mcap'
    assert main(['export', str(results), '--mcap', str(out)]) == 0
    logged = read_mcap(out)['topics']['/metavlm/violations']
    times = {m['image']: t for t, m, _ in logged}
    assert times == {'f1': 10**9, 'f2': 2 * 10**9}
    assert len(logged) == len(violations_of(results))


def test_a_folder_of_results_gets_a_prefix_per_subfolder(bag_search, tmp_path):
    # The demo's shape: one results directory per model under one folder, with its report.
    _, results, _ = bag_search
    demo = tmp_path / 'demo'
    for name in ('clip', 'blip'):
        shutil.copytree(results, demo / name)
    (demo / 'report.md').write_text('# demo\n')
    out = tmp_path / 'demo.mcap'
    assert main(['export', str(demo), '--mcap', str(out)]) == 0
    data = read_mcap(out)
    count = len(violations_of(results))
    assert (
        len(data['topics']['/metavlm/clip/violations'])
        == len(data['topics']['/metavlm/blip/violations'])
        == count
    )
    assert data['attachments']['report.md'] == b'# demo\n'
    assert set(data['metadata']) == {'metavlm.blip.identity', 'metavlm.clip.identity'}


def test_overwrite_replaces_an_existing_export(bag_search, tmp_path, capsys):
    _, results, _ = bag_search
    out = tmp_path / 'run.mcap'
    out.write_bytes(b'old')
    assert main(['export', str(results), '--mcap', str(out)]) == 2
    assert out.read_bytes() == b'old'
    assert main(['export', str(results), '--mcap', str(out), '--overwrite']) == 0
    assert '/metavlm/violations' in read_mcap(out)['topics']
    assert sorted(p.name for p in tmp_path.iterdir()) == ['run.mcap']


def damage_middle_line(results):
    path = results / 'evaluations.jsonl'
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = lines[3][:20] + '\n'
    path.write_text(''.join(lines))


BAD = {
    'missing': (lambda r, b, o: (r.parent / 'nowhere', None), 'not a results directory'),
    'empty': (lambda r, b, o: (r / 'frames', None), 'not a results directory'),
    'damaged line': (lambda r, b, o: (damage_middle_line(r), r)[1:] + (None,), 'line 4 is damaged'),
    'damaged identity': (
        lambda r, b, o: ((r / 'search.json').write_text('{"id'), r)[1:] + (None,),
        'damaged identity record',
    ),
    'missing png': (
        lambda r, b, o: ([p.unlink() for p in (r / 'frames').iterdir()], r)[1:] + (None,),
        'named by a record but missing',
    ),
    'truncated png': (
        lambda r, b, o: (
            ([f.write_bytes(f.read_bytes()[:-30]) for f in (r / 'frames').iterdir()], r)[1:] + (None,)
        ),
        'damaged follow-up frame (truncated PNG',
    ),
    'another bag': (lambda r, b, o: (r, o), 'does not match the results'),
    # Cut short, as a copy interrupted half way leaves it.
    'truncated bag': (lambda r, b, o: (r, Path(shutil.copy(b, r.parent / 'cut.mcap'))), 'unreadable bag'),
}


@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, bag_search, tmp_path, capsys):
    bag, source, other = bag_search
    results = tmp_path / 'res'
    shutil.copytree(source, results)
    make, needle = BAD[case]
    target, use_bag = make(results, bag, other)
    if case == 'truncated bag':
        data = use_bag.read_bytes()
        use_bag.write_bytes(data[: len(data) // 2])
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    args = ['export', str(target), '--mcap', str(out_dir / 'x.mcap')]
    assert main(args + (['--bag', str(use_bag)] if use_bag else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: ') and err.count('\n') == 1 and needle in err, err
    assert list(out_dir.iterdir()) == []
