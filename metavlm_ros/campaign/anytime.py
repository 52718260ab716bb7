"""Anytime results: each search's hypervolume against its evaluations, and what reaching NSGA-II's costs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from metavlm_ros.campaign.loading import CampaignResults, CellResult
from metavlm_ros.campaign.tables import APPROACH
from metavlm_ros.common.document import Table, slug

__all__ = [
    'ANYTIME_TARGETS',
    'REFERENCE',
    'anytime_band',
    'anytime_table',
    'evaluations_to_reach',
    'references',
]

#: Shares of the reference hypervolume the table asks each algorithm to reach.
ANYTIME_TARGETS = (0.90, 0.95, 1.00)
#: The reference: NSGA-II (MetaVLM) at the campaign's budget, the paper's tables' own search.
REFERENCE = 'nsga2'


def references(results: CampaignResults, model: str) -> dict[str, float]:
    """Per image, the median over runs of NSGA-II's final hypervolume (same reference point as RQ1)."""
    out = {}
    for image in results.images:
        values = [c.summary['hypervolume'] for c in results.of(model, REFERENCE, image)]
        if values:
            out[image] = float(statistics.median(values))
    return out


def evaluations_to_reach(cell: CellResult, target: float) -> int | None:
    """The evaluations after which a search's hypervolume first reached `target` (None: never)."""
    for k, value in cell.anytime:
        # A float's last bit: NSGA-II reaching its own final value must count as reaching it.
        if value >= target - 1e-12:
            return k
    return None


def anytime_table(results: CampaignResults, model: str) -> Table | None:
    """Evaluations each algorithm needs to reach 90, 95 and 100% of NSGA-II's final hypervolume.

    Per image the reference is the median of NSGA-II's runs; each search of an image counts once.
    The median is over the searches that reached the target, and how many did is given beside it:
    a search that never reached it is not a small number. None without NSGA-II runs.
    """
    reference = references(results, model)
    if not reference:
        return None
    rows = []
    for algorithm in results.algorithms:
        cells = [c for c in results.of(model, algorithm) if c.image in reference and c.anytime]
        if not cells:
            continue
        row: list = [APPROACH.get(algorithm, algorithm), len(cells)]
        for share in ANYTIME_TARGETS:
            needed = [evaluations_to_reach(c, share * reference[c.image]) for c in cells]
            reached = [n for n in needed if n is not None]
            row += [statistics.median(reached) if reached else None, len(reached)]
        row.append(statistics.median(c.anytime[-1][0] for c in cells))
        rows.append(row)
    columns = ['algorithm', 'searches']
    formats = ['', 'd']
    for share in ANYTIME_TARGETS:
        # Not ending in '%': a column so named holds percentages (docs/campaigns.md); these hold counts.
        columns += [f'evaluations to {share:.0%} of NSGA-II', f'searches reaching {share:.0%} of NSGA-II']
        formats += ['.0f', 'd']
    columns.append('budget')
    formats.append('.0f')
    return Table(
        key=f'anytime-{slug(model)}',
        title=f"Anytime: evaluations to reach NSGA-II's final hypervolume, {model}",
        columns=columns,
        rows=rows,
        formats=formats,
        note=(
            "Reference per image: the median over runs of NSGA-II's hypervolume after its whole budget "
            '(the RQ1 value, reference point (1, 0) on normalised objectives). Each search counts once; '
            'the median is over the searches that reached the share, and how many did is given beside it.'
        ),
    )


def anytime_band(cells: Sequence[CellResult], grid: np.ndarray) -> tuple[np.ndarray, ...]:
    """(median, lowest, highest) hypervolume over the searches at each evaluation count of `grid`.

    A search's hypervolume between two batches is that of the last batch finished (a step).
    """
    curves = []
    for cell in cells:
        if not cell.anytime:
            continue
        ks = np.array([k for k, _ in cell.anytime])
        values = np.array([v for _, v in cell.anytime])
        at = np.searchsorted(ks, grid, side='right') - 1
        curves.append(np.where(at >= 0, values[np.maximum(at, 0)], 0.0))
    if not curves:
        empty = np.full(len(grid), np.nan)
        return empty, empty, empty
    stacked = np.vstack(curves)
    return np.median(stacked, axis=0), stacked.min(axis=0), stacked.max(axis=0)
