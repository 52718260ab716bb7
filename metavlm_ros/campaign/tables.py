"""The report's tables: the paper's RQ1-RQ3 (Tables 4-7) from a campaign's results."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metavlm_ros.campaign.loading import SOLUTION_SETS, CampaignResults, hypervolumes, non_identity
from metavlm_ros.common.document import Section, Table, slug
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.answers import key_label
from metavlm_ros.method.stats import compare, significant_a12

__all__ = [
    'APPROACH',
    'BASELINE',
    'EVERY_PAIR',
    'NOT_SIGNIFICANT',
    'PAPER_PAIR',
    'RQ3_SAMPLES',
    'Report',
    'TOP_COMPOSITIONS',
    'Table',
    'WARP_NOTES',
    'approach_name',
    'comparisons',
    'criterion_label',
    'rq1_tables',
    'rq21_table',
    'rq22_table',
    'rq3_table',
]


# What one RQ3 sample is: the mean strength of one search (the default, as RQ1 takes one
# hypervolume per search) or every violating pair of every search pooled.
RQ3_SAMPLES = {
    'run': 'one value per (image, run): the mean violation strength of that search',
    'pooled': 'every violating pair of every image and run pooled (not the paper-level statistic)',
}
# The names the tables give the algorithms: the paper's for its two approaches.
APPROACH = {
    'nsga2': 'MetaVLM',
    'random': 'Rand',
    'nsga3': 'NSGA-III',
    'smsemoa': 'SMS-EMOA',
    'moead': 'MOEA/D',
    'mobo': 'MOBO',
}
# The paper compares MetaVLM against Rand; the tables of that pair keep the paper's names and keys.
BASELINE = 'random'
PAPER_PAIR = ('nsga2', 'random')
# `baseline: all` compares every pair of algorithms instead of each against one baseline.
EVERY_PAIR = 'all'
WARP_NOTES = {
    'fused': 'adjacent affine relations resampled once',
    'sequential': 'resampled after every relation, as the paper',
}
# What the paper prints instead of an effect size when a difference is not significant.
NOT_SIGNIFICANT = '≡'
TOP_COMPOSITIONS = 10


@dataclass
class Report:
    """The whole report: a header, the tables and the notes that explain them, and sections a caller
    adds after the tables (`metavlm report`: the failure modes, from explain/, a layer above)."""

    results: CampaignResults
    tables: list[Table]
    notes: list[str]
    sections: list[Section] = field(default_factory=list)

    def table(self, key: str) -> Table:
        """The table with this key (KeyError when absent)."""
        for table in self.tables:
            if table.key == key:
                return table
        raise KeyError(key)


def criterion_label(key: str) -> str:
    """A violation criterion's name in a table: 'count', or the confidence threshold as 'Th=5%'."""
    return key_label(key, short=True)


def approach_name(algorithm: str) -> str:
    """An algorithm's name in the tables: the paper's for its two approaches."""
    return APPROACH.get(algorithm, algorithm)


def comparisons(algorithms: Sequence[str], baseline: str | None = None) -> list[tuple[str, str]]:
    """The (algorithm, baseline) pairs RQ1 and RQ3 compare, in the campaign's order of algorithms.

    Args:
        algorithms: The campaign's algorithms.
        baseline: The algorithm every other one is compared against; None for the paper's (Rand) when
            the campaign has it, else no comparison; 'all' for every pair of algorithms.

    Raises:
        ParameterError: When a named baseline is not one of the campaign's algorithms.
    """
    algorithms = list(algorithms)
    if baseline == EVERY_PAIR:
        return [(a, b) for i, a in enumerate(algorithms) for b in algorithms[i + 1 :]]
    if baseline is None:
        if BASELINE not in algorithms:
            return []
        baseline = BASELINE
    if baseline not in algorithms:
        raise ParameterError(
            f'baseline "{baseline}" is not one of the campaign\'s algorithms ({", ".join(algorithms)}); '
            f'choose one of them or {EVERY_PAIR}'
        )
    return [(a, baseline) for a in algorithms if a != baseline]


