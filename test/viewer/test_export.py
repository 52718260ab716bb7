"""The export (viewer/export.py, `metavlm export`): real results directories to MCAP, read back, bad input."""

import gzip
import json
import shutil
from pathlib import Path

import cv2
import pytest

from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.cli import main
from metavlm_ros.common.gzip_lines import iter_members
from metavlm_ros.common.results import read_jsonl, records_file
from metavlm_ros.footage.bags import iter_bag_frames, write_bag
from metavlm_ros.ros.launcher import run_nodes
from test.campaign.configs import small_config
from test.conftest import make_frame, write_frames
from test.ros.test_run_command import write_params
from test.viewer.export_check import check_export, expected_violations
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


def violations_of(results):
    return expected_violations(results)


def test_export_holds_every_violation_at_its_frame_time_with_its_overlay(bag_search, tmp_path, capsys):
    bag, results, _ = bag_search
    out = tmp_path / 'run.mcap'
    assert main(['export', str(results), '--mcap', str(out), '--bag', str(bag)]) == 0
    assert str(out) in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ['run.mcap']  # no scratch left
    # The budget keeps few PNGs: most follow-ups must come from the stored source frames.
    kept = [r for r in read_jsonl(results / 'pareto.jsonl') if r['frame']]
    assert len(kept) < len(violations_of(results))
    data = check_export(results, out, tmp_path / 'scratch', bag_frames=bag_frames_of(bag))
    topics = data['topics']
    logged = topics['/metavlm/violations']
    assert all(schema.encoding == 'jsonschema' for _, _, schema in logged)
    schema = json.loads(logged[0][2].data)
    assert schema['title'] == 'metavlm.Violation' and 'f_trans' in schema['required']

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


def bag_frames_of(bag):
    return {f.stamp_ns: f.rgb for f in iter_bag_frames(bag)}


def test_without_a_bag_the_stored_source_frames_are_exported(bag_search, tmp_path, capsys):
    _, results, _ = bag_search
    out = tmp_path / 'run.mcap'
    assert main(['export', str(results), '--mcap', str(out)]) == 0
    line = capsys.readouterr().out
    assert 'rendered from stored source frames' in line and 'without a stored source frame' not in line
    data = check_export(results, out, tmp_path / 'scratch')
    stored = {s['source_frame'] for s in read_jsonl(results / 'summary.jsonl')}
    sources = data['topics']['/metavlm/source/image']
    # The stored files as they are: lossless, at the working size.
    assert {m.data for _, m, _ in sources} == {(results / name).read_bytes() for name in stored}


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
    logged = check_export(results, out, tmp_path / 'scratch')['topics']['/metavlm/violations']
    times = {m['image']: t for t, m, _ in logged}
    assert times == {'f1': 10**9, 'f2': 2 * 10**9}


def test_video_frames_are_laid_at_their_position_in_the_video(tmp_path, tiny_clip_dir):
    from metavlm_ros.footage.video import write_video

    # Frames 0 and 5 of a 5 fps video: 0 s and 1 s, where image files' first search would go.
    video = write_video(tmp_path / 'dive.mkv', [make_frame(64, 48, seed=i) for i in range(6)], fps=5.0)
    results = tmp_path / 'res'
    args = ['--population', '6', '--evaluations', '12', '--every', '5', '--out', str(results), str(video)]
    assert main(['search', '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet', *args]) == 0
    out = tmp_path / 'video.mcap'
    assert main(['export', str(results), '--mcap', str(out)]) == 0
    topics = check_export(results, out, tmp_path / 'scratch')['topics']
    times = {m['image']: t for t, m, _ in topics['/metavlm/violations']}
    assert times == {'dive@0': 0, 'dive@1000000000': 10**9}
    assert sorted(t for t, _, _ in topics['/metavlm/source/image']) == [0, 10**9]


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


def damage_middle_member(results):
    path = records_file(results / 'evaluations.jsonl')
    data = bytearray(path.read_bytes())
    data[list(iter_members(path))[1].start + 15] ^= 0xFF  # a generation's member that does not decompress
    path.write_bytes(bytes(data))


