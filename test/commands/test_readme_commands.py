"""The README's pip-only commands run as written (smaller sizes and durations), one after the other."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from metavlm_ros.common.results import read_jsonl, records_file

ROOT = Path(__file__).resolve().parents[2]
METAVLM = Path(sys.executable).parent / 'metavlm'
# What the test shrinks, and nothing else: every name and every other option stays as written.
SMALLER = {'--frames': '4', '--duration': '8', '--evaluations': '12'}
EXTRA = {'scenes': ['--size', '160x90']}
COMMANDS = ('scenes', 'run', 'replay', 'search')


def readme_commands() -> list[list[str]]:
    """The `metavlm scenes|run|replay|search` lines of the README's pip-only block, in order."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = text[text.index('## Running with pip only') :]
    block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
    lines = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ['metavlm'] and words[1] in COMMANDS:
            lines.append(words)
    return lines


def shrink(words: list[str]) -> list[str]:
    out = list(words)
    for i, word in enumerate(out[:-1]):
        if word in SMALLER:
            out[i + 1] = SMALLER[word]
    return out + EXTRA.get(words[1], [])


def test_the_readme_names_the_same_bag_in_every_command():
    lines = readme_commands()
    assert [words[1] for words in lines] == ['scenes', 'run', 'replay', 'search']
    bag = lines[0][lines[0].index('--out') + 1]
    assert bag.endswith('.mcap')
    assert all(bag in words for words in lines[1:]), 'run, replay and search read the bag scenes wrote'


def test_the_readme_commands_run_as_written(tmp_path):
    if not METAVLM.exists():
        pytest.skip(f'{METAVLM} is not installed (tools/setup.sh installs it)')
    (tmp_path / 'config').symlink_to(ROOT / 'config')  # the README runs from the repository root
    env = {**os.environ, 'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST', 'HF_HUB_OFFLINE': '1'}
    outputs = {}
    for words in readme_commands():
        argv = shrink(words)
        done = subprocess.run(
            [str(METAVLM), *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, f'{shlex.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}'
        outputs[words[1]] = done.stdout

    bag = tmp_path / 'dive.mcap'
    assert bag.is_file() and not (tmp_path / 'dive').exists()
    assert '4 frame(s) published' in outputs['run']
    assert records_file(tmp_path / 'results' / 'ros' / 'evaluations.jsonl').is_file()
    # Four frames, their camera info, ground truth and range maps.
    assert 'published 16 messages on 4 topic(s)' in outputs['replay'], outputs['replay']
    summaries = read_jsonl(tmp_path / 'results' / 'dive' / 'summary.jsonl')
    assert [s['image'].split('@')[0] for s in summaries] == ['dive']
