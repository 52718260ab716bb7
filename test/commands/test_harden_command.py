"""`metavlm harden` as a user runs it: the README's loop (scenes, verify, harden with its gate) run as
written on the demo CLIP's update demo-clip-v2, smaller; the model card read with jq; the model loads
again; the evidence of the verify is trained on and named by sha256; a detector is hardened on boxes;
bad input is one line and exit 2."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from metavlm_ros.cli import main
from metavlm_ros.models.vlm import create_backend
from test.conftest import make_frame

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / 'metavlm_ros' / 'models' / 'demo-clip-v2'
BUDGET = ['--steps', '3', '--batch', '2', '--validation-followups', '2']
#: What the test shrinks in the README's loop, and nothing else: every name and every other option stays
#: as written (2 frames a scene instead of 12 and 4; the search, training and gate cut to seconds).
SMALLER = {
    '--frames 12': '--frames 3',
    '--frames 4': '--frames 2',
    '--size 480x270': '--size 96x54',
    '--evaluations 300': '--evaluations 10',
    '--population 20': '--population 5',
    '--envelope-rounds 2': '--envelope-rounds 1',
    '--steps 150': '--steps 3 --batch 2 --validation-followups 2 --evaluations 10 --population 5 '
    '--envelope-rounds 1',
}


def _jq(path: Path, program: str):
    done = subprocess.run(['jq', '-c', program, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _weights_sha256(directory: Path) -> str:
    digest = hashlib.sha256(b'model.safetensors')
    digest.update((directory / 'model.safetensors').read_bytes())
    return digest.hexdigest()


def readme_loop() -> list[str]:
    """The shell lines of the README's block under 'From a FAIL to a better model', continuations joined."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = text[text.index('## From a FAIL to a better model') :]
    block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
    return [line for line in block.replace('\\\n', ' ').splitlines() if line.strip()]


