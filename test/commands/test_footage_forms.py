"""`metavlm search` and `metavlm render` on footage as users have it: ROS 1 bags and dive videos."""

import pytest

from metavlm_ros.cli import main
from metavlm_ros.common.results import read_jsonl
from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.footage.video import write_video
from test.footage.bag_helpers import stamps, write_ros1_scene

SMALL = ['--population', '4', '--evaluations', '8', '--quiet']


@pytest.fixture(scope='module')
def scene():
    generator = SceneGenerator(64, 48, 5.0, seed=21, environment='shallow', frames=5)
    return [generator.frame(i) for i in range(5)]


def search(args, model_dir):
    return main(['search', '--backend', 'clip', '--model', str(model_dir), *SMALL, *args])


def _footage(kind, tmp_path, scene):
    if kind == 'ros1':
        return write_ros1_scene(tmp_path / 'dive.bag', scene)
    return write_video(tmp_path / f'dive.{kind}', [rgb for rgb, _ in scene], fps=5.0)


@pytest.mark.parametrize('kind', ['ros1', 'mp4', 'mkv'])
def test_search_reads_the_footage_and_every_record_says_where_its_frame_came_from(
    tmp_path, scene, tiny_clip_dir, capsys, kind
):
    footage = _footage(kind, tmp_path, scene)
    out = tmp_path / 'res'
    code = search(
        [str(footage), '--every', '2', '--start', '0.2', '--max-frames', '2', '--out', str(out)],
        tiny_clip_dir,
    )
    assert code == 0, capsys.readouterr().err
    records = read_jsonl(out / 'evaluations.jsonl') + read_jsonl(out / 'summary.jsonl')
    # Frames 1 and 3 (0.2 s and 0.6 s into the footage): the file, the frame's position and time.
    times = stamps()[1:4:2] if kind == 'ros1' else [200_000_000, 600_000_000]
    expected = {(f'dive@{t}', str(footage), index, t) for index, t in zip((1, 3), times, strict=True)}
    assert {(r['image'], r['frame_file'], r['frame_index'], r['stamp_ns']) for r in records} == expected
    assert len(read_jsonl(out / 'summary.jsonl')) == 2
    # A follow-up renders again from the results alone, as from a rosbag2 bag's.
    (first, _) = read_jsonl(out / 'summary.jsonl')
    index = first['pareto'][0]
    rendered = tmp_path / 'again'
    assert main(['render', str(out), str(index), '--image', first['image'], '--out', str(rendered)]) == 0
    assert len(list(rendered.glob('*.png'))) == 1


@pytest.mark.parametrize('kind', ['ros1', 'video', 'unknown'])
def test_bad_footage_is_one_line_exit_2_and_keeps_earlier_results(
    tmp_path, scene, tiny_clip_dir, capsys, kind
):
    from test.footage.bag_helpers import NOETIC, write_ros1

    good = _footage('mkv', tmp_path, scene)
    out = tmp_path / 'res'
    assert search([str(good), '--max-frames', '1', '--out', str(out)], tiny_clip_dir) == 0
    before = {p.name: p.read_bytes() for p in out.rglob('*') if p.is_file()}
    if kind == 'ros1':
        note = NOETIC.types['std_msgs/msg/String'](data='sonar only')
        bad = write_ros1(tmp_path / 'sonar.bag', [('/sonar/status', 'std_msgs/msg/String', 10**9, note)])
        needle = 'no image topics'
    elif kind == 'video':
        bad = tmp_path / 'half.mkv'
        bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
        needle = 'truncated or damaged video'
    else:
        bad = tmp_path / 'dive.flv1'
        bad.write_bytes(b'FLV\x01' + bytes(64))
        needle = 'unknown file type .flv1'
    capsys.readouterr()
    assert search([str(bad), '--out', str(out), '--resume'], tiny_clip_dir) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f'metavlm: error: {bad}: ') and needle in err and '\n' not in err, err
    assert {p.name: p.read_bytes() for p in out.rglob('*') if p.is_file()} == before


def test_a_damaged_video_is_one_line_on_stderr_from_a_fresh_process(tmp_path):
    # FFmpeg reads its log level once per process, at its first use: nothing of its own gets out.
    import subprocess
    import sys

    junk = tmp_path / 'dive.mp4'
    junk.write_bytes(bytes(range(256)) * 16)
    done = subprocess.run(
        [sys.executable, '-m', 'metavlm_ros.cli', 'search', str(junk), '--out', str(tmp_path / 'res')],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr
        == f'metavlm: error: {junk}: not a readable video (unknown format, or a damaged or truncated file)\n'
    )
    assert not (tmp_path / 'res').exists()
