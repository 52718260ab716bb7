"""The search's defaults, the authors' settings (docs/method.md §7), read by every caller that has one.

SearchConfig, the `metavlm search` and `metavlm demo` options, the tester node's parameters and
campaign files take their defaults from here (the confidence thresholds: metrics.DEFAULT_THRESHOLDS).
"""

__all__ = ['ALGORITHM', 'EVALUATIONS', 'POPULATION', 'SEED']

#: MetaVLM: NSGA-II.
ALGORITHM = 'nsga2'
#: Individuals per generation (NSGA-II) or samples per batch (Rand).
POPULATION = 30
#: Evaluations per searched image.
EVALUATIONS = 3000
#: The seed of every search: the same seed gives the same genotypes.
SEED = 0
