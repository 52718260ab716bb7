"""Loading a campaign's verified cells and their records for the report."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from metavlm_ros.campaign.cells import CELL_FILE, CELLS_DIR, UNVERIFIED, read_campaign, verify_cell
from metavlm_ros.common.errors import InputError, ParameterError
from metavlm_ros.common.results import EVALUATIONS, SUMMARY, read_jsonl
from metavlm_ros.method.answers import key_order
from metavlm_ros.method.metrics import anytime_hypervolume
from metavlm_ros.method.relations import DEFAULT_RELATIONS, RELATION_BY_ID

__all__ = [
    'CampaignResults',
    'CellResult',
    'SOLUTION_SETS',
    'hypervolumes',
    'load_results',
    'non_identity',
]


SOLUTION_SETS = {
    'all': 'all evaluations (every composition each search judged)',
    'final': "the last generation's evaluations of each search (NSGA-II's last offspring, Rand's last batch)",
    'pareto': "each search's non-dominated set (f_pred > 0)",
}


@dataclass
class CellResult:
    """One committed cell: its record (cell.json), search summary and the chosen solution set."""

    info: dict
    summary: dict
    solutions: list[dict]
    front: list[tuple[float, float]] = field(default_factory=list)  # (f_trans, f_pred) of the pareto set
    #: The anytime result: (evaluations k, hypervolume of the first k evaluations) after every batch.
    anytime: list[tuple[int, float]] = field(default_factory=list)
    #: The cell's directory (a results directory of its own); None for a cell made in memory.
    directory: Path | None = None

    @property
    def model(self) -> str:
        return self.info['model']

    @property
    def algorithm(self) -> str:
        return self.info['algorithm']

    @property
    def image(self) -> str:
        return self.info['image']


def hypervolumes(cells: Iterable[CellResult]) -> list[float]:
    """The final hypervolume of each search among `cells` that has one."""
    return [float(c.summary['hypervolume']) for c in cells if c.summary.get('hypervolume') is not None]


def non_identity(cells: Iterable[CellResult]) -> list[dict]:
    """The solutions of `cells` of order 1 and above (the identity is never a violation)."""
    return [r for c in cells for r in c.solutions if r.get('order', 0) >= 1]


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
        return sorted(keys, key=key_order)


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
            cells.append(
                CellResult(
                    info=info,
                    summary=summary,
                    solutions=chosen,
                    front=front,
                    anytime=_anytime(records, summary),
                    directory=cell_dir,
                )
            )
    return CampaignResults(directory=directory, campaign=campaign, solutions=solutions, cells=cells,
                           damaged=damaged, unverified=unverified)  # fmt: skip


def _anytime(records: list[dict], summary: dict) -> list[tuple[int, float]]:
    """The hypervolume after each batch (a generation) of a search, in the order it evaluated."""
    if not records or not summary.get('source'):
        return []
    ordered = sorted(records, key=lambda r: r.get('index', 0))
    f_trans = [float(r['f_trans']) for r in ordered]
    f_pred = [math.nan if r.get('failed') else float(r['f_pred']) for r in ordered]
    generations = [r.get('generation', 0) for r in ordered]
    ends = [
        k + 1 for k in range(len(ordered)) if k + 1 == len(ordered) or generations[k + 1] != generations[k]
    ]
    relations = len(summary.get('relations') or DEFAULT_RELATIONS)
    values = anytime_hypervolume(f_trans, f_pred, len(summary['source']), relations, ends)
    return [(k, float(v)) for k, v in zip(ends, values, strict=True)]


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
