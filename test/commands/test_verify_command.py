"""`metavlm verify --results`: verdicts judged again from evidence as it is, exit status by the outcome,
Markdown / HTML / JSON and JUnit XML read by a real JUnit consumer; tampered evidence refused."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from junitparser import Failure, JUnitXml, Skipped

from metavlm_ros.cli import main
from metavlm_ros.common.manifest import write_manifest
from metavlm_ros.method.encoding import SearchSpace
from test.assurance.evidence import write_run

EXAMPLE = Path(__file__).resolve().parents[2] / 'config' / 'criteria' / 'aur_camera.yaml'

CALM = {'downsampling': [0.98, 1.0]}
PASSING = [
    {'id': 'calm', 'kind': 'existence', 'within': CALM},
    {'id': 'calm-rate', 'kind': 'rate', 'within': CALM, 'limit': 0.05},
]
FAILING = {'id': 'anything', 'kind': 'existence', 'f_trans_max': 6}
OPEN = {'id': 'murky', 'kind': 'rate', 'within': {'turbidity': [0, 1]}, 'limit': 0.1}


@pytest.fixture(scope='module')
def evidence(tmp_path_factory):
    root = tmp_path_factory.mktemp('verify') / 'evidence'
    write_run(root / 'search', 'nsga2', evaluations=40)
    write_run(
        root / 'calm',
        'uniform',
        space=SearchSpace.from_options(['downsampling'], {'downsampling': (0.98, 1)}),
    )
    return root


def _criteria(tmp_path, criteria):
    path = tmp_path / 'criteria.yaml'
    path.write_text(
        yaml.safe_dump({'format': 1, 'name': 'test camera', 'threshold': 0.03, 'criteria': criteria})
    )
    return path


@pytest.mark.parametrize(
    'criteria, code, outcome',
    [(PASSING, 0, 'PASS'), ([*PASSING, OPEN], 3, 'INCONCLUSIVE'), ([*PASSING, OPEN, FAILING], 1, 'FAIL')],
    ids=['pass', 'inconclusive', 'fail'],
)
def test_exit_status_reports_and_junit_follow_the_verdicts(
    evidence, tmp_path, capsys, criteria, code, outcome
):
    path = _criteria(tmp_path, criteria)
    out, junit = tmp_path / 'verdict', tmp_path / 'verdict.xml'
    args = [
        'verify',
        '--criteria',
        str(path),
        '--results',
        str(evidence),
        '--out',
        str(out),
        '--junit',
        str(junit),
    ]
    assert main(args) == code
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1].startswith(f'{outcome}: test camera ({len(criteria)} criteria;')
    record = json.loads((out / 'verdict.json').read_text())
    assert record['overall'] == outcome
    assert [v['criterion'] for v in record['verdicts']] == [c['id'] for c in criteria]
    assert record['configuration']['criteria']['sha256'] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert set(record['configuration']['frames']) == {'a', 'b', 'c'}
    assert all(len(digest) == 64 for digest in record['configuration']['frames'].values())
    assert (out / 'verdict.md').read_text().startswith(f'# Verdict: {outcome}')
    assert '<table>' in (out / 'verdict.html').read_text()
    # A real JUnit consumer reads it as CI servers do.
    xml = JUnitXml.fromfile(str(junit))
    (suite,) = list(xml)
    cases = {case.name: case for case in suite}
    assert list(cases) == [c['id'] for c in criteria]
    statuses = {v['criterion']: v['status'] for v in record['verdicts']}
    for name, case in cases.items():
        kinds = {type(result) for result in case.result}
        expected = {'PASS': set(), 'FAIL': {Failure}, 'INCONCLUSIVE': {Skipped}}[statuses[name]]
        assert kinds == expected, name
    assert suite.failures == list(statuses.values()).count('FAIL')
    assert suite.skipped == list(statuses.values()).count('INCONCLUSIVE')
    # A FAIL names the failure modes that hold its violations, written beside the verdict.
    assert (out / 'modes').is_dir() == (outcome == 'FAIL')
    if outcome == 'FAIL':
        modes = [json.loads(line) for line in (out / 'modes' / 'modes.json').read_text().splitlines()]
        broken = [m for m in modes if m['breaks'] == ['anything']]
        assert broken and all(m['breaks'] == [] for m in modes if m not in broken)
        line = printed.split('FAIL         anything: ')[1].splitlines()[2]
        assert (
            line.startswith('             failure modes: ')
            and f'{broken[0]["rank"]}. {broken[0]["rule"]} (' in line
        )
        assert '| anything |' in (out / 'modes' / 'modes.md').read_text()
        # verdict.md names them under the failing criterion, every one, with a link to the catalogue.
        said = (out / 'verdict.md').read_text().split('## anything: FAIL')[1].split('\n## ')[0]
        shown = said.split('### Failure modes')[1]
        assert '(modes/modes.md)' in shown
        bullets = [b[2:] for b in shown.splitlines() if b.startswith('- ')]
        assert sorted(int(b.split('.')[0]) for b in bullets) == sorted(m['rank'] for m in broken)
        assert f'{broken[0]["rank"]}. {broken[0]["rule"]} (' in shown
        # The console's line is the first of the same lines.
        assert line.removeprefix('             failure modes: ').startswith('; '.join(bullets[:3]))
        # So does the failing testcase of the JUnit XML, as a CI's view shows it.
        named = json.loads(cases['anything'].result[0].text)['failure_modes']
        assert named == {'modes': bullets, 'catalogue': str(out / 'modes' / 'modes.md')}
    else:
        assert 'Failure modes' not in (out / 'verdict.md').read_text()
        assert 'failure_modes' not in junit.read_text()
    properties = {p.name: p.value for p in suite.properties()}
    assert properties['criteria.sha256'] == record['configuration']['criteria']['sha256']
    assert properties['frame.a.sha256'] == record['configuration']['frames']['a']


def test_evidence_that_does_not_match_its_manifest_is_refused(evidence, tmp_path, capsys):
    copy = tmp_path / 'evidence'
    shutil.copytree(evidence, copy)
    write_manifest(copy)
    path = _criteria(tmp_path, PASSING)
    args = ['verify', '--criteria', str(path), '--results', str(copy), '--out', str(tmp_path / 'v')]
    assert main(args) == 0
    assert 'SHA256SUMS verified' in (tmp_path / 'v' / 'verdict.md').read_text()
    with open(copy / 'calm' / 'summary.jsonl.gz', 'ab') as handle:
        handle.write(b'\0')
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == f'metavlm: error: {copy}: calm/summary.jsonl.gz does not match SHA256SUMS (changed since)\n'


def test_a_verdict_is_never_written_into_the_evidence(evidence, tmp_path, capsys):
    path = _criteria(tmp_path, PASSING)
    assert (
        main(['verify', '--criteria', str(path), '--results', str(evidence), '--out', str(evidence / 'v')])
        == 2
    )
    assert 'inside the evidence' in capsys.readouterr().err
    assert not (evidence / 'v').exists()


def test_verify_searches_frames_as_the_criteria_need_then_judges_and_the_evidence_judges_again(
    tmp_path, capsys
):
    """The README's form: FRAMES, the demo model, the shipped criteria; then --results on its output."""
    import subprocess

    from metavlm_ros.assurance.criteria import load_criteria
    from metavlm_ros.assurance.gather import plan
    from test.conftest import write_frames

    frames = write_frames(tmp_path / 'frames', 3, 96, 64)
    out = tmp_path / 'verify'
    args = ['verify', str(frames), '--criteria', str(EXAMPLE), '--model', 'demo', '--evaluations', '30',
            '--population', '10', '--envelope-rounds', '2', '--out', str(out)]  # fmt: skip
    code = main(args)
    printed = capsys.readouterr().out
    record = json.loads((out / 'verdict.json').read_text())
    assert code == {'PASS': 0, 'FAIL': 1, 'INCONCLUSIVE': 3}[record['overall']]
    planned = plan(load_criteria(EXAMPLE), population=10, evaluations=30, seed=0, working_size='auto',
                   envelope_rounds=2)  # fmt: skip
    assert sorted(p.name for p in (out / 'evidence').iterdir()) == sorted(s.name for s in planned)
    assert [s.name for s in planned] == ['search', 'existence-survey-roll', 'rate-turbid-water', 'envelope']
    # The rate claim got its 50 uniform samples a frame, the boundary search 2 rounds of rotation +-.
    rate = next(v for v in record['verdicts'] if v['criterion'] == 'turbid-water')
    assert rate['figures']['samples'] == 150
    assert 'search (small-changes): nsga2, 30 evaluations a frame on 3 frame(s)' in printed
    done = subprocess.run(['sha256sum', '--check', '--quiet', 'SHA256SUMS'], cwd=out, capture_output=True)
    assert done.returncode == 0, done.stdout
    # A FAIL's failure modes beside the verdict, listed in SHA256SUMS with it.
    assert (out / 'modes' / 'modes.json').is_file() == (record['overall'] == 'FAIL')
    assert ('modes/modes.json' in (out / 'SHA256SUMS').read_text()) == (record['overall'] == 'FAIL')
    # Judged again from the evidence alone: the same verdicts, and the manifest checked.
    again = tmp_path / 'again'
    code_again = main(['verify', '--criteria', str(EXAMPLE), '--results', str(out), '--out', str(again)])
    assert code_again == code
    rejudged = json.loads((again / 'verdict.json').read_text())
    assert [v['status'] for v in rejudged['verdicts']] == [v['status'] for v in record['verdicts']]
    assert rejudged['configuration']['evidence']['manifest'] == 'SHA256SUMS verified'
    # A second run into the same OUT is refused before any model loads; OUT is untouched.
    before = (out / 'SHA256SUMS').read_bytes()
    assert main(args) == 2
    assert 'exists; name a new directory' in capsys.readouterr().err
    assert (out / 'SHA256SUMS').read_bytes() == before


