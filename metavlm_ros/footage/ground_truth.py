"""The ground truth of a frame, where its footage carries one: a scenes folder or a bag the project wrote."""

from __future__ import annotations

import json
from pathlib import Path

from metavlm_ros.common.errors import BagError, InputError
from metavlm_ros.common.images import Frame
from metavlm_ros.footage.truth import GroundTruth

__all__ = ['GROUND_TRUTH_FILE', 'GroundTruthLookup', 'SourceCheck', 'true_detections']

#: The file beside a scenes folder's frames (`metavlm scenes --format png`): one line per frame.
GROUND_TRUTH_FILE = 'ground_truth.jsonl'


class GroundTruthLookup:
    """Finds each frame's ground truth: an image's line in its folder's ground_truth.jsonl (by file
    name), a bag frame's message on /metavlm/ground_truth (by header stamp). Files are read once."""

    def __init__(self) -> None:
        self._folders: dict[Path, dict[str, GroundTruth]] = {}
        self._bags: dict[Path, dict[int, GroundTruth]] = {}

    def __call__(self, frame: Frame) -> GroundTruth | None:
        """The frame's ground truth, or None where its footage has none."""
        return self.at(frame.file, frame.stamp_ns)

    def at(self, file: str | Path | None, stamp_ns: int = 0) -> GroundTruth | None:
        """The ground truth of the frame a record names (its `frame_file` and `stamp_ns`), or None."""
        if not file:
            return None
        path = Path(file)
        if path.suffix.lower() == '.png' and path.parent.joinpath(GROUND_TRUTH_FILE).is_file():
            return self._folder(path.parent).get(path.name)
        if path.is_dir() or path.suffix.lower() in ('.mcap', '.db3', '.bag'):
            return self._bag(path).get(stamp_ns)
        return None

    def _folder(self, folder: Path) -> dict[str, GroundTruth]:
        if folder not in self._folders:
            lines = (folder / GROUND_TRUTH_FILE).read_text(encoding='utf-8').splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
            self._folders[folder] = {r['file']: GroundTruth.from_dict(r) for r in records if 'file' in r}
        return self._folders[folder]

    def _bag(self, path: Path) -> dict[int, GroundTruth]:
        if path not in self._bags:
            from metavlm_ros.footage.bag_reader import read_ground_truth

            try:
                self._bags[path] = dict(read_ground_truth(path))
            except BagError:
                self._bags[path] = {}  # a bag without the topic: footage without ground truth
        return self._bags[path]


def true_detections(truth: GroundTruth, scale: float = 1.0):
    """The true objects of a frame as detections (score 1), boxes times `scale` (to the searched size)."""
    from metavlm_ros.method.boxes import Detection

    return [Detection(b['class'], 1.0, tuple(float(v) * scale for v in b['box'])) for b in truth.boxes]


class SourceCheck:
    """A frame prepared for the search and, for a detection model on footage with ground truth, its
    source answer (computed here once, then handed to the search) and how right it is (docs/method.md
    §13): `(prepared frame, source prediction or None, SourceAccuracy or None)`."""

    def __init__(self, backend, config, lookup: GroundTruthLookup | None = None) -> None:
        from metavlm_ros.footage.ranges import RangeLookup

        self.backend, self.config = backend, config
        self.lookup = lookup or GroundTruthLookup()
        self.ranges = RangeLookup()

    def __call__(self, frame: Frame):
        from metavlm_ros.method.boxes import source_accuracy
        from metavlm_ros.method.search import prepare_frame

        # The frame's range map goes along where MR12 takes its ranges from the footage.
        ranges = self.ranges(frame) if self.config.water_ranges == 'truth' else None
        try:
            prepared = prepare_frame(frame.rgb, self.config, getattr(self.backend, 'input_size', 0), ranges)
        except InputError as exc:
            raise InputError(f'{frame.file or frame.id}: {exc}') from None
        truth = self.lookup(frame) if self.backend.kind == 'detection' else None
        if truth is None:
            return prepared, None, None
        source = self.backend.predict([prepared.rgb])[0]
        if source is None or source.error:
            return prepared, source, None  # the search records why the source has no answer
        height, width = prepared.rgb.shape[:2]
        truth_boxes = true_detections(truth, width / frame.rgb.shape[1])
        accuracy = source_accuracy(truth_boxes, source.detections, width, height, self.config.iou_threshold)
        return prepared, source, accuracy
