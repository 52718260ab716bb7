"""docs/assurance.md's commands run as written, one after the other: scenes, verify of two model
versions, compare, verify of the evidence again; each answers with the exit status it documents."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METAVLM = Path(sys.executable).parent / 'metavlm'


def _commands() -> list[list[str]]:
    text = (ROOT / 'docs' / 'assurance.md').read_text(encoding='utf-8')
    block = re.search(r'```bash\n(.*?)```', text, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def test_the_assurance_commands_run_as_written(tmp_path):
    # They run from the repository root: the criteria in config/, demo-clip-v2 under metavlm_ros/.
    (tmp_path / 'config').symlink_to(ROOT / 'config')
    (tmp_path / 'metavlm_ros').symlink_to(ROOT / 'metavlm_ros')
    codes = []
    for words in _commands():
        assert words[0] == 'metavlm'
        done = subprocess.run(
            [str(METAVLM), *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert done.returncode in (0, 1, 3), (
            f'{shlex.join(words)} exited {done.returncode}:\n{done.stderr[-2000:]}'
        )
        codes.append((words[1], done.returncode))
    assert [name for name, _ in codes] == ['scenes', 'verify', 'verify', 'compare', 'verify']
    results = tmp_path / 'results'
    first = json.loads((results / 'verify' / 'verdict.json').read_text())
    # Each command's exit status is its documented outcome.
    assert codes[1][1] == {'PASS': 0, 'FAIL': 1, 'INCONCLUSIVE': 3}[first['overall']]
    compared = json.loads((results / 'compare' / 'compare.json').read_text())
    assert codes[3][1] == (1 if compared['regressed'] else 0)
    assert compared['regressed'], "demo-clip-v2 is the docs' example of a regression"
    again = json.loads((results / 'verdict' / 'verdict.json').read_text())
    assert [v['status'] for v in again['verdicts']] == [v['status'] for v in first['verdicts']]
    assert again['configuration']['evidence']['manifest'] == 'SHA256SUMS verified'
    assert (tmp_path / 'verdict.xml').is_file() and (tmp_path / 'compare.xml').is_file()
    assert len(first['configuration']['frames']) == 4