def test_frames_and_results_together_or_neither_are_refused(tmp_path, capsys):
    for extra in ([str(tmp_path), '--results', str(tmp_path)], []):
        assert main(['verify', '--criteria', str(EXAMPLE), *extra]) == 2
        assert 'give FRAMES to search them, or --results DIR' in capsys.readouterr().err


def test_a_campaign_cell_that_does_not_match_its_checksums_is_refused(tmp_path, capsys):
    from test.common.test_upgrade import _commit_with_checksums

    campaign = tmp_path / 'campaign'
    shutil.copytree(Path(__file__).resolve().parents[1] / 'fixtures' / 'campaign_results', campaign)
    cell = sorted((campaign / 'cells').iterdir())[0]
    _commit_with_checksums(cell)
    with open(cell / 'evaluations.jsonl', 'ab') as handle:
        handle.write(b'\n')
    path = _criteria(tmp_path, PASSING)
    assert (
        main(['verify', '--criteria', str(path), '--results', str(campaign), '--out', str(tmp_path / 'v')])
        == 2
    )
    assert (
        capsys.readouterr().err == f'metavlm: error: {cell}: evaluations.jsonl does not match its checksum\n'
    )


def test_a_fail_of_searched_frames_writes_its_modes_inside_the_verification_and_its_manifest(
    tmp_path, tiny_clip_dir, capsys
):
    import subprocess

    from test.conftest import write_frames

    frames = write_frames(tmp_path / 'frames', 1, 48, 36)
    out = tmp_path / 'verify'
    criteria = _criteria(tmp_path, [FAILING])
    args = ['verify', str(frames), '--criteria', str(criteria), '--backend', 'clip', '--model',
            str(tiny_clip_dir), '--evaluations', '40', '--population', '20', '--out', str(out)]  # fmt: skip
    assert main(args) == 1
    printed = capsys.readouterr().out
    assert 'failure modes: 1. ' in printed and f'failure modes, and the criteria they break: {out}' in printed
    assert 'modes/modes.json' in (out / 'SHA256SUMS').read_text()
    assert '### Failure modes' in (out / 'verdict.md').read_text()
    done = subprocess.run(['sha256sum', '--check', '--quiet', 'SHA256SUMS'], cwd=out, capture_output=True)
    assert done.returncode == 0, done.stdout


