"""The assurance workflow as the commands and the demo run it: verify frames, judge evidence, compare."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metavlm_ros.assurance.compare import REGRESSED, Change, compare
from metavlm_ros.assurance.criteria import Criteria
from metavlm_ros.assurance.evidence import load_evidence
from metavlm_ros.assurance.gather import gather, plan
from metavlm_ros.assurance.judge import judge
from metavlm_ros.assurance.report import write_compare_report, write_report
from metavlm_ros.assurance.verdict import FailureModes, Verdict, overall
from metavlm_ros.common.directories import build_aside
from metavlm_ros.common.errors import ParameterError, ResultsError
from metavlm_ros.common.images import Frame
from metavlm_ros.common.manifest import MANIFEST, check_manifest, write_manifest

__all__ = [
    'Comparison',
    'EvidenceCheck',
    'Explainer',
    'Verification',
    'checked_evidence',
    'compare_results',
    'verify_frames',
    'verify_results',
]


#: Called with the verdicts before the verdict is written, it may write beside it in OUT (before its
#: SHA256SUMS) and returns the failure modes that break each failing criterion (None: none to name).
Explainer = Callable[[list[Verdict]], FailureModes | None]


@dataclass
class Verification:
    """A verification's verdicts, its overall outcome, the files it wrote and the failure modes its
    verdict names (None: none named)."""

    criteria: Criteria
    verdicts: list[Verdict]
    written: list[Path] = field(default_factory=list)
    modes: FailureModes | None = None

    @property
    def outcome(self) -> str:
        return overall(self.verdicts)


@dataclass
class Comparison:
    """A comparison's items, what differed between the two, and the files it wrote."""

    changes: list[Change]
    notes: list[str]
    written: list[Path]
    unchecked: list[str]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == REGRESSED]


@dataclass(frozen=True)
class EvidenceCheck:
    """What `checked_evidence` checked: the directory's SHA256SUMS (False: it has none), and how many
    campaign cells matched the checksums they were committed with."""

    manifest: bool
    cells: int = 0

    @property
    def message(self) -> str:
        said = f'{MANIFEST} verified' if self.manifest else f'no {MANIFEST}: not verified'
        return said + (f'; {self.cells} campaign cell(s) match their checksums' if self.cells else '')


def checked_evidence(root: Path) -> EvidenceCheck:
    """Check the evidence under `root` before it is judged: its SHA256SUMS where it has one, and each
    campaign cell against the checksums it was committed with.

    Raises:
        ResultsError: A file does not match (named).
    """
    from metavlm_ros.campaign.cells import CELLS_DIR, UNVERIFIED, verify_cell

    manifest = check_manifest(root)
    cells = [c for c in sorted(root.rglob(CELLS_DIR)) if c.is_dir()]
    checked = 0
    for cell in (c for folder in cells for c in sorted(folder.iterdir()) if c.is_dir() and c.name[0] != '.'):
        problem = verify_cell(cell)
        if problem and problem != UNVERIFIED:
            raise ResultsError(f'{cell}: {problem}')
        checked += problem is None
    return EvidenceCheck(manifest, checked)


def _outside(out: Path, evidence: Path) -> None:
    if out.resolve().is_relative_to(evidence.resolve()):
        raise ParameterError(f'--out {out}: inside the evidence {evidence}; write it elsewhere')


def verify_results(
    criteria: Criteria,
    results: Path,
    out: Path,
    *,
    junit: Path | None = None,
    explain: Explainer | None = None,
) -> Verification:
    """Judge the evidence under `results` as it is (checked against its SHA256SUMS where it has one);
    the verdict goes into `out`, never inside the evidence. `explain` (called once judged, before
    anything is written) names the failure modes the verdict shows."""
    _outside(out, results)
    manifest = checked_evidence(results).message
    evidence = load_evidence(results)
    verdicts = judge(criteria, evidence)
    modes = None if explain is None else explain(verdicts)
    written = write_report(out, criteria, evidence, verdicts, manifest=manifest, junit=junit, modes=modes)
    return Verification(criteria, verdicts, written, modes)


def verify_frames(
    criteria: Criteria,
    frames: Sequence[Frame],
    backend,
    model: dict,
    out: Path,
    *,
    population: int,
    evaluations: int,
    seed: int,
    working_size: int | str | None,
    envelope_rounds: int,
    junit: Path | None = None,
    explain: Explainer | None = None,
    log: Callable[[str], None] = print,
) -> Verification:
    """Search `frames` as the criteria need into out/evidence (out appears once every search finished),
    judge, and write the verdict and a SHA256SUMS of the whole of `out`. `explain` (called once judged,
    before the verdict) may write into `out` too, and names the failure modes the verdict shows.

    Raises:
        InputError: `out` exists.
    """
    if envelope_rounds < 1:
        raise ParameterError(f'--envelope-rounds must be at least 1, got {envelope_rounds}')
    planned = plan(
        criteria,
        population=population,
        evaluations=evaluations,
        seed=seed,
        working_size=working_size,
        envelope_rounds=envelope_rounds,
    )
    build_aside(out, lambda staged: gather(planned, frames, backend, model, staged / 'evidence', log=log))
    evidence = load_evidence(out / 'evidence')
    verdicts = judge(criteria, evidence)
    manifest = f'gathered by this verification; {MANIFEST} written with the verdict'
    modes = None if explain is None else explain(verdicts)
    written = write_report(out, criteria, evidence, verdicts, manifest=manifest, junit=junit, modes=modes)
    written.append(write_manifest(out))
    return Verification(criteria, verdicts, written, modes)


def compare_results(
    base: Path, candidate: Path, out: Path, *, threshold: float | None = None, junit: Path | None = None
) -> Comparison:
    """Compare two models' evidence (each checked against its SHA256SUMS where it has one) into `out`."""
    for given in (base, candidate):
        _outside(out, given)
    checked = {str(d): checked_evidence(d) for d in (base, candidate)}
    ours, theirs = load_evidence(base), load_evidence(candidate)
    changes, notes = compare(ours, theirs, threshold=threshold)
    configs = {
        'base': {'root': str(base), 'models': ours.models, 'manifest': checked[str(base)].message},
        'candidate': {
            'root': str(candidate),
            'models': theirs.models,
            'manifest': checked[str(candidate)].message,
        },
        'runs': {
            side: {run.label(evidence.root): run.identity for run in evidence.runs}
            for side, evidence in (('base', ours), ('candidate', theirs))
        },
        'frames': ours.frames,
    }
    written = write_compare_report(out, base, candidate, changes, notes, configs, junit=junit)
    return Comparison(changes, notes, written, [d for d, check in checked.items() if not check.manifest])
