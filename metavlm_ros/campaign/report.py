"""The campaign report: the paper's RQ1-RQ3 tables (Tables 4-7) and plots, as Markdown, CSV or HTML."""

from __future__ import annotations

import csv
import html
import io
import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.campaign.cells import CELL_FILE, CELLS_DIR, UNVERIFIED, read_campaign, verify_cell
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.results import EVALUATIONS, SUMMARY, read_jsonl
from metavlm_ros.method.metrics import non_dominated
from metavlm_ros.method.relations import DEFAULT_RELATIONS, RELATION_BY_ID
from metavlm_ros.method.stats import compare, significant_a12

__all__ = [
    'APPROACH',
    'BASELINE',
    'EVERY_PAIR',
    'FORMATS',
    'NOT_SIGNIFICANT',
    'RQ3_SAMPLES',
    'SOLUTION_SETS',
    'CampaignResults',
    'CellResult',
    'Report',
    'Table',
    'build_report',
    'comparisons',
    'load_results',
    'render_csv',
    'render_html',
    'render_markdown',
    'write_report',
]

FORMATS = ('md', 'html', 'csv')
SOLUTION_SETS = {
    'all': 'all evaluations (every composition each search judged)',
    'final': "the last generation's evaluations of each search (NSGA-II's last offspring, Rand's last batch)",
    'pareto': "each search's non-dominated set (f_pred > 0)",
}
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


# ---------------------------------------------------------------------------------------------------
# Loading


@dataclass
class CellResult:
    """One committed cell: its record (cell.json), search summary and the chosen solution set."""

    info: dict
    summary: dict
    solutions: list[dict]
    front: list[tuple[float, float]] = field(default_factory=list)  # (f_trans, f_pred) of the pareto set

    @property
    def model(self) -> str:
        return self.info['model']

    @property
    def algorithm(self) -> str:
        return self.info['algorithm']

    @property
    def image(self) -> str:
        return self.info['image']


@dataclass
class CampaignResults:
    """Everything a report needs from a campaign results directory."""

    directory: Path
    campaign: dict
    solutions: str
    cells: list[CellResult]
    # Cells that do not match their checksums, (id, what is wrong): left out of every table.
    damaged: list[tuple[str, str]] = field(default_factory=list)
    # Cells committed before cells carried checksums: read, but not verified.
    unverified: int = 0

    @property
    def models(self) -> list[str]:
        """Model names in configuration order."""
        return [m['name'] for m in self.campaign.get('models', [])]

    @property
    def images(self) -> list[str]:
        """Image ids in campaign order."""
        return [im['id'] for im in self.campaign.get('images', [])]

    @property
    def algorithms(self) -> list[str]:
        """Algorithms in configuration order."""
        return list(self.campaign.get('config', {}).get('algorithms', []))

    def of(self, model: str, algorithm: str | None = None, image: str | None = None) -> list[CellResult]:
        """The cells of one model (and algorithm, and image), ordered by run."""
        chosen = [
            c
            for c in self.cells
            if c.model == model
            and (algorithm is None or c.algorithm == algorithm)
            and (image is None or c.image == image)
        ]
        return sorted(chosen, key=lambda c: (c.info['run'], c.image, c.algorithm))

    @property
    def relations(self) -> list[str]:
        """The relations the campaign's searches used, in the fixed order (the paper's six before
        searches recorded theirs)."""
        used = {rid for cell in self.cells for rid in cell.summary.get('relations') or DEFAULT_RELATIONS}
        return [rid for rid in RELATION_BY_ID if rid in used] or list(DEFAULT_RELATIONS)

    @property
    def orders(self) -> tuple[int, ...]:
        """The orders a table lists: 1 to the number of relations searched (1-6 for the paper's six)."""
        return tuple(range(1, len(self.relations) + 1))

    def kind(self, model: str) -> str | None:
        """'count' or 'confidence', from the model's searches; None when it has none yet."""
        for cell in self.of(model):
            if cell.summary.get('kind'):
                return cell.summary['kind']
        return None

    def criteria(self, model: str) -> list[str]:
        """The violation criteria of a model: ['count'] or the thresholds, ascending."""
        keys: set[str] = set()
        for cell in self.of(model):
            for record in cell.solutions:
                keys.update((record.get('violation') or {}).keys())
                break
        return sorted(keys, key=lambda k: (k != 'count', float(k) if k != 'count' else 0.0))


