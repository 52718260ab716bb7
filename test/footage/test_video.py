"""Videos (footage/video.py): written by OpenCV from generated frames, streamed, selected, refused if bad."""

import numpy as np
import pytest

from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.footage.frames import iter_frames, verify_sources
from metavlm_ros.footage.video import (
    WRITE_CODECS,
    iter_video_frames,
    verify_video,
    video_rate,
    write_video,
)

FPS = 10.0
N = 12
MS = 1_000_000  # ns


def scene(n: int = N) -> list[np.ndarray]:
    """Frames told apart by their level: frame i is flat at 16 + 16 i, with a bright block that moves."""
    frames = []
    for i in range(n):
        rgb = np.full((48, 64, 3), 16 + 16 * i, np.uint8)
        rgb[8:24, 4 * i : 4 * i + 16] = (250, 40, 40)
        frames.append(rgb)
    return frames


def level(rgb: np.ndarray) -> int:
    """Which frame of `scene` this is, by its background level (lossy codecs move it a little)."""
    return round((float(np.median(rgb[30:, :, 1])) - 16) / 16)


@pytest.fixture(scope='module', params=sorted(WRITE_CODECS))
def video(request, tmp_path_factory):
    return write_video(tmp_path_factory.mktemp('videos') / f'dive{request.param}', scene(), fps=FPS)


def test_frames_in_order_with_their_presentation_time(video):
    assert video_rate(video) == pytest.approx(FPS)
    frames = list(iter_frames([video]))
    assert [level(f.rgb) for f in frames] == list(range(N))
    assert [f.stamp_ns for f in frames] == [i * 100 * MS for i in range(N)]
    assert [f.index for f in frames] == list(range(N)) and {f.file for f in frames} == {str(video)}
    assert frames[3].id == f'dive@{300 * MS}' and frames[0].rgb.shape == (48, 64, 3)
    assert all(f.rgb.flags['C_CONTIGUOUS'] and f.rgb.dtype == np.uint8 for f in frames)
    verify_video(video)


@pytest.mark.parametrize(
    ('suffix', 'fourcc', 'lossless'),
    [('.mkv', 'FFV1', True), ('.avi', 'HFYU', True), ('.mov', 'png ', True), ('.webm', 'VP80', False)],
)
def test_other_codecs_ffmpeg_reads(tmp_path, suffix, fourcc, lossless):
    import cv2

    rng = np.random.default_rng(5)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]
    path = tmp_path / f'dive{suffix}'
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), FPS, (64, 48))
    for rgb in frames:
        writer.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    writer.release()
    read = list(iter_frames([path]))
    assert [f.index for f in read] == [0, 1, 2] and [f.stamp_ns for f in read] == [0, 100 * MS, 200 * MS]
    if lossless:  # pixel for pixel, in RGB order
        for frame, rgb in zip(read, frames, strict=True):
            np.testing.assert_array_equal(frame.rgb, rgb)


def test_selection_as_for_bags(video):
    def picked(**kw):
        return [(f.index, level(f.rgb)) for f in iter_video_frames(video, **kw)]

    assert picked(every=3) == [(0, 0), (3, 3), (6, 6), (9, 9)]
    assert picked(max_frames=2) == [(0, 0), (1, 1)]
    # Seconds of presentation time, inclusive; the video is seeked to the start, frames keep their index.
    assert picked(start=0.5, end=0.8) == [(5, 5), (6, 6), (7, 7), (8, 8)]
    assert picked(start=0.5, end=0.8, every=2) == [(5, 5), (7, 7)]
    assert picked(start=0.45, end=0.55) == [(5, 5)]
    assert picked(start=1.1) == [(11, 11)]
    assert picked(start=5.0) == []
    assert picked(max_frames=0) == []
    with pytest.raises(ParameterError):
        list(iter_video_frames(video, every=0))


def test_max_frames_spans_videos_and_bags(tmp_path):
    a = write_video(tmp_path / 'a.mkv', scene(3), fps=FPS)
    b = write_video(tmp_path / 'b.avi', scene(3), fps=FPS)
    assert [f.id for f in iter_frames([a, b], max_frames=4)] == [
        'a@0',
        f'a@{100 * MS}',
        f'a@{200 * MS}',
        'b@0',
    ]