@pytest.fixture(scope='module')
def hardened(tmp_path_factory):
    """The README's loop run as written, from a folder that holds the repository's config and package."""
    root = tmp_path_factory.mktemp('loop')
    for name in ('config', 'metavlm_ros'):
        (root / name).symlink_to(ROOT / name)
    env = {
        **os.environ,
        'PATH': f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}',
        'HF_HUB_OFFLINE': '1',
    }
    script = []
    for line in readme_loop():
        for written, smaller in SMALLER.items():
            line = line.replace(written, smaller)
        script.append(line)
    codes = {}
    for line in script:
        if not line.startswith(('for ', 'metavlm ')):
            continue  # an assignment: carried into every later line
        assignments = [a for a in script if re.match(r'^[A-Z0-9_]+=', a)]
        done = subprocess.run(
            ['bash', '-c', '\n'.join([*assignments, line])],
            cwd=root, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        codes[line.split()[1] if line.startswith('metavlm') else 'scenes'] = done.returncode
        # verify exits 1 on FAIL and 3 on INCONCLUSIVE; harden 1 on a regression; anything else is an error.
        assert done.returncode in (0, 1, 3), f'{line}\nexited {done.returncode}:\n{done.stderr[-2000:]}'
    return root, codes['harden']


def test_the_hardened_model_its_card_and_its_gate(hardened, capsys):
    root, code = hardened
    model = root / 'models' / 'demo-clip-v2-hardened'
    card = model / 'harden.json'
    compared = json.loads((model / 'gate' / 'compare' / 'compare.json').read_text())
    assert code == (1 if compared['regressed'] else 0)
    assert _jq(card, '.base.weights_sha256') == _weights_sha256(V2)
    assert _jq(card, '.model.weights_sha256') == _weights_sha256(model)
    frames = _jq(card, '.frames')
    # train-21 .. train-24 of 3 frames each, heldout-31 and heldout-32 of 2.
    assert len(set(frames['train']) | set(frames['validation'])) == 12 and len(frames['heldout']) == 4
    assert not set(frames['heldout']) & set(frames['train'])
    assert _jq(card, '.training.loss.every_step | length') == 3
    for side in ('base', 'hardened'):
        verdict = json.loads((model / 'gate' / f'verify-{side}' / 'verdict.json').read_text())
        assert _jq(card, f'.gate.outcome.{side}') == verdict['overall']
    assert _jq(card, '.gate.comparison') == compared['outcome']
    assert [c['item'] for c in _jq(card, '.gate.changes')] == [c['item'] for c in compared['changes']]
    # The footage has ground truth: clean accuracy on the held-out frames, before and after (4 frames
    # are too few for a presence AUC: not measured rather than a figure of chance).
    assert _jq(card, '.gate.accuracy') == {'base': None, 'hardened': None}
    assert _jq(card, '.gate.accuracy_measure') == 'presence AUC'
    assert 'presence AUC on the held-out frames not measured' in _jq(card, '.gate.summary')
    assert (model / 'README.md').read_text().startswith('# Hardened model: demo-clip-v2-hardened')
    # The hardened model is a model like the base: the backend loads it from its directory alone.
    answers = create_backend('clip', str(model)).predict([make_frame(48, 36)])
    assert set(answers[0].values) == {'animal', 'vegetation', 'object', 'trash'}


def test_the_evidence_of_the_verify_is_trained_on_and_named(hardened):
    root, _ = hardened
    evidence = root / 'results' / 'verify-v2' / 'evidence'
    records = pd.concat(
        [pd.read_json(p, lines=True) for p in evidence.rglob('evaluations.jsonl*')], ignore_index=True
    )
    card = root / 'models' / 'demo-clip-v2-hardened' / 'harden.json'
    threshold = _jq(card, '.settings.threshold')
    violated = records[records['violation'].map(lambda v: bool(v.get(f'{threshold:g}')))]
    plan = _jq(card, '.plan')
    distinct = {json.dumps(p, sort_keys=True) for p in violated['parameters']}
    assert len(plan['broken']) == len(distinct)
    (named,) = _jq(card, '.evidence')
    assert named['root'] == 'results/verify-v2/evidence' and named['files']
    for name, digest in named['files'].items():
        assert hashlib.sha256((evidence / name).read_bytes()).hexdigest() == digest


@pytest.mark.parametrize(
    ('extra', 'message'),
    [
        (['--heldout', 'X', '--out', '{model}'], 'holds a hardened model already'),
        (['--out', '{new}'], 'give --heldout'),
        (['--no-gate', '--resume', '--out', '{new}'], 'no training/checkpoint.pt'),
        (['--no-gate', '--steps', '0', '--out', '{new}'], '--steps out of range'),
    ],
)
def test_bad_input_is_one_line_and_exit_2(hardened, tiny_clip_dir, capsys, extra, message):
    root, _ = hardened
    extra = [e.format(model=root / 'models' / 'demo-clip-v2-hardened', new=root / 'new') for e in extra]
    if 'X' in extra:
        extra[extra.index('X')] = str(root / 'heldout-31')
    code = main(['harden', str(root / 'train-21'), '--model', str(tiny_clip_dir), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (root / 'new').exists()


def test_a_detector_is_hardened_on_boxes_and_judged_by_detection_f1(hardened, tiny_model_dirs, capsys):
    root, _ = hardened
    model = ['--backend', 'detector', '--model', str(tiny_model_dirs('detector', family='owlvit'))]
    model += ['--score-threshold', '0.05']
    # A search of the same detector first: its box violations (key iou0.5) are what harden replays.
    search = root / 'detector-search'
    command = ['search', str(root / 'train-21'), *model, '--population', '5', '--evaluations', '10']
    assert main([*command, '--out', str(search)]) == 0
    records = pd.concat([pd.read_json(p, lines=True) for p in search.rglob('evaluations.jsonl*')])
    violated = records[records['violation'].map(lambda v: bool(v.get('iou0.5')))]
    assert len(violated)  # a random tiny detector's boxes move under any change
    out = root / 'detector'
    command = ['harden', str(root / 'train-21'), str(root / 'train-22'), '--no-gate', *model]
    assert main([*command, '--results', str(search), '--out', str(out), *BUDGET]) == 0
    distinct = {json.dumps(p, sort_keys=True) for p in violated['parameters']}
    assert len(_jq(out / 'harden.json', '.plan.broken')) == len(distinct)
    validation = _jq(out / 'harden.json', '.validation')
    # The scenes' true boxes reach the validation frames: their clean accuracy is detection F1, measured.
    assert {v['accuracy_measure'] for v in validation.values()} == {'detection F1 at IoU 0.5'}
    assert all(v['accuracy'] is not None and 0 <= v['accuracy'] <= 1 for v in validation.values())
    assert '| detection F1 at IoU 0.5 |' in (out / 'README.md').read_text()
    again = create_backend('detector', str(out), score_threshold=0.05).predict([make_frame(48, 36)])
    assert again[0].kind == 'detection'
