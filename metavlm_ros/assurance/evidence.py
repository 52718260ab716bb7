"""Evidence: the results directories under one root, read as they are, and the boundary brackets they give."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from metavlm_ros.common.errors import InputError
from metavlm_ros.common.record_format import iter_jsonl
from metavlm_ros.common.results import EVALUATIONS, SUMMARY, read_identity, records_file
from metavlm_ros.method.encoding import SearchSpace
from metavlm_ros.method.envelope import Bracket, boundaries

__all__ = ['Evidence', 'FrameBrackets', 'Run', 'load_evidence', 'merged_boundaries', 'settings_space']


def settings_space(settings: dict) -> SearchSpace:
    """The search space a results directory's settings record (the paper's when they record none)."""
    stored = settings.get('relations')
    return SearchSpace.from_record(stored) if stored else SearchSpace.default()


@dataclass
class Run:
    """One results directory: its identity (None for a directory without search.json) and records."""

    directory: Path
    identity: dict | None
    records: list[dict]
    summaries: list[dict] = field(default_factory=list)

    @property
    def settings(self) -> dict:
        return (self.identity or {}).get('settings') or {}

    @property
    def space(self) -> SearchSpace:
        return settings_space(self.settings)

    def label(self, root: Path) -> str:
        return str(self.directory.relative_to(root)) if self.directory != root else '.'


@dataclass
class Evidence:
    """Every results directory under a root, with what they were judged by."""

    root: Path
    runs: list[Run] = field(default_factory=list)

    @property
    def kind(self) -> str:
        kinds = {r['kind'] for run in self.runs for r in run.records if r.get('kind')}
        if len(kinds) > 1:
            raise InputError(f'{self.root}: records of count and confidence models together; judge one model')
        return kinds.pop() if kinds else 'confidence'

    @property
    def models(self) -> list[str]:
        return sorted({str(r.get('model')) for run in self.runs for r in run.records if r.get('model')})

    @property
    def classes(self) -> list[str]:
        """The classes the records answer about, in the order the model gives them."""
        found: dict[str, None] = {}
        for run in self.runs:
            for record in run.records[:1]:
                found.update(dict.fromkeys(record.get('source') or {}))
        return list(found)

    @property
    def keys(self) -> list[str]:
        """The violation criteria the records hold ('0.01', ..., or 'count')."""
        return sorted({k for run in self.runs for r in run.records[:1] for k in (r.get('violation') or {})})

    @property
    def frames(self) -> list[str]:
        return sorted({r['image'] for run in self.runs for r in run.records})

    def evaluations(self) -> Iterator[tuple[Run, dict]]:
        for run in self.runs:
            for record in run.records:
                yield run, record


def _results_dirs(root: Path) -> Iterator[Path]:
    if records_file(root / EVALUATIONS).is_file():
        yield root
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith('.')):
        yield from _results_dirs(child)


def load_evidence(root: str | Path) -> Evidence:
    """Read every results directory under `root` (a search, a verify run, a campaign, ...), strictly.

    Raises:
        InputError: `root` holds no results directory.
        ResultsError: A record file is damaged before its end, or an identity record is.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f'{root}: no such results directory')
    runs = [
        Run(
            directory,
            read_identity(directory),
            list(iter_jsonl(directory / EVALUATIONS, strict=True)),
            list(iter_jsonl(directory / SUMMARY, strict=True)),
        )
        for directory in _results_dirs(root)
    ]
    if not runs:
        raise InputError(f'{root}: no results directory (no evaluations.jsonl.gz) here or below')
    return Evidence(root, runs)


class FrameBrackets:
    """Each (frame, direction)'s boundary bracket, from batches of records (a directory's, a search's)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], list[Bracket]] = {}

    def add(self, records: list[dict], key: str, space: SearchSpace, cls: str | None = None) -> None:
        """Take a batch's brackets at violation criterion `key` (of class `cls`'s answer alone, if given)."""
        for b in boundaries(records, key, space, cls):
            self._seen.setdefault((b.image, b.direction), []).append(b)

    def merged(self) -> dict[tuple[str, str], Bracket]:
        """(frame, direction) -> the bracket all batches give together (`Bracket.merge`)."""
        return {where: Bracket.merge(brackets) for where, brackets in self._seen.items()}


def merged_boundaries(evidence: Evidence, key: str, cls: str | None = None) -> dict[tuple[str, str], Bracket]:
    """(frame, direction) -> the bracket all the evidence gives together (several searches may have
    tried a frame's direction); with `cls`, of that class's answer alone."""
    brackets = FrameBrackets()
    for run in evidence.runs:
        brackets.add(run.records, key, run.space, cls)
    return brackets.merged()