def test_start_seeks_into_the_video_and_frames_keep_their_number(tmp_path, monkeypatch):
    import cv2

    video = write_video(tmp_path / 'long.mkv', scene(12) * 4, fps=25.0)
    grabs = []
    original = cv2.VideoCapture

    class Counting:
        def __init__(self, *args):
            self.capture = original(*args)

        def grab(self):
            grabs.append(1)
            return self.capture.grab()

        def __getattr__(self, name):
            return getattr(self.capture, name)

    monkeypatch.setattr(cv2, 'VideoCapture', Counting)
    first = next(iter_video_frames(video, start=1.2))
    assert (first.index, first.stamp_ns, level(first.rgb)) == (30, 1200 * MS, 30 % 12)
    assert len(grabs) <= 2  # seeked to a frame before 1.2 s, not decoded from the start


def _cut(video, fraction):
    data = video.read_bytes()
    cut = video.with_name(f'cut-{fraction}{video.suffix}')
    cut.write_bytes(data[: int(len(data) * fraction)])
    return cut


@pytest.mark.parametrize('fraction', [0.5, 0.75])
def test_a_truncated_video_is_one_line_before_any_frame_is_used(video, fraction, capfd):
    cut = _cut(video, fraction)
    capfd.readouterr()
    with pytest.raises(InputError) as info:
        verify_sources([cut])
    message = str(info.value)
    assert message.startswith(f'{cut}: ') and '\n' not in message
    assert 'truncated' in message or 'not a readable video' in message
    # Streaming a cut video without the check ends in the same kind of line, never in fewer frames silently.
    with pytest.raises(InputError, match='truncated|not a readable video'):
        list(iter_frames([cut]))
    assert capfd.readouterr().err == ''  # nothing of FFmpeg's or OpenCV's own on stderr


def test_bad_videos_are_one_line(tmp_path, capfd):
    rng = np.random.default_rng(3)
    junk = tmp_path / 'junk.mp4'
    junk.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    empty = tmp_path / 'empty.mkv'
    empty.write_bytes(b'')
    capfd.readouterr()
    for path, needle in ((junk, 'not a readable video'), (empty, 'empty file')):
        with pytest.raises(InputError) as info:
            verify_sources([path])
        assert str(info.value).startswith(f'{path}: {needle}') and '\n' not in str(info.value)
    assert capfd.readouterr().err == ''


def test_a_video_without_frames_is_refused(tmp_path):
    import cv2

    path = tmp_path / 'none.avi'
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*'MJPG'), FPS, (64, 48))
    writer.release()
    assert path.stat().st_size > 0
    with pytest.raises(InputError, match='none.avi: the video holds no frames'):
        verify_video(path)
    with pytest.raises(InputError, match='none.avi: the video holds no frames'):
        list(iter_frames([path]))


def test_unknown_file_types_name_the_accepted_ones(tmp_path):
    notes = tmp_path / 'dive.txt'
    notes.write_text('not footage')
    with pytest.raises(InputError) as info:
        list(iter_frames([notes]))
    message = str(info.value)
    assert message.startswith(f'{notes}: unknown file type .txt;') and '\n' not in message
    for kind in ('.png', '.mp4', '.mkv', '.avi', '.mov', '.mcap', '.db3', '.bag'):
        assert kind in message
    # An image OpenCV reads under a suffix of its own is still an image.
    import cv2

    cv2.imwrite(str(tmp_path / 'frame.ppm'), scene(1)[0])
    assert len(list(iter_frames([tmp_path / 'frame.ppm']))) == 1


def test_write_video_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(ParameterError, match='cannot write .flv video'):
        write_video(tmp_path / 'x.flv', scene(1), fps=FPS)
    path = write_video(tmp_path / 'x.mkv', scene(2), fps=FPS)
    with pytest.raises(InputError, match='already exists'):
        write_video(path, scene(1), fps=FPS)
    with pytest.raises(InputError, match='frame 1: 32x48, not 64x48'):
        write_video(tmp_path / 'y.mkv', [scene(1)[0], scene(1)[0][:, :32]], fps=FPS)
    assert not (tmp_path / 'y.mkv').exists()
    with pytest.raises(ParameterError, match='z.mp4: a video needs an even width and height, got 63x47'):
        write_video(tmp_path / 'z.mp4', [np.zeros((47, 63, 3), np.uint8)], fps=FPS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['x.mkv']  # no scratch left behind
