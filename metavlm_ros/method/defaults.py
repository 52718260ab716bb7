"""The search's defaults, the authors' settings (docs/method.md §7), read by every caller that has one.

SearchConfig, the `metavlm search` and `metavlm demo` options, the tester node's parameters and
campaign files take their defaults from here (the confidence thresholds: metrics.DEFAULT_THRESHOLDS).
"""

__all__ = [
    'ALGORITHM',
    'EVALUATIONS',
    'PARETO_PNGS',
    'POPULATION',
    'SEED',
    'TESTER_PARETO_PNGS',
    'TESTER_VIOLATION_PNGS',
]

#: MetaVLM: NSGA-II.
ALGORITHM = 'nsga2'
#: Individuals per generation (NSGA-II) or samples per batch (Rand).
POPULATION = 30
#: Evaluations per searched image.
EVALUATIONS = 3000
#: The seed of every search: the same seed gives the same genotypes.
SEED = 0
#: Follow-up PNGs written per search for its non-dominated set (None: every member), by `metavlm
#: search` and campaigns. Three: the smallest-f_trans violation, the largest f_pred and the middle of
#: the front; every other member is re-rendered from the stored source frame on demand (`metavlm
#: render`), where every member (~700 a search) took ~60 MB (docs/results.md, "Follow-ups on demand").
PARETO_PNGS = 3
#: The tester's, which searches one camera frame after another (about 136 searches an hour at its
#: defaults): no Pareto PNG, and one for the first violation it publishes on each frame (the one its
#: `violations` status and record name). Records (0.75 MB a search) and the source frame (0.34 MB)
#: leave room under issue 36's 200 MB an hour for one follow-up PNG (~0.3 MB at 768 px): 190 MB an
#: hour with it, 208 with the smallest-f_trans Pareto member's instead (0.39 MB on average: CLAHE
#: near nominal sharpens the noise), 351 with 3 + 3 (docs/results.md, "What a tester writes an
#: hour"; bench/results_size.py). Any other follow-up: `metavlm render`.
TESTER_PARETO_PNGS = 0
TESTER_VIOLATION_PNGS = 1
