"""Scratch files of a killed writer are removed when the directory is next used; evidence never is."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np

from metavlm_ros.common.results import ResultsStore, read_jsonl
from metavlm_ros.common.scratch import remove_stale, scratch_path

# A writer killed with SIGKILL in the middle of a follow-up PNG: part of it is written.
KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from metavlm_ros.common import results

    def stalled(path, final):  # the PNG is written to its scratch path, not yet renamed
        with open(path, 'r+b') as handle:
            handle.truncate(40)
        print(path, flush=True)
        time.sleep(120)

    results.os.replace = stalled
    results.ResultsStore(sys.argv[1]).save_frame('camera_7_violation_e00003', np.zeros((32, 32, 3), np.uint8))
    """
)


def test_a_png_left_by_a_killed_run_is_removed_on_the_next_start_and_evidence_is_kept(tmp_path):
    results = tmp_path / 'results'
    with ResultsStore(results) as store:
        store.append_evaluation({'image': 'a', 'index': 0})
        kept = store.save_frame('camera_1_violation_e00001', np.full((8, 8, 3), 200, np.uint8))
    (results / 'frames' / 'notes.txt').write_text('a user note')
    writer = subprocess.Popen(
        [sys.executable, '-c', KILLED_WRITER, str(results)], stdout=subprocess.PIPE, text=True
    )
    partial = writer.stdout.readline().strip()
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(10)
    assert partial and os.path.exists(partial), 'the killed writer should have left its scratch PNG'
    legacy = results / 'frames' / 'camera_2_violation_e00002.tmp.png'  # the name before pids
    legacy.write_bytes(b'\x89PNG cut short')

    # A scratch file of a writer that still runs is not ours to remove.
    alive = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        busy = results / 'frames' / f'.camera_9_violation_e00009.png.partial-{alive.pid}-0123abcd.png'
        busy.write_bytes(b'in progress')
        before = sorted(p.name for p in (results / 'frames').iterdir())
        ResultsStore(results).close()
        after = sorted(p.name for p in (results / 'frames').iterdir())
        assert sorted(set(before) - set(after)) == sorted([os.path.basename(partial), legacy.name])
        assert after == sorted([kept.name, 'notes.txt', busy.name])
        assert kept.read_bytes()[:4] == b'\x89PNG'
        assert read_jsonl(results / 'evaluations.jsonl') == [{'image': 'a', 'index': 0}]
    finally:
        alive.kill()
        alive.wait(10)


def test_only_scratch_names_of_dead_writers_and_of_the_given_output_go(tmp_path):
    dead = subprocess.run(
        [sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    stale_bag = tmp_path / f'.dive.mcap.partial-{pid}-00aa11bb'
    stale_bag.mkdir()
    (stale_bag / 'dive.mcap').write_bytes(b'half')
    other_output = tmp_path / f'.other.mcap.partial-{pid}-00aa11bb'
    other_output.mkdir()
    mine = scratch_path(tmp_path / 'dive.mcap')  # this process runs: kept
    mine.mkdir()
    lookalikes = ['.dive.mcap.partial-x-00aa11bb', 'dive.mcap', '.dive.mcap', 'dive.tmp.png']
    for name in lookalikes:
        (tmp_path / name).write_bytes(b'evidence')
    assert remove_stale(tmp_path, 'dive.mcap') == [stale_bag]
    assert other_output.exists() and mine.exists()
    assert all((tmp_path / name).exists() for name in lookalikes)