def _pair_key(pair: tuple[str, str]) -> str:
    """'' for the paper's pair (its tables keep the paper's keys), else '-<a>-vs-<b>'."""
    return '' if pair == PAPER_PAIR else f'-{pair[0]}-vs-{pair[1]}'


def _effect(outcome: Any) -> str:
    """The paper's effect column: the A12 magnitude when significant, else the equivalence sign."""
    return outcome.magnitude if outcome.significant else NOT_SIGNIFICANT


def rq1_tables(results: CampaignResults, alpha: float, pair: tuple[str, str]) -> list[Table]:
    """Table 4: per image and model, two algorithms' hypervolumes across runs compared."""
    first, second = pair
    a, b = approach_name(first), approach_name(second)
    rows = []
    outcomes: dict[tuple[str, str], Any] = {}
    totals: dict[str, Counter] = {}
    sizes: set[tuple[int, int]] = set()
    for model in results.models:
        tally = totals.setdefault(model, Counter())
        for image in results.images:
            ours = hypervolumes(results.of(model, first, image))
            theirs = hypervolumes(results.of(model, second, image))
            if not ours or not theirs:
                continue
            outcome = outcomes[model, image] = compare(ours, theirs, alpha=alpha)
            sizes.add((len(ours), len(theirs)))
            better = {'first': a, 'second': b}.get(outcome.better, 'no significant difference')
            tally[{'first': 'wins', 'second': 'losses'}.get(outcome.better, 'ties')] += 1
            means = float(np.mean(ours)), float(np.mean(theirs))
            rows.append(
                [
                    model,
                    image,
                    len(ours),
                    len(theirs),
                    *means,
                    outcome.p,
                    outcome.a12,
                    _effect(outcome),
                    better,
                ]
            )
    if not rows:
        return []
    key = _pair_key(pair)
    table = Table(
        key=f'rq1{key}',
        title=f'RQ1 (Table 4): hypervolume of {a} vs {b} across runs',
        columns=['model', 'image', f'runs {a}', f'runs {b}', f'HV {a} (mean)', f'HV {b} (mean)', 'p',
                 'A12', 'magnitude', 'better'],
        rows=rows,
        formats=['', '', 'd', 'd', '.4f', '.4f', 'p', '.3f', '', ''],
        note=f'Two-sided Mann-Whitney U, significant when p < {alpha:g}; A12 is {a} over {b}; '
        f'magnitude {NOT_SIGNIFICANT} when the difference is not significant, as in the paper.'
        + _detectable(sizes, alpha),
    )  # fmt: skip
    total_rows = [[m, t['wins'], t['losses'], t['ties']] for m, t in totals.items() if sum(t.values())]
    overall = Counter()
    for t in totals.values():
        overall.update(t)
    total_rows.append(['all models', overall['wins'], overall['losses'], overall['ties']])
    summary = Table(
        key=f'rq1-totals{key}',
        title=f'RQ1: totals over images ({a} wins / {b} wins / no significant difference)',
        columns=['model', f'{a} better', f'{b} better', 'no significant difference'],
        rows=total_rows,
        formats=['', 'd', 'd', 'd'],
    )
    return [table, _table4(results, outcomes, alpha, pair), summary]


def _detectable(sizes: set[tuple[int, int]], alpha: float) -> str:
    """What the test can call significant with the numbers of runs compared (stats.significant_a12),
    as a sentence led by a space; '' when nothing was compared."""
    if not sizes:
        return ''
    parts = []
    for m, n in sorted(sizes):
        needed = significant_a12(m, n, alpha)
        if needed is None:
            parts.append(f'with {m} runs against {n} no outcome reaches p < {alpha:g}')
        else:
            bounds = f'A12 >= {needed:.3f} or <= {1 - needed:.3f}'
            parts.append(f'with {m} runs against {n}, p < {alpha:g} needs {bounds}')
    return f' What the runs can show (hypervolumes without ties): {"; ".join(parts)}.'


