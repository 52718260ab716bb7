"""A hardened model on disk: the base's form (safetensors, config, processor) and its model card
(harden.json, and README.md for people), naming everything it came from by sha256."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from metavlm_ros import __version__
from metavlm_ros.common.directories import write_file_atomic
from metavlm_ros.common.document import Bullets, Code, Document, Paragraph, Section, Table, write_document
from metavlm_ros.models.model_files import weights_hash

__all__ = ['CARD', 'card_record', 'save_model', 'write_card']

CARD = 'harden.json'

#: Files of the base model's directory that describe the base, not the hardened model: its weights
#: and its own card.
_NOT_COPIED = (
    '*.safetensors',
    '*.safetensors.index.json',
    '*.bin',
    '*.pt',
    'README.md',
    'training.json',
    CARD,
)


def save_model(backend: Any, out: Path) -> str:
    """Save the model `backend` holds into `out` as its base was saved: the base directory's processor,
    tokenizer and other files as they are, then the weights (safetensors) and config; return the
    weights' sha256 as identity records hold it."""
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(Path(backend.model_path).iterdir()):
        if path.is_file() and not any(path.match(pattern) for pattern in _NOT_COPIED):
            shutil.copyfile(path, out / path.name)  # follows the links of a Hugging Face cache snapshot
    from transformers.utils import logging

    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # 'Writing model shards' is noise beside the command's own bar
    try:
        backend.model.save_pretrained(out, safe_serialization=True)
    finally:
        if bars:
            logging.enable_progress_bar()
    return weights_hash(str(out), length=64)


def card_record(**parts: Any) -> dict:
    """The card's record: the tool's version first, then `parts` as given (base, model, frames,
    evidence, plan, settings, training, validation, gate)."""
    return {'format': 2, 'metavlm_version': __version__, **parts}


def _figure_rows(figures: dict[str, dict]) -> list[list]:
    return [
        [name, f['violation_rate'], f['clean_drift'], f['accuracy'] if f['accuracy'] is not None else '']
        for name, f in figures.items()
    ]


def _document(record: dict) -> Document:
    base, model = record['base'], record['model']
    training = record['training']
    measure = next(iter(record['validation'].values()))['accuracy_measure']
    blocks: list = [
        Paragraph(
            f'A {base["backend"]} model hardened by metavlm_ros {record["metavlm_version"]} from ',
            Code(str(base['model'])),
            f' (weights sha256 {base["weights_sha256"][:16]}...): {training["method"]} fine-tuning for '
            f'{training["steps"]} steps on {len(record["frames"]["train"])} frames, blended with the base '
            f'at alpha {training["alpha"]:g} (WiSE-FT). Weights sha256 {model["weights_sha256"][:16]}...; '
            'every figure below is in harden.json (docs/harden.md).',
        ),
        Section(
            'Validation: each blend of base and fine-tuned weights',
            [
                Paragraph(
                    f'{len(record["frames"]["validation"])} frames never trained on, '
                    f'{record["settings"]["validation_followups"]} planned follow-ups each; violation at '
                    f'{record["settings"]["threshold"]:g}; clean drift: clean answers moved from the base '
                    f"model's as the oracle judges a change; {measure} against the ground truth (empty: "
                    'none, or too few frames for it).'
                ),
                Table(
                    columns=['blend alpha', 'violation rate', 'clean drift', measure],
                    rows=_figure_rows(record['validation']),
                    formats=['', '.3f', '.3f', '.3f'],
                ),
            ],
        ),
    ]
    gate = record.get('gate')
    if gate:
        blocks.append(
            Section(
                "The gate: the tool's verdict and comparison on held-out frames",
                [
                    Paragraph(gate['summary']),
                    Table(
                        columns=['criterion', 'base', 'hardened'],
                        rows=[[c['criterion'], c['base'], c['hardened']] for c in gate['criteria']],
                    ),
                    Table(
                        columns=['item', 'change', 'verdict'],
                        rows=[[c['item'], c['effect_text'], c['verdict']] for c in gate['changes']],
                    ),
                ],
            )
        )
    plan = record['plan']
    sources = [f'region {r["label"]}: {", ".join(r["relations"])}' for r in plan['regions']]
    sources.append(f'{len(plan["broken"])} changes that broke the base model in the evidence')
    blocks.append(Section('What it was trained on', [Bullets(sources)]))
    return Document(f'Hardened model: {record["model"]["name"]}', blocks)


def write_card(out: Path, record: dict) -> list[Path]:
    """Write harden.json and README.md into `out` (atomically; a second call rewrites both)."""
    path = out / CARD
    write_file_atomic(path, (json.dumps(record, indent=1, sort_keys=True) + '\n').encode('utf-8'))
    return [path, write_document(_document(record), out / 'README.md')]