def test_criteria_of_water_over_the_footages_ranges_search_with_each_frames_map(tmp_path, capsys):
    """`water_ranges: truth` in a criteria file: the searches of MR12 take each frame's range map (and
    keep it with their evidence), the others none; footage without maps is refused in one line."""
    from metavlm_ros.common.results import read_jsonl

    scenes = tmp_path / 'scenes'
    size = ['--size', '64x48', '--frames', '2', '--seed', '3', '--environment', 'pool']
    assert main(['scenes', '--out', str(scenes), '--format', 'png', *size]) == 0
    claim = {'id': 'harbour', 'kind': 'envelope', 'relation': 'water', 'within': {'water_type': ['5C', '5C']},
             'at_least': 1, 'frames': 0.5}  # fmt: skip
    path = tmp_path / 'criteria.yaml'
    document = {'format': 1, 'name': 'harbour', 'water_ranges': 'truth', 'criteria': [claim, FAILING]}
    path.write_text(yaml.safe_dump(document))
    out = tmp_path / 'verify'
    args = ['verify', str(scenes), '--criteria', str(path), '--model', 'demo', '--evaluations', '12',
            '--population', '6', '--envelope-rounds', '2']  # fmt: skip
    assert main([*args, '--out', str(out)]) in (0, 1, 3)
    settings = {
        d.name: json.loads((d / 'search.json').read_text())['identity']['settings']
        for d in (out / 'evidence').iterdir()
    }
    envelope = out / 'evidence' / 'envelope-harbour-type5C'
    assert settings[envelope.name]['water_ranges'] == 'truth' and 'water_ranges' not in settings['search']
    maps = {s['source_ranges'] for s in read_jsonl(envelope / 'summary.jsonl')}
    assert len(maps) == 2 and all((envelope / m).is_file() for m in maps)
    rows = json.loads((out / 'verdict.json').read_text())['envelope']
    assert [r['row'] for r in rows if r['direction'] == 'water+'] == ['water+ (Jerlov 5C, at the surface)']
    shutil.rmtree(scenes / 'ranges')
    capsys.readouterr()
    assert main([*args, '--out', str(tmp_path / 'none')]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'no range map' in err[0] and 'frame_000000.png' in err[0], err
