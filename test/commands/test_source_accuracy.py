"""Ground truth where the footage has it: a detection model's accuracy on each source frame is recorded,
and `metavlm search --skip-wrong-sources` searches only the frames the model gets right."""

import pytest

from metavlm_ros.cli import main
from metavlm_ros.commands import search as search_command
from metavlm_ros.common.images import Frame
from metavlm_ros.common.results import SUMMARY, read_jsonl
from metavlm_ros.footage.frames import frame_digest, iter_frames
from metavlm_ros.footage.ground_truth import GroundTruthLookup, true_detections
from metavlm_ros.method.boxes import Detection, source_accuracy
from metavlm_ros.method.prediction import Prediction, VLMBackend

SMALL = ['--frames', '3', '--size', '320x240', '--seed', '11']


class TruthDouble(VLMBackend):
    """Answers the true boxes of the footage's frames it was told (by their pixels' sha256) and moves
    each box by `shift` pixels; on `wrong` frames it misses the first object. Any other frame (a
    follow-up): the last source's answer, the boxes unmoved."""

    kind = 'detection'
    name = 'truth-double'
    model_id = 'truth-double'
    classes = ('animal', 'vegetation', 'object', 'trash')

    def __init__(self, truths: dict[str, list[Detection]], wrong: set[str]):
        self.truths, self.wrong, self.last = truths, wrong, []

    def predict(self, frames):
        out = []
        for rgb in frames:
            digest = frame_digest(rgb)
            if digest in self.truths:
                self.last = self.truths[digest][1:] if digest in self.wrong else self.truths[digest]
            values = {c: float(sum(d.cls == c for d in self.last)) for c in self.classes}
            out.append(Prediction(kind='detection', values=values, detections=tuple(self.last)))
        return out


@pytest.fixture(scope='module')
def footage(tmp_path_factory):
    """The project's own footage with ground truth: a folder of PNGs and a bag of the same scenes."""
    root = tmp_path_factory.mktemp('footage')
    assert main(['scenes', '--out', str(root / 'pngs'), '--format', 'png', *SMALL]) == 0
    assert main(['scenes', '--out', str(root / 'dive.mcap'), *SMALL]) == 0
    return root


def test_the_ground_truth_of_png_and_bag_frames_is_found_and_a_true_answer_is_right(footage):
    lookup = GroundTruthLookup()
    for source in (footage / 'pngs', footage / 'dive.mcap'):
        frames = list(iter_frames([str(source)]))
        assert len(frames) == 3
        for frame in frames:
            truth = lookup(frame)
            assert truth is not None and truth.boxes, frame.id
            boxes = true_detections(truth)
            height, width = frame.rgb.shape[:2]
            right = source_accuracy(boxes, boxes, width, height)
            assert right.correct and (right.precision, right.recall) == (1.0, 1.0)
            wrong = source_accuracy(boxes, boxes[1:], width, height)
            assert (wrong.false_negatives, wrong.false_positives, wrong.recall) == (
                1, 0, pytest.approx(1 - 1 / len(boxes))
            )  # fmt: skip
    assert lookup(Frame('loose', frames[0].rgb)) is None  # a frame from nowhere has none


def test_search_skips_the_frames_the_model_gets_wrong_and_records_the_accuracy_of_the_others(
    footage, tmp_path, monkeypatch, capsys
):
    lookup = GroundTruthLookup()
    frames = list(iter_frames([str(footage / 'pngs')]))
    truths = {frame_digest(f.rgb): true_detections(lookup(f)) for f in frames}
    wrong = {frame_digest(frames[1].rgb)}
    monkeypatch.setattr(search_command, 'create_backend_from_args', lambda args: TruthDouble(truths, wrong))

    def search(out, *flags):
        model = ['--backend', 'clip', '--model', 'demo']  # replaced by the double above
        budget = ['--evaluations', '12', '--population', '6', '--quiet']
        return main(['search', str(footage / 'pngs'), '--out', str(out), *model, *budget, *flags])

    out = tmp_path / 'out'
    assert search(out, '--skip-wrong-sources') == 0
    printed = capsys.readouterr().out
    assert f'{frames[1].id}: skipped (--skip-wrong-sources)' in printed and '1 object(s) missed' in printed
    summaries = read_jsonl(out / SUMMARY)
    assert [s['image'] for s in summaries] == [frames[0].id, frames[2].id]
    for summary in summaries:
        accuracy = summary['source_accuracy']
        assert (accuracy['precision'], accuracy['recall'], accuracy['iou_threshold']) == (1.0, 1.0, 0.5)
    # Without the flag every frame is searched, and the wrong one's accuracy says what it missed.
    assert search(tmp_path / 'all') == 0
    every = {s['image']: s['source_accuracy'] for s in read_jsonl(tmp_path / 'all' / SUMMARY)}
    assert len(every) == 3 and every[frames[1].id]['false_negatives'] == 1
