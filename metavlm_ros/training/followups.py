"""Follow-ups to train on: the regions a model must hold in and the changes that broke it (docs/harden.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.encoding import Composition, SearchSpace, decode
from metavlm_ros.method.objectives import f_trans
from metavlm_ros.method.relations import RELATIONS
from metavlm_ros.method.sampling import rand_genotypes

__all__ = ['FollowupPlan', 'TrainingRegion', 'scaled']


def scaled(composition: Composition, factor: float) -> Composition:
    """The composition with every active relation's deviation from nominal times `factor`, kept inside
    the relation's range (extras, such as a blur's direction, unchanged): f_trans scales by `factor`
    until a relation reaches the end of its range."""
    values = tuple(
        float(np.clip(r.nominal + (v - r.nominal) * factor, r.low, r.high)) if on else v
        for r, on, v in zip(RELATIONS, composition.active, composition.values, strict=True)
    )
    return Composition(composition.active, values, composition.extras)


@dataclass(frozen=True)
class TrainingRegion:
    """Changes the model must hold under: the relations a space enables, in its ranges, and at most
    `f_trans_max` in size (None: any size the ranges allow). `label` names where it came from (an
    acceptance criterion's id, or 'paper')."""

    label: str
    space: SearchSpace
    f_trans_max: float | None = None

    def draw(self, rng: np.random.Generator) -> Composition:
        """A change of the region: the paper's Rand (random order, subset and parameters), shrunk
        toward nominal to a uniform size in [0, f_trans_max] when it is larger."""
        composition = decode(rand_genotypes(self.space, 1, rng)[0], self.space)
        size = f_trans(composition)
        if self.f_trans_max is not None and size > self.f_trans_max:
            composition = scaled(composition, self.f_trans_max * float(rng.random()) / size)
        return composition

    def as_record(self) -> dict:
        ranges = {RELATIONS[i].id: [self.space.low[i], self.space.high[i]] for i in self.space.indices}
        return {'label': self.label, 'relations': ranges, 'f_trans_max': self.f_trans_max}


@dataclass(frozen=True)
class FollowupPlan:
    """Where training follow-ups come from: with probability `broken_share` one of the changes that broke
    the model in the evidence (`broken`, from violating records), its size jittered by a factor drawn
    uniformly in [1 - jitter, 1 + jitter] so the model learns a margin around it rather than one point;
    otherwise a change drawn from one of `regions`, each equally likely (the rest of the region the
    model must hold in, so that fixing one failure forgets nothing else)."""

    regions: tuple[TrainingRegion, ...]
    broken: tuple[Composition, ...] = ()
    broken_share: float = 0.5
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if not self.regions and not self.broken:
            raise ParameterError('nothing to train on: no region and no violation in the evidence')
        if not 0 <= self.broken_share <= 1:
            raise ParameterError(f'broken_share must lie in [0, 1], got {self.broken_share}')
        if not 0 <= self.jitter < 1:
            raise ParameterError(f'jitter must lie in [0, 1), got {self.jitter}')

    @classmethod
    def of(
        cls, regions: Sequence[TrainingRegion], broken: Sequence[Composition] = (), **settings: float
    ) -> FollowupPlan:
        """A plan of these regions and these breaking changes (duplicates of a change kept once)."""
        unique = {composition.key: composition for composition in broken if composition.order}
        return cls(tuple(regions), tuple(unique[k] for k in sorted(unique)), **settings)

    def draw(self, rng: np.random.Generator) -> Composition:
        """One change to train on, drawn with `rng` (the same generator state gives the same change)."""
        if self.broken and (not self.regions or rng.random() < self.broken_share):
            change = self.broken[int(rng.integers(len(self.broken)))]
            return scaled(change, float(rng.uniform(1 - self.jitter, 1 + self.jitter)))
        return self.regions[int(rng.integers(len(self.regions)))].draw(rng)

    def as_record(self) -> dict:
        """The plan as the model card records it."""
        return {
            'regions': [region.as_record() for region in self.regions],
            'broken': [composition.parameters for composition in self.broken],
            'broken_share': self.broken_share,
            'jitter': self.jitter,
        }
