"""The search's defaults, the authors' settings (docs/method.md §7), read by every caller that has one.

SearchConfig, the `metavlm search` and `metavlm demo` options, the tester node's parameters and
campaign files take their defaults from here (the confidence thresholds: metrics.DEFAULT_THRESHOLDS).
"""

__all__ = ['ALGORITHM', 'EVALUATIONS', 'PARETO_PNGS', 'POPULATION', 'SEED']

#: MetaVLM: NSGA-II.
ALGORITHM = 'nsga2'
#: Individuals per generation (NSGA-II) or samples per batch (Rand).
POPULATION = 30
#: Evaluations per searched image.
EVALUATIONS = 3000
#: The seed of every search: the same seed gives the same genotypes.
SEED = 0
#: Follow-up PNGs written per search for its non-dominated set (None: every member). Three: the
#: smallest-f_trans violation, the largest f_pred and the middle of the front; every other member
#: is re-rendered from the stored source frame on demand (`metavlm render`). At the tester's
#: defaults (about 136 searches an hour, ~340 KB per PNG at 768 px) that is ~140 MB an hour where
#: every member (~700) took ~8 GB (docs/results.md, "Disk budget"; bench/results_size.py).
PARETO_PNGS = 3
