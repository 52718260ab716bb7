"""`mobo`: a sample-efficient multi-objective Bayesian search that models f_pred only (docs/method.md §7)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pymoo.core.algorithm import Algorithm
from pymoo.core.population import Population
from pymoo.util.display.multi import MultiObjectiveOutput
from scipy.special import ndtr
from threadpoolctl import threadpool_limits

from metavlm_ros.method.encoding import FLAG_THRESHOLD, SearchSpace
from metavlm_ros.method.metrics import non_dominated
from metavlm_ros.method.relations import RELATIONS
from metavlm_ros.method.sampling import rand_genotypes
from metavlm_ros.method.surrogate import GaussianProcess

__all__ = ['MOBO', 'MOVES', 'Move', 'Neighbours', 'ZSpace', 'ehvi']

# Points the surrogate is fitted on at most: the front and its neighbours first, then the latest.
# It bounds the cost of a batch (a Cholesky of this size) however long the search runs.
MAX_TRAINING = 240
# Candidates scored per batch: random ones of the paper's Rand and moves around the front.
N_RANDOM = 1500
N_MOVES = 2500
# Candidates the greedy batch selection reconsiders after each pick: the best by their first score.
SHORTLIST = 400
# After this many batches (300 evaluations at the default population: every quality figure of
# docs/performance.md refits every batch), the hyperparameters are refitted every REFIT_EVERY-th
# batch only; every batch still conditions on its newest points. On the test suite's stand-in model
# (this machine) a long search's batch takes 0.15-0.25 s without a refit, 0.25-0.5 s with one.
FULL_REFITS = 10
REFIT_EVERY = 3
# The last third of every batch is picked with the surrogate's uncertainty ten times wider: a count
# model's answer changes in rare narrow steps that a confident surrogate never visits (on the demo
# BLIP, 3 frames x 3 seeds: median 97% of NSGA-II@3000's hypervolume at 300 against 76% without).
EXPLORE = 1 / 3
# The first batch: this share is every relation alone (at its range's ends, then stratified), the
# rest the paper's Rand (compositions show the surrogate how relations interact). Demo frames, 3 x 3
# seeds, median of mobo@300 / NSGA-II@3000 (before the ends came first): 97.4% (BLIP), 100.3% (CLIP)
# at a half; 96.6%, 100.0% all alone; 67% Rand.
OAT_SHARE = 0.5
EXPLORE_SCALE = 10.0
_INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)


class ZSpace:
    """The genotype seen as the model sees it: each enabled relation's signed normalised deviation z.

    A relation that is off transforms a frame like the relation at its nominal value (all but those
    that change a frame there, CLAHE: `changes_at_nominal`), so f_pred depends on z, those relations'
    flags and the extras only, and f_trans (Eq. 1) is the sum of |z|. Features for the surrogate are
    z, then a flag per `changes_at_nominal` relation, then each extra scaled to [-1, 1] times |z| (an
    extra of a relation at nominal changes nothing), a direction as its cosine there and its sine
    after them, so both ends of its range, the same direction, are one point.
    """

    def __init__(self, space: SearchSpace):
        self.space = space
        self.relations = [RELATIONS[i] for i in space.indices]
        self.n = len(self.relations)
        self.nominal = np.array([r.nominal for r in self.relations])
        self.deviation = np.array([r.max_deviation for r in self.relations])
        self.low = np.asarray(space.low, float)[space.indices]
        self.high = np.asarray(space.high, float)[space.indices]
        self.z_low = (self.low - self.nominal) / self.deviation
        self.z_high = (self.high - self.nominal) / self.deviation
        self.flagged = np.array([r.changes_at_nominal for r in self.relations], dtype=bool)
        # Which relation each extra gene belongs to, and its range.
        self.extra_owner = np.array(
            [k for k, r in enumerate(self.relations) for _ in r.extras], dtype=int
        ).reshape(-1)
        self.extra_low, self.extra_high = space.extra_bounds()
        # An extra in degrees over a half or whole turn is a direction (MR10's blur at a and a + 180
        # is the same blur): the surrogate sees it on a circle of that period, where -90 meets 90.
        self.extra_period = np.array(
            [
                extra.high - extra.low
                if extra.unit.startswith('degrees') and extra.high - extra.low in (180.0, 360.0)
                else 0.0
                for relation in self.relations
                for extra in relation.extras
            ]
        )

    @property
    def feature_group(self) -> np.ndarray:
        """The relation (index into `relations`) each column of `features` belongs to."""
        periodic = self.extra_period > 0
        return np.concatenate(
            [np.arange(self.n), np.flatnonzero(self.flagged), self.extra_owner, self.extra_owner[periodic]]
        ).astype(int)

    def split(self, genotypes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(active flags, z, extras) of genotypes; z is 0 for a relation that is off."""
        x = np.atleast_2d(np.asarray(genotypes, float))
        m = 2 * self.n
        active = x[:, 0:m:2] > FLAG_THRESHOLD
        values = np.clip(x[:, 1:m:2], self.low, self.high)
        z = np.where(active, (values - self.nominal) / self.deviation, 0.0)
        extras = np.clip(x[:, m:], self.extra_low, self.extra_high)
        return active, z, extras

    def join(self, active: np.ndarray, z: np.ndarray, extras: np.ndarray) -> np.ndarray:
        """Genotypes of (active, z, extras); z clipped into each relation's range (its nominal value
        when the range narrows away from it)."""
        z = np.clip(z, self.z_low, self.z_high)
        genotypes = np.empty((len(z), self.space.n_var))
        m = 2 * self.n
        genotypes[:, 0:m:2] = active.astype(float)
        genotypes[:, 1:m:2] = np.clip(self.nominal + z * self.deviation, self.low, self.high)
        genotypes[:, m:] = np.clip(extras, self.extra_low, self.extra_high)
        return genotypes

    def f_trans(self, active: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Eq. 1 of each row, exactly as objectives.f_trans computes it from the decoded composition."""
        return np.sum(np.abs(np.where(active, z, 0.0)), axis=1)

    def features(self, active: np.ndarray, z: np.ndarray, extras: np.ndarray) -> np.ndarray:
        """What the surrogate sees of each row (see the class docstring)."""
        z = np.where(active, z, 0.0)
        parts = [z, active[:, self.flagged].astype(float)]
        if self.extra_owner.size:
            # A candidate whose relation a move dropped keeps its z; its extras count for nothing.
            size = np.abs(z[:, self.extra_owner])
            width = np.maximum(self.extra_high - self.extra_low, 1e-12)
            scaled = 2.0 * (extras - self.extra_low) / width - 1.0
            periodic = self.extra_period > 0
            angle = 2.0 * np.pi * extras / np.where(periodic, self.extra_period, 1.0)
            parts.append(np.where(periodic, np.cos(angle), scaled) * size)
            parts.append((np.sin(angle) * size)[:, periodic])
        return np.hstack(parts)

    def is_identity(self, active: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Rows that transform no frame (every relation off or at a nominal that changes nothing)."""
        return ~np.any(active & ((z != 0.0) | self.flagged), axis=1)


def ehvi(t: np.ndarray, mu: np.ndarray, sigma: np.ndarray, front: np.ndarray, t_ref: float) -> np.ndarray:
    """Expected hypervolume improvement of points with exact f_trans t and f_pred ~ N(mu, sigma).

    The front holds (f_trans, f_pred) of non-dominated points (f_trans minimised, f_pred maximised,
    reference (t_ref, 0)). Left of the first member no f_pred is covered; between two members the
    covered height is the left one's f_pred; a point at t adds, over every stretch right of t, the
    expected excess of its f_pred over that height: a sum of closed-form expected improvements.
    """
    order = np.argsort(front[:, 0]) if len(front) else np.array([], int)
    ft, fp = (front[order, 0], front[order, 1]) if len(front) else (np.empty(0), np.empty(0))
    starts = np.concatenate([[-np.inf], ft])
    ends = np.concatenate([ft, [t_ref]])
    heights = np.concatenate([[0.0], fp])
    lengths = np.clip(np.minimum(ends[None, :], t_ref) - np.maximum(starts[None, :], t[:, None]), 0.0, None)
    sigma = np.maximum(sigma, 1e-12)[:, None]
    u = (mu[:, None] - heights[None, :]) / sigma
    improvement = (mu[:, None] - heights[None, :]) * ndtr(u) + sigma * _INV_SQRT_2PI * np.exp(-0.5 * u**2)
    return np.sum(lengths * improvement, axis=1)


@dataclass
class Neighbours:
    """Copies of front members, one row a candidate, that the moves change in place, and what they read.

    `relation` is the relation each row's move touches (drop, add, shrink one); `judged` holds
    (active, z, extras) of every judged point and `front_rows` the front's rows among them (a merge's
    partners). The moves draw from `rng` in table order, so the same seed gives the same candidates.
    """

    active: np.ndarray
    z: np.ndarray
    extras: np.ndarray
    relation: np.ndarray
    space: ZSpace
    rng: np.random.Generator
    judged: tuple[np.ndarray, np.ndarray, np.ndarray]
    front_rows: np.ndarray


# A move: (moved, rows) changes, in place, the rows of `moved` that the Boolean mask `rows` selects.
Move = Callable[[Neighbours, np.ndarray], None]


def shrink_factors(rng: np.random.Generator, n: int, least: float) -> np.ndarray:
    """Factors to shrink deviations by: half coarse, half by a hair, where a count model's answer steps
    and the front's members sit just past the step.

    Args:
        rng: the search's generator.
        n: how many factors.
        least: the smallest coarse factor.

    Returns:
        n factors, each uniform in [least, 0.97) or within 0.1% to 10% of 1, by a fair coin.
    """
    coarse = rng.uniform(least, 0.97, size=n)
    fine = 1.0 - 10.0 ** rng.uniform(-3.0, -1.0, size=n)
    return np.where(rng.random(n) < 0.5, coarse, fine)


def drop(moved: Neighbours, rows: np.ndarray) -> None:
    """Turn a relation off."""
    moved.active[np.flatnonzero(rows), moved.relation[rows]] = False


def add(moved: Neighbours, rows: np.ndarray) -> None:
    """Turn a relation on (or re-draw one) at a random deviation, small ones the likelier."""
    index, relation = np.flatnonzero(rows), moved.relation[rows]
    moved.active[index, relation] = True
    span = moved.space.z_high - moved.space.z_low
    deviation = moved.space.z_low + span * moved.rng.random((len(rows), moved.space.n))
    moved.z[index, relation] = deviation[index, relation] * moved.rng.random(int(rows.sum())) ** 2


def shrink_all(moved: Neighbours, rows: np.ndarray) -> None:
    """Shrink every deviation, coarsely or (for a count model's step) by a hair."""
    moved.z[rows] *= shrink_factors(moved.rng, int(rows.sum()), 0.3)[:, None]


def shrink_one(moved: Neighbours, rows: np.ndarray) -> None:
    """Shrink one deviation, anywhere down to nominal or by a hair."""
    moved.z[np.flatnonzero(rows), moved.relation[rows]] *= shrink_factors(moved.rng, int(rows.sum()), 0.0)


def nudge(moved: Neighbours, rows: np.ndarray) -> None:
    """Nudge the deviations (normal steps of 2%, 8% or 25% of their ranges) and the extras (10%)."""
    span = moved.space.z_high - moved.space.z_low
    scale = moved.rng.choice([0.02, 0.08, 0.25], size=(int(rows.sum()), 1))
    moved.z[rows] += scale * moved.rng.standard_normal((int(rows.sum()), moved.space.n)) * span
    if moved.extras.shape[1]:
        moved.extras[rows] += (
            0.1
            * moved.rng.standard_normal(moved.extras[rows].shape)
            * (moved.space.extra_high - moved.space.extra_low)
        )


def merge(moved: Neighbours, rows: np.ndarray) -> None:
    """Join another front member's relations, each shared one taken from either.

    Effects that add up (a slight zoom-out's black border and turbidity on the demo CLIP) make a
    front of unions that no single move reaches from one member.
    """
    active, z, extras = moved.judged
    other = moved.rng.choice(moved.front_rows, size=len(rows))
    take = active[other] & (~moved.active | (moved.rng.random(moved.active.shape) < 0.5)) & rows[:, None]
    moved.active |= take
    moved.z = np.where(take, z[other], moved.z)
    if moved.extras.shape[1]:
        moved.extras = np.where(take[:, moved.space.extra_owner], extras[other], moved.extras)


# The moves around the front, drawn uniformly per candidate and applied in this order.
MOVES: tuple[Move, ...] = (drop, add, shrink_all, shrink_one, nudge, merge)


class MOBO(Algorithm):
    """Batches of `population` genotypes chosen by expected hypervolume improvement on a surrogate of f_pred.

    The first batch is half every relation alone (at the ends of its range, then at deviations
    stratified over it), half the paper's Rand (seeded); every later batch scores candidates (fresh
    Rand samples and moves around the front: drop a relation, add one, shrink or nudge the
    deviations, merge two members) by the exact f_trans and the
    surrogate's f_pred (with its noise: a count model's steps look like noise to it), then picks
    greedily, each pick believed at its predicted f_pred and its neighbours' uncertainty reduced as
    if it were known; the last third of the batch with that uncertainty widened (EXPLORE). Driven by
    ask/tell like every pymoo algorithm; the same seed gives the same genotypes.
    """

    def __init__(self, space: SearchSpace, pop_size: int, **kwargs):
        super().__init__(output=MultiObjectiveOutput(), **kwargs)
        self.space = space
        self.pop_size = pop_size
        self.z = ZSpace(space)
        self.x_seen = np.empty((0, space.n_var))
        self.f_seen = np.empty((0, 2))
        # Evaluations whose answer did not parse (search.py marks them): f_pred 0 there means no
        # answer, not no change, so the surrogate and the front never see them.
        self.failed = np.empty(0, dtype=bool)
        self.surrogate: GaussianProcess | None = None
        self.batches = 0  # batches proposed by the surrogate
        # Feature keys of every judged genotype: a candidate among them would be answered from the cache.
        self.seen: set[tuple] = set()

    def _initialize_infill(self) -> Population:
        k = int(round(OAT_SHARE * self.pop_size))
        x = self.one_at_a_time(k)
        if k < self.pop_size:
            x = np.vstack([x, rand_genotypes(self.space, self.pop_size - k, self.random_state)])
        return Population.new(X=x)

    def one_at_a_time(self, q: int) -> np.ndarray:
        """The initial design: each relation alone, first at each end of its range, then at
        deviations stratified over its range.

        The front of a search lives at low orders, and a count model's answer changes in steps along
        each relation: singletons show the surrogate every axis and where it steps. The ends come
        first: a relation's strongest change of a frame, where a step often lies (on one demo frame
        the BLIP's f_pred is 1.7-2.2 for every zoom-out below 0.765 and 0 at 0.78; a stratified
        design that drew 0.78 as its lowest never saw it, and that search reached 25% of NSGA-II's
        hypervolume).
        """
        rng = self.random_state
        n = self.z.n
        span = self.z.z_high - self.z.z_low
        ends = [(k, end) for k in range(n) for end in (self.z.z_low[k], self.z.z_high[k]) if end != 0.0][:q]
        rest = q - len(ends)
        inner = np.arange(rest) % n
        stratum = np.arange(rest) // n
        strata = np.bincount(inner, minlength=n)[inner]
        # A random order of the strata per relation, so a short batch does not favour one end.
        u = (stratum + rng.random(rest)) / strata
        relation = np.concatenate([[k for k, _ in ends], inner]).astype(int)
        deviation = np.concatenate([[end for _, end in ends], self.z.z_low[inner] + span[inner] * u])
        active = np.zeros((q, n), dtype=bool)
        active[np.arange(q), relation] = True
        values = np.zeros((q, n))
        values[np.arange(q), relation] = deviation
        low, high = self.z.extra_low, self.z.extra_high
        extras = low + (high - low) * rng.random((q, low.size))
        return self.z.join(active, values, extras)

    def _initialize_advance(self, infills=None, **kwargs) -> None:
        self._remember(infills)

    def _advance(self, infills=None, **kwargs) -> None:
        self._remember(infills)

    def _set_optimum(self) -> None:
        # The search keeps every evaluation and takes the front itself (search._finish).
        self.opt = None

    def _remember(self, infills: Population) -> None:
        x = infills.get('X')
        self.x_seen = np.vstack([self.x_seen, x])
        self.f_seen = np.vstack([self.f_seen, infills.get('F')])
        failed = infills.get('failed')
        # A driver that marks nothing (a bare pymoo loop): every evaluation counts.
        failed = np.zeros(len(x), bool) if any(f is None for f in failed) else failed.astype(bool)
        self.failed = np.concatenate([self.failed, failed])
        # Failed ones too: the same composition would most likely fail again (greedy decoding).
        self.seen.update(map(tuple, np.round(self.z.features(*self.z.split(x)), 9)))

    def _infill(self) -> Population:
        return Population.new(X=self.propose(self.pop_size))

    def _training(self, active, z, extras, f_pred) -> np.ndarray:
        """Rows to fit on: all while few; then the front's neighbourhood and the latest evaluations."""
        n = len(f_pred)
        if n <= MAX_TRAINING:
            return np.arange(n)
        t = self.z.f_trans(active, z)
        # Rank by how close each point comes to the front: non-dominated layers, peeled repeatedly.
        chosen: list[int] = []
        left = np.arange(n)
        while len(chosen) < MAX_TRAINING // 2 and left.size:
            layer = left[non_dominated(t[left], f_pred[left])]
            chosen += layer.tolist()
            left = np.setdiff1d(left, layer)
        picked = set(chosen[: MAX_TRAINING // 2])
        for i in range(n - 1, -1, -1):
            if len(picked) >= MAX_TRAINING:
                break
            picked.add(i)
        return np.array(sorted(picked))

    def _candidates(self, active, z, extras, front_rows: np.ndarray) -> tuple:
        """Candidate (active, z, extras): Rand samples and the moves (MOVES) around the front's members."""
        rng = self.random_state
        fresh = rand_genotypes(self.space, N_RANDOM, rng)
        ca, cz, ce = self.z.split(fresh)
        # Rand's z is uniform in the whole range; small deviations (where the front's cheap end lies)
        # are drawn as often again by shrinking a copy of each sample.
        shrink = rng.random((N_RANDOM, 1)) ** 2
        parts = [(ca, cz, ce), (ca, cz * shrink, ce)]
        if front_rows.size:
            base = rng.choice(front_rows, size=N_MOVES)
            copies = active[base].copy(), z[base].copy(), extras[base].copy()
            move = rng.integers(0, len(MOVES), size=N_MOVES)
            relation = rng.integers(0, self.z.n, size=N_MOVES)
            moved = Neighbours(*copies, relation, self.z, rng, (active, z, extras), front_rows)
            for k, apply in enumerate(MOVES):
                apply(moved, move == k)
            parts.append((moved.active, moved.z, moved.extras))
        ca = np.vstack([p[0] for p in parts])
        cz = np.clip(np.vstack([p[1] for p in parts]), self.z.z_low, self.z.z_high)
        ce = np.clip(np.vstack([p[2] for p in parts]), self.z.extra_low, self.z.extra_high)
        # Identities change nothing (f_pred 0 exactly): never worth a model call.
        keep = ~self.z.is_identity(ca, cz)
        return ca[keep], cz[keep], ce[keep]

    def propose(self, q: int) -> np.ndarray:
        """The next batch of q genotypes."""
        # Matrices of a few hundred rows: a second BLAS thread costs more than it gives, and on a
        # busy machine OpenBLAS's spinning threads made a 240-row Cholesky 700 times slower (0.2 ms
        # against 170 ms), so the proposal's linear algebra runs on one thread.
        with threadpool_limits(limits=1, user_api='blas'):
            return self._propose(q)

    def _propose(self, q: int) -> np.ndarray:
        parsed = ~self.failed
        if parsed.sum() < 2:
            # Nothing to learn from yet (every answer so far failed): the paper's Rand.
            return rand_genotypes(self.space, q, self.random_state)
        active, z, extras = self.z.split(self.x_seen[parsed])
        f_pred = -self.f_seen[parsed, 1]
        t = self.z.f_trans(active, z)
        features = self.z.features(active, z, extras)
        rows = self._training(active, z, extras, f_pred)
        if self.surrogate is None:
            self.surrogate = GaussianProcess(self.z.feature_group)
        self.batches += 1
        optimise = self.batches <= FULL_REFITS or self.batches % REFIT_EVERY == 0
        self.surrogate.fit(features[rows], f_pred[rows], optimise=optimise)

        front_rows = non_dominated(t, f_pred)
        front_rows = front_rows[f_pred[front_rows] > 0]
        ca, cz, ce = self._candidates(active, z, extras, front_rows)
        xc = self.z.features(ca, cz, ce)
        # Candidates already judged (same features to float noise) would be answered from the cache.
        fresh, unique = [], set()
        for i, key in enumerate(map(tuple, np.round(xc, 9))):
            if key not in self.seen and key not in unique:
                unique.add(key)
                fresh.append(i)
        fresh = np.array(fresh, dtype=int)
        ca, cz, ce, xc = ca[fresh], cz[fresh], ce[fresh], xc[fresh]
        tc = self.z.f_trans(ca, cz)
        # f_pred as the surrogate believes it, with the noise of an answer: a count model's steps
        # look like noise to it.
        belief = self.surrogate.posterior(xc)

        front = np.column_stack([t[front_rows], f_pred[front_rows]])
        t_ref = float(self.z.n)
        # The batch comes from the candidates that score best alone: later picks only lower scores.
        first = ehvi(tc, belief.mean, belief.std(), front, t_ref)
        bold = ehvi(tc, belief.mean, belief.std(EXPLORE_SCALE), front, t_ref)
        short = np.unique(
            np.concatenate(
                [
                    np.argsort(-first, kind='stable')[:SHORTLIST],
                    np.argsort(-bold, kind='stable')[: SHORTLIST // 2],
                ]
            )
        )
        ca, cz, ce, tc = ca[short], cz[short], ce[short], tc[short]
        belief = belief.take(short)
        picks: list[int] = []
        n_explore = int(round(EXPLORE * q))
        for pick in range(min(q, len(belief))):
            widen = EXPLORE_SCALE if pick >= q - n_explore else 1.0
            score = ehvi(tc, belief.mean, belief.std(widen), front, t_ref)
            score[picks] = -np.inf
            j = int(np.argmax(score))
            picks.append(j)
            # Believe the pick at its predicted f_pred: it joins the front, and the candidates that
            # covary with it lose the uncertainty its answer would remove.
            front = np.vstack([front, [tc[j], belief.mean[j]]])
            front = front[non_dominated(front[:, 0], front[:, 1])]
            belief.believe(j)
        chosen = self.z.join(ca[picks], cz[picks], ce[picks])
        if len(chosen) < q:
            # Too few fresh candidates (a tiny space): fill the batch with Rand.
            chosen = np.vstack([chosen, rand_genotypes(self.space, q - len(chosen), self.random_state)])
        return chosen