def load_results(directory: str | Path, solutions: str = 'all') -> CampaignResults:
    """Read a campaign results directory.

    Args:
        directory: The directory `metavlm campaign --out` wrote.
        solutions: Which solution set the tables use: 'all', 'final' or 'pareto'.

    Raises:
        InputError: The directory is not a campaign results directory.
        ParameterError: Unknown solution set.
    """
    if solutions not in SOLUTION_SETS:
        raise ParameterError(f'unknown solution set "{solutions}" (choose from {", ".join(SOLUTION_SETS)})')
    directory = Path(directory)
    campaign = read_campaign(directory)
    cells_dir = directory / CELLS_DIR
    cells: list[CellResult] = []
    damaged: list[tuple[str, str]] = []
    unverified = 0
    if cells_dir.is_dir():
        for cell_dir in sorted(p for p in cells_dir.iterdir() if p.is_dir() and not p.name.startswith('.')):
            problem = verify_cell(cell_dir)
            if problem == UNVERIFIED:
                unverified += 1
            elif problem:
                damaged.append((cell_dir.name, problem))
                continue
            info_path = cell_dir / CELL_FILE
            try:
                info = json.loads(info_path.read_text(encoding='utf-8'))
            except (OSError, json.JSONDecodeError) as exc:
                raise InputError(f'{info_path}: unreadable cell record ({exc})') from None
            summaries = read_jsonl(cell_dir / SUMMARY)
            summary = summaries[-1] if summaries else {}
            records = read_jsonl(cell_dir / EVALUATIONS)
            pareto = set(summary.get('pareto', []))
            front = [
                (r['f_trans'], r['f_pred'])
                for r in records
                if r.get('index') in pareto and not r.get('failed')
            ]
            chosen = _solution_set(records, summary, solutions)
            cells.append(CellResult(info=info, summary=summary, solutions=chosen, front=front))
    return CampaignResults(directory=directory, campaign=campaign, solutions=solutions, cells=cells,
                           damaged=damaged, unverified=unverified)  # fmt: skip


def _solution_set(records: list[dict], summary: dict, solutions: str) -> list[dict]:
    usable = [r for r in records if not r.get('failed')]
    if solutions == 'pareto':
        chosen = set(summary.get('pareto', []))
        return [r for r in usable if r.get('index') in chosen]
    if solutions == 'final':
        if not records:
            return []
        last = max(r.get('generation', 0) for r in records)
        return [r for r in usable if r.get('generation', 0) == last]
    return usable


# ---------------------------------------------------------------------------------------------------
# Tables


