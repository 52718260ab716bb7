"""A live `metavlm search` watched over Foxglove's WebSocket protocol by a real client, and a busy port."""

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import cv2

from metavlm_ros.cli import main
from metavlm_ros.common.results import read_jsonl
from test.conftest import make_frame
from test.viewer.foxglove_client import free_port, watch

ROOT = Path(__file__).resolve().parents[2]


def test_a_live_search_is_watched_over_the_foxglove_websocket(tmp_path, tiny_clip_dir):
    image = tmp_path / 'frame.png'
    cv2.imwrite(str(image), make_frame(96, 64)[..., ::-1])
    out, port = tmp_path / 'res', free_port()
    command = [
        sys.executable, '-m', 'metavlm_ros.cli', 'search', str(image), '--backend', 'clip',
        '--model', str(tiny_clip_dir), '--quiet', '--population', '6', '--evaluations', '18',
        '--out', str(out), '--foxglove-port', str(port), '--foxglove-wait', '120',
    ]  # fmt: skip
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The search waits for this client's subscriptions (--foxglove-wait): it sees the search whole,
        # however long the model takes to load.
        received = asyncio.run(
            watch(
                port,
                lambda got: '/metavlm/summary' in got,
                timeout_s=120,
                alive=lambda: process.poll() is None,
            )
        )
    finally:
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert f'waiting up to 120 s for a Foxglove client at ws://127.0.0.1:{port}' in stderr
    assert 'no Foxglove client subscribed' not in stderr

    # What went out live is what was written: every violation, and each kept follow-up annotated.
    evaluations = read_jsonl(out / 'evaluations.jsonl')
    violations = [r for r in evaluations if r['order'] and any(r['violation'].values())]
    assert violations
    assert [m['index'] for _, m in received['/metavlm/violations']] == [r['index'] for r in violations]
    framed = [r for r in read_jsonl(out / 'pareto.jsonl') if r['frame'] and any(r['violation'].values())]
    annotations = received['/metavlm/followup/annotations']
    assert len(annotations) == len(framed) > 0
    for (time, note), record in zip(annotations, framed, strict=True):
        assert time == 10**9  # the first search of image files: one second, as in the export
        text = '\n'.join(t.text for t in note.texts)
        assert record['composition'] in text and f'f_pred {record["f_pred"]:.4f}' in text
    images = received['/metavlm/followup/image']
    assert [m.data for _, m in images] == [(out / r['frame']).read_bytes() for r in framed]
    (source,) = received['/metavlm/source/image']
    # The search's stored source frame as it is on disk: what the export shows without a bag.
    (summary,) = read_jsonl(out / 'summary.jsonl')
    assert source[1].format == 'png' and source[1].data == (out / summary['source_frame']).read_bytes()


def test_a_port_in_use_is_one_line_exit_2_before_anything_is_written(tmp_path, tiny_clip_dir, capsys):
    image = tmp_path / 'frame.png'
    cv2.imwrite(str(image), make_frame(64, 48)[..., ::-1])
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ['search', str(image), '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet']
        code = main(
            [*args, '--evaluations', '6', '--out', str(tmp_path / 'res'), '--foxglove-port', str(port)]
        )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith('metavlm: error: cannot serve Foxglove on 127.0.0.1:') and err.count('\n') == 1, err
    assert 'in use' in err
    assert not (tmp_path / 'res').exists()


def test_foxglove_wait_needs_a_port_and_a_wait_nobody_answers_searches_anyway(
    tmp_path, tiny_clip_dir, capsys
):
    image = tmp_path / 'frame.png'
    cv2.imwrite(str(image), make_frame(64, 48)[..., ::-1])
    args = ['search', str(image), '--backend', 'clip', '--model', str(tiny_clip_dir), '--quiet']
    assert main([*args, '--out', str(tmp_path / 'a'), '--foxglove-wait', '5']) == 2
    err = capsys.readouterr().err
    assert err == 'metavlm: error: --foxglove-wait needs --foxglove-port\n'
    assert not (tmp_path / 'a').exists()
    port = free_port()
    code = main(
        [*args, '--evaluations', '6', '--out', str(tmp_path / 'b'), '--foxglove-port', str(port)]
        + ['--foxglove-wait', '0.3']
    )
    assert code == 0
    assert 'no Foxglove client subscribed; searching anyway' in capsys.readouterr().err
    assert read_jsonl(tmp_path / 'b' / 'summary.jsonl')
