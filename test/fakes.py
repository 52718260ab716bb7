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