BAD = {
    'missing': (lambda r, b, o: (r.parent / 'nowhere', None), 'not a results directory'),
    'empty': (lambda r, b, o: (r / 'frames', None), 'not a results directory'),
    'damaged member': (lambda r, b, o: (damage_middle_member(r), r)[1:] + (None,), 'is damaged'),
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
    'truncated source': (
        lambda r, b, o: (
            ([f.write_bytes(f.read_bytes()[:-30]) for f in (r / 'sources').iterdir()], r)[1:] + (None,)
        ),
        'damaged source frame (truncated PNG',
    ),
    # A whole PNG of other pixels under the source's name: only the sha256 of its pixels tells.
    'source of other pixels': (
        lambda r, b, o: (
            (
                [cv2.imwrite(str(f), make_frame(64, 48, seed=99)) for f in (r / 'sources').iterdir()],
                r,
            )[1:]
            + (None,)
        ),
        'do not match the sha256',
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


@pytest.fixture(scope='module')
def campaign(tmp_path_factory, tiny_clip_dir):
    """A real campaign (tiny CLIP, one frame, both algorithms): its results folder."""
    root = tmp_path_factory.mktemp('campaign')
    images = root / 'images'
    images.mkdir()
    cv2.imwrite(str(images / 'img0.png'), make_frame(48, 36, seed=0)[..., ::-1])
    config = small_config(images, tiny_clip_dir, runs=1, evaluations=12)
    run_campaign(config, root / 'results', progress=False, threads=1)
    return root / 'results'


def test_a_campaign_cell_and_a_whole_campaign_are_exported(campaign, tmp_path):
    cells = sorted(p for p in (campaign / 'cells').iterdir() if not p.name.startswith('.'))
    assert len(cells) == 2
    out = tmp_path / 'cell.mcap'
    assert main(['export', str(cells[0]), '--mcap', str(out)]) == 0
    data = check_export(cells[0], out, tmp_path / 'scratch')
    assert data['attachments']['metavlm/cell.json'] == (cells[0] / 'cell.json').read_bytes()
    # The whole campaign: each cell under its own prefix, the campaign's record attached.
    whole = tmp_path / 'campaign.mcap'
    assert main(['export', str(campaign), '--mcap', str(whole)]) == 0
    for cell in cells:
        check_export(cell, whole, tmp_path / f'scratch-{cell.name}', prefix=f'/metavlm/cells/{cell.name}')
    attachments = read_mcap(whole)['attachments']
    assert attachments['campaign.json'] == (campaign / 'campaign.json').read_bytes()
    for cell in cells:
        assert attachments[f'metavlm.cells.{cell.name}/cell.json'] == (cell / 'cell.json').read_bytes()
        summary = records_file(cell / 'summary.jsonl')
        assert attachments[f'metavlm.cells.{cell.name}/{summary.name}'] == summary.read_bytes()


def _edit(path, old, new):
    if path.suffix == '.gz':  # the records, edited and compressed again: every line still whole
        path.write_bytes(
            gzip.compress(gzip.decompress(path.read_bytes()).replace(old.encode(), new.encode(), 1))
        )
        return
    path.write_text(path.read_text().replace(old, new, 1))


CELL_DAMAGE = {
    # One byte added to a record: the line still parses, only the cell's checksum tells.
    'record edited': (
        lambda c: _edit(c / 'summary.jsonl.gz', '"seed":', '"seed": '),
        'summary.jsonl.gz does not match',
    ),
    'source removed': (lambda c: [p.unlink() for p in (c / 'sources').iterdir()], '.png is missing'),
    'file added': (lambda c: (c / 'notes.txt').write_text('x'), 'notes.txt was not part of the cell'),
    'cell.json edited': (
        lambda c: _edit(c / 'cell.json', '"evaluations": 12', '"evaluations": 13'),
        'its checksum',
    ),
}


@pytest.mark.parametrize('damage', sorted(CELL_DAMAGE))
def test_a_damaged_campaign_cell_is_one_line_exit_2_and_writes_nothing(damage, campaign, tmp_path, capsys):
    cell = tmp_path / 'cell'
    shutil.copytree(sorted((campaign / 'cells').iterdir())[0], cell)
    make, needle = CELL_DAMAGE[damage]
    make(cell)
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    assert main(['export', str(cell), '--mcap', str(out_dir / 'x.mcap')]) == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: ') and err.count('\n') == 1, err
    assert 'damaged campaign cell' in err and needle in err, err
    assert list(out_dir.iterdir()) == []


@pytest.fixture(scope='module')
def tester_runs(tmp_path_factory, tiny_clip_dir):
    """The tester node's directories: `metavlm run` through the perception node, and in-process on a bag."""
    root = tmp_path_factory.mktemp('tester')
    folder = write_frames(root / 'frames', 2, 64, 48)
    # One violation PNG per search: the others' follow-ups must be rendered from the stored source.
    params = write_params(root, tiny_clip_dir, violation_pngs_per_search=1)
    assert main(['run', '--params', str(params), '--source', str(folder), '--rate', '4']) == 0
    bag = write_bag(root / 'bag', [(make_frame(64, 48, seed=7), None)], fps=10.0, start_ns=5_000_000_000)
    inprocess = root / 'inprocess'
    run_nodes(
        write_params(root, tiny_clip_dir, vlm_endpoint='inprocess', violation_pngs_per_search=1),
        source=bag,
        duration=1.5,
        loop=False,
        results_dir=inprocess,
        log=lambda line: None,
    )
    return root / 'results', inprocess, bag


@pytest.mark.parametrize('which', ['metavlm run', 'tester in-process, with its bag'])
def test_a_testers_results_are_exported(tester_runs, which, tmp_path):
    run, inprocess, bag = tester_runs
    results = run if which == 'metavlm run' else inprocess
    out = tmp_path / 'tester.mcap'
    args = ['export', str(results), '--mcap', str(out)]
    frames = None
    if results == inprocess:
        args += ['--bag', str(bag)]
        frames = bag_frames_of(bag)
    assert any(r['frame'] is None for r in read_jsonl(results / 'violations.jsonl'))
    assert main(args) == 0
    check_export(results, out, tmp_path / 'scratch', bag_frames=frames)


def test_searches_cut_short_keep_their_violations_without_follow_ups(bag_search, tmp_path, capsys):
    # Killed mid-search: records only, no summary naming a stored source frame, no non-dominated set.
    _, source, _ = bag_search
    results = tmp_path / 'res'
    shutil.copytree(source, results)
    for name in ('summary.jsonl', 'pareto.jsonl'):
        records_file(results / name).unlink()
    shutil.rmtree(results / 'frames')
    out = tmp_path / 'cut.mcap'
    assert main(['export', str(results), '--mcap', str(out)]) == 0
    expected = violations_of(results)
    line = capsys.readouterr().out
    assert f'{len(expected)} violation(s) of searches without a stored source frame have no follow-up' in line
    topics = read_mcap(out)['topics']
    assert len(topics['/metavlm/violations']) == len(expected) > 0
    assert '/metavlm/followup/image' not in topics and '/metavlm/source/image' not in topics
