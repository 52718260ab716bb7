"""The console scripts end with their command's exit status, even when a signal comes during teardown."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# An object that, while the interpreter tears down, is sent SIGINT (as `ros2 launch` or a terminal's
# Ctrl-C would, just as the command finished) and then lingers a moment.
LATE_SIGNAL = """
import os, signal, sys, time
class Late:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
holder = type(sys)('late_holder')
holder.late = Late()
sys.modules['late_holder'] = holder
"""


def _run(code: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', LATE_SIGNAL + code, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_a_signal_during_teardown_leaves_the_exit_status_of_the_finished_command(tmp_path):
    out = str(tmp_path / 'dive.mcap')
    done = _run(
        'from metavlm_ros.cli import entry_point; sys.argv[0] = "metavlm"; entry_point()',
        'scenes', '--out', out, '--frames', '1', '--size', '32x24',
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert 'wrote 1 frames' in done.stdout


def test_finish_keeps_a_failing_status_too():
    done = _run('from metavlm_ros.common.process import finish; finish(2)')
    assert done.returncode == 2