def _table4(
    results: CampaignResults, outcomes: dict[tuple[str, str], Any], alpha: float, pair: tuple[str, str]
) -> Table:
    """RQ1 laid out as the paper's Table 4: one row per image, the models side by side."""
    a, b = approach_name(pair[0]), approach_name(pair[1])
    models = [m for m in results.models if any(key[0] == m for key in outcomes)]
    columns, formats = ['image'], ['']
    for model in models:
        columns += [f'{model} p', f'{model} A12', f'{model} best']
        formats += ['p', '', '']
    rows = []
    for image in results.images:
        if not any((m, image) in outcomes for m in models):
            continue
        row: list[Any] = [image]
        for model in models:
            outcome = outcomes.get((model, image))
            if outcome is None:
                row += [None, None, None]
                continue
            best = {'first': a, 'second': b}.get(outcome.better, NOT_SIGNIFICANT)
            row += [outcome.p, _effect(outcome), best]
        rows.append(row)
    return Table(
        key=f'table4{_pair_key(pair)}',
        title=f'Table 4 view: hypervolume, {a} vs {b}, one row per image',
        columns=columns,
        rows=rows,
        formats=formats,
        note=f"The RQ1 table above, laid out as the paper's Table 4. A12: the magnitude of {a} over "
        f'{b} (negligible, small, medium, large) when p < {alpha:g}, else {NOT_SIGNIFICANT}; best: the '
        f'approach with the higher hypervolume when the difference is significant, else {NOT_SIGNIFICANT}.',
    )


def rq21_table(results: CampaignResults, model: str) -> Table:
    """Table 5: by order and algorithm, the occurrence of each order and its violation rate(s)."""
    criteria = results.criteria(model)
    columns = ['order']
    formats = ['d']
    per_algorithm = {}
    for algorithm in results.algorithms:
        name = APPROACH.get(algorithm, algorithm)
        columns.append(f'{name} occurrence %')
        columns += [f'{name} VR (Eq. 6) % ({criterion_label(k)})' for k in criteria]
        formats += ['%'] + ['%'] * len(criteria)
        per_algorithm[algorithm] = non_identity(results.of(model, algorithm))
    rows = []
    for order in results.orders:
        row: list[Any] = [order]
        for algorithm in results.algorithms:
            records = per_algorithm[algorithm]
            at_order = [r for r in records if r['order'] == order]
            row.append(len(at_order) / len(records) if records else None)
            for key in criteria:
                flags = [bool(r['violation'].get(key)) for r in at_order]
                row.append(sum(flags) / len(flags) if flags else None)
        rows.append(row)
    counts = ', '.join(f'{APPROACH.get(a, a)} {len(r)}' for a, r in per_algorithm.items())
    return Table(
        key=f'rq2_1-{slug(model)}',
        title=f'RQ2.1 (Table 5): violation rate by composition order, {model} ({results.kind(model)} type)',
        columns=columns,
        rows=rows,
        formats=formats,
        note=f'Solution set: {SOLUTION_SETS[results.solutions]}. Solutions of order 1-{results.orders[-1]}: '
        f'{counts}. '
        'Occurrence: share of the solutions with that order. VR (Eq. 6): violations over solutions of '
        'that order.',
    )


def rq22_table(results: CampaignResults, model: str, algorithm: str, criterion: str) -> Table:
    """Table 6: the compositions that account for most violations of one algorithm (and threshold)."""
    records = non_identity(results.of(model, algorithm))
    judged: Counter = Counter()
    violating: Counter = Counter()
    orders: dict[str, int] = {}
    for record in records:
        label = record['composition']
        orders[label] = record['order']
        judged[label] += 1
        violating[label] += bool(record['violation'].get(criterion))
    total = sum(violating.values())
    ranked = sorted(
        (label for label in violating if violating[label]), key=lambda k: (-violating[k], orders[k], k)
    )
    rows = [
        [rank, label, orders[label], violating[label], violating[label] / total, judged[label],
         violating[label] / judged[label]]
        for rank, label in enumerate(ranked[:TOP_COMPOSITIONS], start=1)
    ]  # fmt: skip
    name = APPROACH.get(algorithm, algorithm)
    return Table(
        key=f'rq2_2-{slug(model)}-{algorithm}-{slug(criterion)}',
        title=f'RQ2.2 (Table 6): top compositions by share of violations, {model}, {name}, '
        f'{criterion_label(criterion)}',
        columns=['rank', 'composition', 'order', 'violations', 'share of violations %', 'solutions',
                 'VR (Eq. 6) %'],
        rows=rows,
        formats=['d', '', 'd', 'd', '%', 'd', '%'],
        note=f'Solution set: {SOLUTION_SETS[results.solutions]}. {total} violations among {len(records)} '
        f'solutions of order 1-{results.orders[-1]}. Share of violations: the composition\'s violations over '
        'all violations '
        "(the column the paper's Table 6 calls VR). VR (Eq. 6): the composition's violations over its "
        'solutions.',
    )  # fmt: skip