@dataclass
class Table:
    """One report table: raw values in rows (None for 'not applicable'), formats per column."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[Any]]
    formats: list[str] = field(default_factory=list)
    note: str = ''

    def column(self, name: str) -> list[Any]:
        """The values of one column."""
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def row(self, **match: Any) -> list[Any]:
        """The first row whose named columns equal the given values (KeyError when none)."""
        indices = {self.columns.index(name): value for name, value in match.items()}
        for row in self.rows:
            if all(row[i] == v for i, v in indices.items()):
                return row
        raise KeyError(f'{self.key}: no row with {match}')

    def cell(self, column: str, **match: Any) -> Any:
        """One value: the named column of the first row matching `match`."""
        return self.row(**match)[self.columns.index(column)]

    def formatted(self) -> list[list[str]]:
        """Rows as display strings."""
        formats = self.formats or [''] * len(self.columns)
        return [[_format(value, fmt) for value, fmt in zip(row, formats, strict=True)] for row in self.rows]


def _format(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    if fmt == 'p':
        return '<0.0001' if value < 1e-4 else f'{value:.4f}'
    if fmt == '%':
        return f'{100.0 * value:.1f}'
    if fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt)
    return str(value)


@dataclass
class Report:
    """The whole report: a header, the tables and the notes that explain them."""

    results: CampaignResults
    tables: list[Table]
    notes: list[str]

    def table(self, key: str) -> Table:
        """The table with this key (KeyError when absent)."""
        for table in self.tables:
            if table.key == key:
                return table
        raise KeyError(key)


def _criterion_label(key: str) -> str:
    return 'count' if key == 'count' else f'Th={100 * float(key):g}%'


def _slug(text: str) -> str:
    return ''.join(c if c.isalnum() else '_' for c in text).strip('_').lower()


def _name(algorithm: str) -> str:
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


def build_report(
    directory: str | Path,
    solutions: str = 'all',
    alpha: float = 0.05,
    rq3: str = 'run',
    baseline: str | None = None,
) -> Report:
    """Compute every table of the report from a results directory.

    Args:
        directory: The campaign results directory.
        solutions: The solution set of the RQ2/RQ3 tables: 'all' (default), 'final' or 'pareto'.
        alpha: Significance level of the Mann-Whitney tests.
        rq3: The samples RQ3's test compares: 'run' (default: one mean strength per image and run)
            or 'pooled' (every violating pair).
        baseline: The algorithm RQ1 and RQ3 compare every other one against (default: the campaign's
            `baseline`, else Rand, as the paper); 'all' compares every pair.

    Raises:
        InputError: Not a campaign results directory.
        ParameterError: Unknown solution set, RQ3 sample or baseline.
    """
    if rq3 not in RQ3_SAMPLES:
        raise ParameterError(f'unknown RQ3 sample "{rq3}" (choose from {", ".join(RQ3_SAMPLES)})')
    results = load_results(directory, solutions)
    if baseline is None:
        baseline = results.campaign.get('config', {}).get('baseline')
    pairs = comparisons(results.algorithms, baseline)
    planned = results.campaign.get('cells', 0)
    notes = [
        f'Cells: {len(results.cells)} of {planned} finished.',
        f'Tables RQ2.1, RQ2.2 and RQ3 use {SOLUTION_SETS[solutions]}; RQ1 uses the hypervolume of each '
        "search's non-dominated set over all its evaluations. Failed evaluations (no model answer) are left "
        'out; order-0 solutions (the identity, never a violation) are left out of RQ2 and RQ3.',
        'MR3 (histogram equalisation) at its nominal clip limit 1.0 is active yet costs 0 in f_trans, and '
        "still changes the image (docs/method.md §1): this explains MR3's presence in low-cost compositions.",
        f'RQ3 samples: {RQ3_SAMPLES[rq3]}.',
    ]
    if 'histogram_equalization' not in results.relations:
        del notes[2]  # no MR3 in these searches: nothing to explain
    if results.damaged:
        listed = ', '.join(f'{cell} ({problem})' for cell, problem in results.damaged)
        notes.insert(1, 'Damaged cells left out of every table (they do not match their checksums; running '
                        f'the campaign again redoes them): {listed}.')  # fmt: skip
    if results.unverified:
        notes.insert(1, f'{results.unverified} cells carry no checksums (written before cells had them): '
                        'read unverified.')  # fmt: skip
    if pairs != [PAPER_PAIR]:
        compared = '; '.join(f'{_name(a)} vs {_name(b)}' for a, b in pairs) or 'none'
        notes.append(f'Comparisons (RQ1, RQ3): {compared}; A12 is the first of each pair over the second.')
    tables: list[Table] = []
    if not pairs:
        notes.append(
            f'RQ1 needs the baseline ({baseline or BASELINE}) and another algorithm with finished runs: '
            'not reported.'
        )
    for pair in pairs:
        rq1 = _rq1(results, alpha, pair)
        if rq1:
            tables.extend(rq1)
        else:
            notes.append(
                f'RQ1 needs both algorithms ({pair[0]} and {pair[1]}) with finished runs: not reported.'
            )
    for model in results.models:
        if results.kind(model) is None:
            notes.append(f'{model}: no finished cells yet.')
            continue
        tables.append(_rq21(results, model))
        for criterion in results.criteria(model):
            for algorithm in results.algorithms:
                tables.append(_rq22(results, model, algorithm, criterion))
        for criterion in results.criteria(model):
            tables.append(_rq3(results, model, criterion, alpha, rq3, pairs))
    return Report(results=results, tables=tables, notes=notes)


def _hypervolumes(cells: Iterable[CellResult]) -> list[float]:
    return [float(c.summary['hypervolume']) for c in cells if c.summary.get('hypervolume') is not None]


def _effect(outcome: Any) -> str:
    """The paper's effect column: the A12 magnitude when significant, else the equivalence sign."""
    return outcome.magnitude if outcome.significant else NOT_SIGNIFICANT


