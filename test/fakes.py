"""Deterministic stand-in models for search tests: cheap, image-dependent, and countable."""

from __future__ import annotations

import numpy as np

from metavlm_ros.method.prediction import Prediction, VLMBackend

CLASSES = ('animal', 'vegetation', 'object', 'trash')


class ImageStatsBackend(VLMBackend):
    """A confidence-type 'model' whose answers are simple image statistics.

    animal: fraction of pure-black pixels (the fill that geometric relations bring in);
    vegetation: mean green; object: mean red; trash: contrast (std of grey levels).
    It records every call so tests can check batching and caching.
    """

    kind = 'confidence'
    name = 'fake'
    model_id = 'fake-image-stats'
    classes = CLASSES

    def __init__(self, fail_every: int = 0):
        self.calls: list[int] = []
        self.fail_every = fail_every
        self._served = 0

    def predict(self, frames):
        self.calls.append(len(frames))
        out = []
        for frame in frames:
            self._served += 1
            if self.fail_every and self._served % self.fail_every == 0:
                out.append(None)
                continue
            f = frame.astype(np.float32) / 255.0
            black = float(np.mean(np.all(frame == 0, axis=2)))
            out.append(
                Prediction(
                    kind='confidence',
                    values={
                        'animal': black,
                        'vegetation': float(f[..., 1].mean()),
                        'object': float(f[..., 0].mean()),
                        'trash': float(f.mean(axis=2).std()),
                    },
                )
            )
        return out


class BlackCountBackend(VLMBackend):
    """A count-type 'model': one 'animal' per 5% of black pixels, other classes fixed."""

    kind = 'count'
    name = 'fake-count'
    model_id = 'fake-black-count'
    classes = CLASSES

    def predict(self, frames):
        out = []
        for frame in frames:
            black = float(np.mean(np.all(frame == 0, axis=2)))
            n = int(black / 0.05)
            text = f'Animals: {n} fish Vegetation: None Objects: 1 pipe Trash: None'
            out.append(
                Prediction(
                    kind='count', values={'animal': n, 'vegetation': 0, 'object': 1, 'trash': 0}, text=text
                )
            )
        return out


class UnreadableEvery(VLMBackend):
    """Counts black pixels, but every `every`-th follow-up's answer does not parse (a JSON-asked model
    answering prose): the search must record those as failed evaluations, never as zero counts."""

    kind = 'count'
    name = 'fake-unreadable'
    model_id = 'fake-unreadable'

    def __init__(self, every: int, source_unreadable: bool = False):
        self.inner = BlackCountBackend()
        self.every = every
        self.source_unreadable = source_unreadable
        self.served = 0

    def predict(self, frames):
        out = []
        for prediction in self.inner.predict(frames):
            self.served += 1
            if (self.served == 1 and self.source_unreadable) or (
                self.served > 1 and self.served % self.every == 0
            ):
                prediction = Prediction(
                    'count', {}, 'There are some fish.', error='unparseable answer: not JSON'
                )
            out.append(prediction)
        return out


class ThresholdDetector(VLMBackend):
    """A detection-type 'model': each bright blob (grey level above `threshold`, at least `min_area`
    pixels) is an object, its class by its dominant channel (red trash, green animal, blue object,
    else vegetation), its score its mean brightness. Equivariant under moves of the pixels, as a good
    detector is; a contrast change (CLAHE, turbid water) can split, merge or lose blobs."""

    kind = 'detection'
    name = 'fake-detector'
    model_id = 'fake-threshold-detector'
    classes = CLASSES

    def __init__(self, threshold: int = 150, min_area: int = 12):
        self.threshold = threshold
        self.min_area = min_area
        self.calls: list[int] = []

    def predict(self, frames):
        import cv2

        from metavlm_ros.method.boxes import Detection

        self.calls.append(len(frames))
        out = []
        for frame in frames:
            grey = frame.max(axis=2)
            count, labels, stats, _ = cv2.connectedComponentsWithStats(
                (grey > self.threshold).astype(np.uint8)
            )
            found = []
            for k in range(1, count):
                x, y, w, h, area = (int(v) for v in stats[k])
                if area < self.min_area:
                    continue
                mean = frame[labels == k].mean(axis=0)
                channel = int(np.argmax(mean))
                cls = (
                    ('trash', 'animal', 'object')[channel]
                    if mean[channel] > 1.3 * np.median(mean)
                    else 'vegetation'
                )
                found.append(
                    Detection(
                        cls,
                        round(float(mean.max()) / 255, 4),
                        (float(x), float(y), float(x + w), float(y + h)),
                    )
                )
            values = {c: float(sum(d.cls == c for d in found)) for c in self.classes}
            out.append(Prediction(kind='detection', values=values, detections=tuple(found)))
        return out