def _strengths(records: Iterable[dict], order: int, criterion: str) -> list[float]:
    values = []
    for record in records:
        if record['order'] != order or not record['violation'].get(criterion):
            continue
        strength = (record.get('strength') or {}).get(criterion)
        if strength is not None:
            values.append(float(strength))
    return values


def rq3_table(
    results: CampaignResults,
    model: str,
    criterion: str,
    alpha: float,
    samples: str,
    pairs: Sequence[tuple[str, str]],
) -> Table:
    """Table 7: violation strength by order and algorithm, each pair compared by Mann-Whitney and A12."""
    algorithms = results.algorithms
    cells = {a: results.of(model, a) for a in algorithms}
    columns = ['order']
    formats = ['d']
    for algorithm in algorithms:
        name = approach_name(algorithm)
        columns += [f'{name} VS', f'{name} violations', f'{name} samples']
        formats += ['.4f', 'd', 'd']
    for first, second in pairs:
        # One pair keeps the paper's column names; several say which pair each test compares.
        which = '' if len(pairs) == 1 else f' {approach_name(first)} vs {approach_name(second)}'
        columns += [f'p{which}', f'A12{which}', f'magnitude{which}']
        formats += ['p', '.3f', '']
    rows = []
    for order in results.orders:
        row: list[Any] = [order]
        tested = {}
        for algorithm in algorithms:
            # One list of strengths per search (image, run); searches without a violation give none.
            per_search = [_strengths(c.solutions, order, criterion) for c in cells[algorithm]]
            pooled = [v for values in per_search for v in values]
            if samples == 'run':
                tested[algorithm] = [float(np.mean(values)) for values in per_search if values]
            else:
                tested[algorithm] = pooled
            row += [float(np.mean(pooled)) if pooled else None, len(pooled), len(tested[algorithm])]
        for first, second in pairs:
            if tested[first] and tested[second]:
                outcome = compare(tested[first], tested[second], alpha=alpha)
                row += [outcome.p, outcome.a12, _effect(outcome)]
            else:
                row += [None, None, None]
        rows.append(row)
    sample_note = (
        'Samples: searches (image, run) with a violation of that order; the test compares their mean '
        'strengths'
        if samples == 'run'
        else 'Samples: every violating pair, pooled over images and runs (POOLED, not one value per run)'
    )
    title = f'RQ3 (Table 7): violation strength by order, {model}, {criterion_label(criterion)}'
    if len(pairs) == 1:
        over = f'{approach_name(pairs[0][0])} over {approach_name(pairs[0][1])}'
    else:
        over = 'the first of each pair over the second' if pairs else 'no pair (no baseline in the campaign)'
    return Table(
        key=f'rq3-{slug(model)}-{slug(criterion)}',
        title=title if samples == 'run' else f'{title} (pooled pairs)',
        columns=columns,
        rows=rows,
        formats=formats,
        note=f'Solution set: {SOLUTION_SETS[results.solutions]}. VS: mean over all violating solutions of '
        f'the summed differences of the violating classes (Eqs. 7-8). {sample_note}. Two-sided '
        f'Mann-Whitney U and A12 of {over}; magnitude {NOT_SIGNIFICANT} when p >= {alpha:g}.',
    )
