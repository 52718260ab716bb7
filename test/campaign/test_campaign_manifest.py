"""A campaign's SHA256SUMS (campaign/runner.py): `sha256sum -c` verifies it, `metavlm report` keeps it
true (the report listed), and `verify --results` / `compare` refuse a campaign that no longer matches."""

import shutil
import subprocess
from pathlib import Path

import pytest

from metavlm_ros.campaign.runner import run_campaign
from metavlm_ros.cli import main
from metavlm_ros.common.manifest import MANIFEST
from test.campaign.configs import small_config
from test.conftest import write_frames

CRITERIA = Path(__file__).resolve().parents[2] / 'config' / 'criteria' / 'aur_camera.yaml'
SHA256SUM = shutil.which('sha256sum')


def sha256sum_check(directory: Path) -> subprocess.CompletedProcess:
    """GNU coreutils' own check, as an assessor runs it in the campaign's directory."""
    return subprocess.run(
        [SHA256SUM, '--check', '--strict', MANIFEST], cwd=directory, capture_output=True, text=True
    )


def listed(directory: Path) -> list[str]:
    return [line.split('  ', 1)[1] for line in (directory / MANIFEST).read_text().splitlines()]


@pytest.fixture(scope='module')
def made(tmp_path_factory, tiny_clip_dir):
    """One small campaign (two frames, one random search each) and its configuration."""
    root = tmp_path_factory.mktemp('manifest')
    images = write_frames(root / 'images', 2, 48, 36, stem='img')
    config = small_config(images, tiny_clip_dir, runs=1, algorithms=['random'], evaluations=12)
    run_campaign(config, root / 'campaign', progress=False, threads=1)
    return root / 'campaign', config


@pytest.fixture
def campaign(made):
    return made[0]


@pytest.fixture
def copy(campaign, tmp_path):
    """The campaign, copied for a test that changes it."""
    target = tmp_path / 'campaign'
    shutil.copytree(campaign, target, ignore=shutil.ignore_patterns('.lock'))
    return target


pytestmark = pytest.mark.skipif(SHA256SUM is None, reason='needs coreutils sha256sum')


def test_sha256sum_verifies_a_campaign_and_the_report_written_into_it(copy, capsys):
    checked = sha256sum_check(copy)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = listed(copy)
    assert 'campaign.json' in names and 'frames/img0.png' in names
    assert any(name.startswith('cells/') and name.endswith('/cell.json') for name in names)
    assert not any(name.startswith('.') or '/.' in name for name in names)  # no lock, no scratch

    assert main(['report', str(copy), '--no-plots']) == 0
    assert f'{MANIFEST} of {copy} rewritten: it lists the report' in capsys.readouterr().err
    assert 'report/report.md' in listed(copy)
    checked = sha256sum_check(copy)
    assert checked.returncode == 0 and 'report/report.md: OK' in checked.stdout

    # A report written elsewhere leaves the campaign's manifest as it was.
    before = (copy / MANIFEST).read_bytes()
    assert main(['report', str(copy), '--no-plots', '--out', str(copy.parent / 'elsewhere')]) == 0
    assert (copy / MANIFEST).read_bytes() == before


def test_a_tampered_campaign_is_refused_in_one_line_by_verify_compare_and_sha256sum(copy, campaign, capsys):
    frame = copy / 'frames' / 'img1.png'
    frame.write_bytes(frame.read_bytes() + b'\0')
    checked = sha256sum_check(copy)
    assert checked.returncode == 1 and 'frames/img1.png: FAILED' in checked.stdout
    refusal = f'metavlm: error: {copy}: frames/img1.png does not match {MANIFEST} (changed since)\n'
    capsys.readouterr()
    verify = ['verify', '--criteria', str(CRITERIA), '--results', str(copy), '--out', str(copy.parent / 'v')]
    assert main(verify) == 2
    assert capsys.readouterr().err == refusal
    for pair in ([str(copy), str(campaign)], [str(campaign), str(copy)]):
        assert main(['compare', *pair, '--out', str(copy.parent / 'c')]) == 2
        assert capsys.readouterr().err == refusal
    assert not (copy.parent / 'v').exists() and not (copy.parent / 'c').exists()

    # A report into it is written, but the manifest is not rewritten over the change: it still refuses.
    before = (copy / MANIFEST).read_bytes()
    assert main(['report', str(copy), '--no-plots']) == 0
    err = capsys.readouterr().err
    assert f'{MANIFEST} of {copy} left as it was: {copy}: ' in err
    assert (copy / MANIFEST).read_bytes() == before
    assert main(verify) == 2


def test_running_the_campaign_again_rewrites_its_manifest_and_says_when_it_did_not_match(copy, made):
    (copy / 'notes.txt').write_text('added by hand\n')
    said = []
    run_campaign(made[1], copy, progress=False, threads=1, log=said.append)
    assert any(line.startswith(f'{MANIFEST} did not match') and 'notes.txt' in line for line in said)
    assert 'notes.txt' in listed(copy) and sha256sum_check(copy).returncode == 0
