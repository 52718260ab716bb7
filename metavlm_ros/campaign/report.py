"""The campaign report: the paper's RQ1-RQ3 tables (Tables 4-7) and plots, as Markdown, CSV or HTML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metavlm_ros.campaign.anytime import anytime_table
from metavlm_ros.campaign.formats import FORMATS, render_csv, render_html, render_markdown, write_report
from metavlm_ros.campaign.loading import SOLUTION_SETS, CampaignResults, CellResult, load_results
from metavlm_ros.campaign.tables import (
    APPROACH,
    BASELINE,
    EVERY_PAIR,
    NOT_SIGNIFICANT,
    PAPER_PAIR,
    RQ3_SAMPLES,
    Report,
    Table,
    approach_name,
    comparisons,
    rq1_tables,
    rq3_table,
    rq21_table,
    rq22_table,
)
from metavlm_ros.common.errors import ParameterError, ResultsError
from metavlm_ros.common.manifest import MANIFEST, check_manifest, write_manifest

# The report's public names, from the modules that hold them: `metavlm_ros.campaign.report` stays the
# one import for callers (commands/report.py, the tests).
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
    'ReportWritten',
    'Table',
    'build_report',
    'comparisons',
    'load_results',
    'render_csv',
    'render_html',
    'render_markdown',
    'write_campaign_report',
    'write_report',
]


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
        compared = '; '.join(f'{approach_name(a)} vs {approach_name(b)}' for a, b in pairs) or 'none'
        notes.append(f'Comparisons (RQ1, RQ3): {compared}; A12 is the first of each pair over the second.')
    tables: list[Table] = []
    if not pairs:
        notes.append(
            f'RQ1 needs the baseline ({baseline or BASELINE}) and another algorithm with finished runs: '
            'not reported.'
        )
    for pair in pairs:
        rq1 = rq1_tables(results, alpha, pair)
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
        tables.append(rq21_table(results, model))
        for criterion in results.criteria(model):
            for algorithm in results.algorithms:
                tables.append(rq22_table(results, model, algorithm, criterion))
        for criterion in results.criteria(model):
            tables.append(rq3_table(results, model, criterion, alpha, rq3, pairs))
        anytime = anytime_table(results, model)
        if anytime is not None:
            tables.append(anytime)
    return Report(results=results, tables=tables, notes=notes)


@dataclass(frozen=True)
class ReportWritten:
    """What `write_campaign_report` wrote, and what became of the campaign's SHA256SUMS.

    Attributes:
        files: the report's files, the main document first.
        listed: the report is inside the campaign and its SHA256SUMS now lists it (rewritten).
        problem: why a SHA256SUMS of the campaign was left as it was although the report is inside:
            it no longer matched the campaign before the report (named), so rewriting it would vouch
            for a change nobody made through metavlm. None otherwise.
    """

    files: list[Path]
    listed: bool = False
    problem: str | None = None


def write_campaign_report(
    report: Report, directory: str | Path, out: str | Path, fmt: str = 'md', plots: bool = True
) -> ReportWritten:
    """Write the report of the campaign in `directory` under `out`, keeping the campaign's SHA256SUMS true.

    A report outside the campaign leaves it untouched. One inside (the default, DIR/report) is listed:
    the manifest is checked first, the report written, and the manifest rewritten over the campaign with
    it, so `sha256sum -c SHA256SUMS` still verifies the campaign and now its report too. A campaign
    without a manifest gets none here (only `metavlm campaign` vouches for its cells); one whose manifest
    no longer matched keeps it as it was, and says why (`ReportWritten.problem`).

    Raises:
        ParameterError: Unknown format.
        OSError: The report cannot be written.
    """
    directory, out = Path(directory), Path(out)
    inside = out.resolve().is_relative_to(directory.resolve()) and (directory / MANIFEST).is_file()
    problem = None
    if inside:
        try:
            check_manifest(directory)
        except ResultsError as exc:
            problem = str(exc)
    files = write_report(report, out, fmt=fmt, plots=plots)
    listed = inside and problem is None
    if listed:
        write_manifest(directory)
    return ReportWritten(files, listed, problem)