def _rq1(results: CampaignResults, alpha: float, pair: tuple[str, str]) -> list[Table]:
    """Table 4: per image and model, two algorithms' hypervolumes across runs compared."""
    first, second = pair
    a, b = _name(first), _name(second)
    rows = []
    outcomes: dict[tuple[str, str], Any] = {}
    totals: dict[str, Counter] = {}
    sizes: set[tuple[int, int]] = set()
    for model in results.models:
        tally = totals.setdefault(model, Counter())
        for image in results.images:
            ours = _hypervolumes(results.of(model, first, image))
            theirs = _hypervolumes(results.of(model, second, image))
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
    a, b = _name(pair[0]), _name(pair[1])
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


def _non_identity(cells: Iterable[CellResult]) -> list[dict]:
    return [r for c in cells for r in c.solutions if r.get('order', 0) >= 1]


def _rq21(results: CampaignResults, model: str) -> Table:
    """Table 5: by order and algorithm, the occurrence of each order and its violation rate(s)."""
    criteria = results.criteria(model)
    columns = ['order']
    formats = ['d']
    per_algorithm = {}
    for algorithm in results.algorithms:
        name = APPROACH.get(algorithm, algorithm)
        columns.append(f'{name} occurrence %')
        columns += [f'{name} VR (Eq. 6) % ({_criterion_label(k)})' for k in criteria]
        formats += ['%'] + ['%'] * len(criteria)
        per_algorithm[algorithm] = _non_identity(results.of(model, algorithm))
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
        key=f'rq2_1-{_slug(model)}',
        title=f'RQ2.1 (Table 5): violation rate by composition order, {model} ({results.kind(model)} type)',
        columns=columns,
        rows=rows,
        formats=formats,
        note=f'Solution set: {SOLUTION_SETS[results.solutions]}. Solutions of order 1-{results.orders[-1]}: '
        f'{counts}. '
        'Occurrence: share of the solutions with that order. VR (Eq. 6): violations over solutions of '
        'that order.',
    )


def _rq22(results: CampaignResults, model: str, algorithm: str, criterion: str) -> Table:
    """Table 6: the compositions that account for most violations of one algorithm (and threshold)."""
    records = _non_identity(results.of(model, algorithm))
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
        key=f'rq2_2-{_slug(model)}-{algorithm}-{_slug(criterion)}',
        title=f'RQ2.2 (Table 6): top compositions by share of violations, {model}, {name}, '
        f'{_criterion_label(criterion)}',
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


def _rq3(
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
        name = _name(algorithm)
        columns += [f'{name} VS', f'{name} violations', f'{name} samples']
        formats += ['.4f', 'd', 'd']
    for first, second in pairs:
        # One pair keeps the paper's column names; several say which pair each test compares.
        which = '' if len(pairs) == 1 else f' {_name(first)} vs {_name(second)}'
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
    title = f'RQ3 (Table 7): violation strength by order, {model}, {_criterion_label(criterion)}'
    if len(pairs) == 1:
        over = f'{_name(pairs[0][0])} over {_name(pairs[0][1])}'
    else:
        over = 'the first of each pair over the second' if pairs else 'no pair (no baseline in the campaign)'
    return Table(
        key=f'rq3-{_slug(model)}-{_slug(criterion)}',
        title=title if samples == 'run' else f'{title} (pooled pairs)',
        columns=columns,
        rows=rows,
        formats=formats,
        note=f'Solution set: {SOLUTION_SETS[results.solutions]}. VS: mean over all violating solutions of '
        f'the summed differences of the violating classes (Eqs. 7-8). {sample_note}. Two-sided '
        f'Mann-Whitney U and A12 of {over}; magnitude {NOT_SIGNIFICANT} when p >= {alpha:g}.',
    )


# ---------------------------------------------------------------------------------------------------
# Writers


def render_markdown(report: Report, plots: Sequence[tuple[str, str]] = ()) -> str:
    """The report as Markdown; `plots` are (title, relative path) pairs to link."""
    lines = ['# metavlm_ros campaign report', '']
    lines += _header_lines(report)
    lines += [''] + [f'- {note}' for note in report.notes] + ['']
    for table in report.tables:
        lines += [f'## {table.title}', '']
        if table.rows:
            lines.append('| ' + ' | '.join(table.columns) + ' |')
            lines.append('|' + '---|' * len(table.columns))
            lines += ['| ' + ' | '.join(row) + ' |' for row in table.formatted()]
        else:
            lines.append('(no rows)')
        if table.note:
            lines += ['', table.note]
        lines.append('')
    if plots:
        lines += ['## Plots', '']
        lines += [f'![{title}]({path})' for title, path in plots]
        lines.append('')
    return '\n'.join(lines)


def _header_lines(report: Report) -> list[str]:
    campaign = report.results.campaign
    config = campaign.get('config', {})
    lines = [
        f'- Results: `{report.results.directory}` (campaign {campaign.get("fingerprint")}, metavlm_ros '
        f'{campaign.get("version")})',
        f'- Images: {len(report.results.images)}; runs: {config.get("runs")}; population '
        f'{config.get("population")}, {config.get("evaluations")} evaluations per search; base seed '
        f'{config.get("seed")}',
    ]
    for model in campaign.get('models', []):
        digest = model.get('weights_sha256') or 'unknown'
        lines.append(
            f'- Model {model["name"]}: {model["backend"]} `{model["model"]}`, weights sha256 {digest[:16]}'
        )
    # Campaigns made before the warp setting existed used fused warps.
    warp = config.get('warp', 'fused')
    lines.append(f'- Warps: {warp} ({WARP_NOTES.get(warp, "unknown")}; docs/method.md §8)')
    threads = Counter(str(c.info.get('torch_threads', 'not recorded')) for c in report.results.cells)
    if len(threads) > 1:
        mixed = ', '.join(f'{t} ({n} cells)' for t, n in sorted(threads.items()))
        lines.append(f'- Torch threads per cell: MIXED, {mixed}: float sums may differ in the last digits')
    elif threads:
        lines.append(f'- Torch threads per cell: {next(iter(threads))}')
    relations = report.results.relations
    if relations != list(DEFAULT_RELATIONS):
        numbered = ', '.join(f'MR{RELATION_BY_ID[rid].number} {rid}' for rid in relations)
        lines.append(f'- Relations: {numbered} (docs/method.md §1, §12)')
    lines.append(f'- Solution set: {SOLUTION_SETS[report.results.solutions]}')
    return lines


def render_csv(table: Table) -> str:
    """One table as CSV, unrounded (percentages in % columns); empty fields for 'not applicable'."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator='\n')
    writer.writerow(table.columns)
    formats = table.formats or [''] * len(table.columns)
    for row in table.rows:
        writer.writerow([_csv_value(v, fmt) for v, fmt in zip(row, formats, strict=True)])
    return buffer.getvalue()


def _csv_value(value: Any, fmt: str) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ''
    # A column labelled % holds percentages, unrounded (the tables keep fractions internally).
    return 100.0 * value if fmt == '%' else value


def render_html(report: Report, plots: Sequence[tuple[str, str]] = ()) -> str:
    """A self-contained HTML page (plots linked as PNG files next to it)."""
    esc = html.escape
    parts = [
        '<!DOCTYPE html>',
        '<html lang="en"><head><meta charset="utf-8"><title>metavlm_ros campaign report</title>',
        '<style>body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;'
        'margin:0.5em 0}td,th{border:1px solid #aaa;padding:0.2em 0.5em;text-align:right}'
        'th{background:#eee}td:first-child,th:first-child{text-align:left}img{max-width:48em;display:block;'
        'margin:1em 0}.note{color:#444;font-size:90%}</style></head><body>',
        '<h1>metavlm_ros campaign report</h1><ul>',
    ]
    parts += [f'<li>{esc(line[2:]).replace("`", "")}</li>' for line in _header_lines(report)]
    parts += [f'<li>{esc(note)}</li>' for note in report.notes]
    parts.append('</ul>')
    parts.append('<h2>Contents</h2><ul>')
    parts += [f'<li><a href="#{esc(t.key)}">{esc(t.title)}</a></li>' for t in report.tables]
    if plots:
        parts.append('<li><a href="#plots">Plots</a></li>')
    parts.append('</ul>')
    for table in report.tables:
        parts.append(f'<h2 id="{esc(table.key)}">{esc(table.title)}</h2>')
        parts.append('<table><tr>' + ''.join(f'<th>{esc(c)}</th>' for c in table.columns) + '</tr>')
        for row in table.formatted():
            parts.append('<tr>' + ''.join(f'<td>{esc(v)}</td>' for v in row) + '</tr>')
        parts.append('</table>')
        if table.note:
            parts.append(f'<p class="note">{esc(table.note)}</p>')
    if plots:
        parts.append('<h2 id="plots">Plots</h2>')
        for title, path in plots:
            parts.append(f'<h3>{esc(title)}</h3><img src="{esc(path)}" alt="{esc(title)}">')
    parts.append('</body></html>')
    return '\n'.join(parts) + '\n'


def write_report(report: Report, out: str | Path, fmt: str = 'md', plots: bool = True) -> list[Path]:
    """Write the report under `out`: report.md, index.html, or one CSV per table; plots as PNG.

    Returns:
        The files written, the main document first.

    Raises:
        ParameterError: Unknown format.
    """
    if fmt not in FORMATS:
        raise ParameterError(f'unknown report format "{fmt}" (choose from {", ".join(FORMATS)})')
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    images = make_plots(report.results, out) if plots and fmt != 'csv' else []
    links = [(title, path.relative_to(out).as_posix()) for title, path in images]
    if fmt == 'md':
        path = out / 'report.md'
        path.write_text(render_markdown(report, links), encoding='utf-8')
        written.append(path)
    elif fmt == 'html':
        path = out / 'index.html'
        path.write_text(render_html(report, links), encoding='utf-8')
        written.append(path)
    else:
        for table in report.tables:
            path = out / f'{table.key}.csv'
            path.write_text(render_csv(table), encoding='utf-8')
            written.append(path)
    return written + [path for _, path in images]


# ---------------------------------------------------------------------------------------------------
# Plots


def make_plots(results: CampaignResults, out: Path) -> list[tuple[str, Path]]:
    """PNG plots under out/plots: non-dominated sets per image, VR by order, hypervolume distributions."""
    import matplotlib

    matplotlib.use('Agg')  # files only: no display on robots, CI or cluster nodes
    import matplotlib.pyplot as plt

    plots_dir = out / 'plots'
    plots_dir.mkdir(parents=True, exist_ok=True)
    written: list[tuple[str, Path]] = []
    colours = {'nsga2': 'tab:blue', 'random': 'tab:orange', 'nsga3': 'tab:green', 'smsemoa': 'tab:red',
               'moead': 'tab:purple'}  # fmt: skip

    def save(fig, name: str, title: str) -> None:
        path = plots_dir / f'{name}.png'
        fig.savefig(path, dpi=90, bbox_inches='tight')
        plt.close(fig)
        written.append((title, path))

    for model in results.models:
        if results.kind(model) is None:
            continue
        for image in results.images:
            cells = results.of(model, image=image)
            if not cells:
                continue
            fig, ax = plt.subplots(figsize=(5.5, 4))
            for algorithm in results.algorithms:
                front_cells = [c for c in cells if c.algorithm == algorithm]
                points = np.asarray([p for c in front_cells for p in c.front], dtype=float).reshape(-1, 2)
                if points.size == 0:
                    continue
                label = APPROACH.get(algorithm, algorithm)
                colour = colours.get(algorithm)
                ax.scatter(
                    points[:, 0], points[:, 1], s=12, alpha=0.35, color=colour, label=f'{label} (runs)'
                )
                front = points[non_dominated(points[:, 0], points[:, 1])]
                front = front[np.argsort(front[:, 0])]
                ax.step(front[:, 0], front[:, 1], where='post', color=colour, label=f'{label} (union front)')
            ax.set_xlabel('f_trans (minimise)')
            ax.set_ylabel('f_pred (maximise)')
            ax.set_title(f'{model} / {image}: non-dominated sets')
            ax.legend(fontsize=7)
            save(fig, f'front-{_slug(model)}-{_slug(image)}', f'Non-dominated sets, {model}, {image}')

        criteria = results.criteria(model)
        fig, axes = plt.subplots(1, len(criteria), figsize=(4.5 * len(criteria), 3.5), squeeze=False)
        width = 0.8 / max(1, len(results.algorithms))
        for ax, criterion in zip(axes[0], criteria, strict=True):
            for i, algorithm in enumerate(results.algorithms):
                records = _non_identity(results.of(model, algorithm))
                rates = []
                for order in results.orders:
                    flags = [bool(r['violation'].get(criterion)) for r in records if r['order'] == order]
                    rates.append(sum(flags) / len(flags) if flags else math.nan)  # no bar: nothing judged
                offset = (i - (len(results.algorithms) - 1) / 2) * width
                ax.bar(np.array(results.orders) + offset, rates, width,
                       color=colours.get(algorithm), label=APPROACH.get(algorithm, algorithm))  # fmt: skip
            ax.set_xlabel('composition order')
            ax.set_ylabel('violation rate')
            ax.set_ylim(0, 1.15)  # headroom for the legend above the bars
            ax.set_xticks(results.orders)
            ax.set_xlim(0.5, len(results.orders) + 0.5)
            ax.set_title(_criterion_label(criterion))
            ax.legend(fontsize=7, loc='upper left', ncol=2)
        fig.suptitle(f'{model}: violation rate by order ({SOLUTION_SETS[results.solutions].split(" (")[0]})')
        fig.tight_layout()
        save(fig, f'vr-{_slug(model)}', f'Violation rate by order, {model}')

        data, labels, colour_list = [], [], []
        for image in results.images:
            for algorithm in results.algorithms:
                values = _hypervolumes(results.of(model, algorithm, image))
                if values:
                    data.append(values)
                    labels.append(f'{image}\n{APPROACH.get(algorithm, algorithm)}')
                    colour_list.append(colours.get(algorithm, 'grey'))
        if data:
            fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(data)), 3.8))
            boxes = ax.boxplot(data, patch_artist=True)
            ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
            for patch, colour in zip(boxes['boxes'], colour_list, strict=True):
                patch.set_facecolor(colour)
                patch.set_alpha(0.5)
            ax.set_ylabel('hypervolume')
            ax.set_title(f'{model}: hypervolume across runs')
            save(fig, f'hv-{_slug(model)}', f'Hypervolume distributions, {model}')
    return written
