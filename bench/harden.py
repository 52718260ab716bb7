"""Benchmark: `metavlm harden` on the demo CLIP, its update demo-clip-v2, the demo BLIP and the demo
detector, on fresh scenes.

Usage: python bench/harden.py [--train-seeds 21 22 23 24] [--frames 12] [--heldout-seeds 31 32]
                              [--heldout-frames 4] [--steps 150] [--evidence-every 4]
                              [--models demo demo-clip-v2 demo-blip demo-detector] [--out DIR]

For each model: writes the training scenes (PNG folders with ground truth, one a seed) and held-out
scenes of other seeds, runs `metavlm verify` with the example criteria on every --evidence-every'th
training frame (what breaks the model), then `metavlm harden` on the training frames with that
evidence, the example criteria and its gate on the held-out frames, and prints issue 49's figures
side by side, base against hardened, from the model card and the gate's verdicts: the violation rate
of each rate claim's region (target: at least halved), each envelope direction's median boundary
(target: wider), the items of `metavlm compare` (target: none regressed), clean accuracy on the
held-out frames (presence AUC, or detection F1 at IoU 0.5 for the detector; target: within 0.01),
each criterion's status before and after, and the wall time (target: within 10 minutes on 2 CPU
cores, evidence gathering included). Nothing is asserted: the
figures are printed for the reader (and docs/harden.md quotes them with this command).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from metavlm_ros.cli import main

ROOT = Path(__file__).resolve().parents[1]
CRITERIA = ROOT / 'config' / 'criteria' / 'aur_camera.yaml'
#: name -> (backend, model)
MODELS = {
    'demo': ('clip', 'demo'),
    'demo-clip-v2': ('clip', str(ROOT / 'metavlm_ros' / 'models' / 'demo-clip-v2')),
    'demo-blip': ('blip', 'demo'),
    'demo-detector': ('detector', 'demo'),
}


def scenes(out: Path, seeds: list[int], frames: int) -> list[str]:
    """One PNG folder with ground truth per seed, 480x270 (the demo's frames are searched at this size)."""
    folders = []
    for seed in seeds:
        folder = out / f'scenes-{seed}'
        if not folder.exists():
            args = ['scenes', '--out', str(folder), '--format', 'png', '--frames', str(frames)]
            assert main([*args, '--size', '480x270', '--seed', str(seed)]) == 0
        folders.append(str(folder))
    return folders


def figures(model_dir: Path) -> dict:
    """Issue 49's figures from a hardened model's card and its gate's files."""
    card = json.loads((model_dir / 'harden.json').read_text())
    compared = json.loads((model_dir / 'gate' / 'compare' / 'compare.json').read_text())
    verdicts = {
        side: json.loads((model_dir / 'gate' / f'verify-{side}' / 'verdict.json').read_text())
        for side in ('base', 'hardened')
    }
    rates, envelopes = {}, {}
    for change in compared['changes']:
        f = change['figures']
        if change['kind'] == 'rate':
            rates[change['item']] = (
                f['base_violations'] / f['samples'],
                f['candidate_violations'] / f['samples'],
            )
        elif change['kind'] == 'envelope':
            envelopes[change['item']] = (f['base_median'], f['candidate_median'])
    return {
        'card': card,
        'compared': compared,
        'verdicts': verdicts,
        'rates': rates,
        'envelopes': envelopes,
        'accuracy': card['gate']['accuracy'],
        'measure': card['gate']['accuracy_measure'],
    }


def report(name: str, seconds: float, got: dict) -> None:
    card = got['card']
    print(f'\n== {name}: {card["training"]["method"]} tuning, blend alpha {card["training"]["alpha"]:g}, '
          f'{seconds / 60:.1f} min in all (target <= 10)')  # fmt: skip
    for alpha, f in card['validation'].items():
        print(f'  validation, blend {alpha:>4}: violation rate {f["violation_rate"]:.3f}, '
              f'{f["accuracy_measure"]} {f["accuracy"]}')  # fmt: skip
    for item, (before, after) in got['rates'].items():
        halved = 'n/a (none before)' if before == 0 else ('yes' if after <= before / 2 else 'NO')
        print(f'  {item}: {before:.1%} -> {after:.1%}  (halved: {halved})')
    for item, (before, after) in got['envelopes'].items():
        print(f'  {item} median: {before:.3g} -> {after:.3g}  (wider: {"yes" if after >= before else "NO"})')
    accuracy = got['accuracy']
    if accuracy['base'] is not None and accuracy['hardened'] is not None:
        kept = accuracy['hardened'] >= accuracy['base'] - 0.01
        print(f'  {got["measure"]}, held-out: {accuracy["base"]:.3f} -> {accuracy["hardened"]:.3f} '
              f'(within 0.01: {"yes" if kept else "NO"})')  # fmt: skip
    else:
        print(f'  {got["measure"]}, held-out: not measured (too few frames with and without each class)')
    regressed = [c['item'] for c in got['compared']['changes'] if c['verdict'] == 'regressed']
    print(f'  compare: {got["compared"]["outcome"]}; regressed: {", ".join(regressed) or "none"}')
    base = {v['criterion']: v for v in got['verdicts']['base']['verdicts']}
    for v in got['verdicts']['hardened']['verdicts']:
        before = base[v['criterion']]['status']
        print(f'  {v["criterion"]:14} {before:12} -> {v["status"]:12} {v["reason"][:80]}')
    print(f'  verdict: {got["verdicts"]["base"]["overall"]} -> {got["verdicts"]["hardened"]["overall"]}')


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--train-seeds', type=int, nargs='+', default=[21, 22, 23, 24])
    parser.add_argument('--frames', type=int, default=12)
    parser.add_argument('--heldout-seeds', type=int, nargs='+', default=[31, 32])
    parser.add_argument('--heldout-frames', type=int, default=4)
    parser.add_argument('--steps', type=int, default=150)
    parser.add_argument(
        '--evidence-every', type=int, default=4, help='verify every Nth training frame for the evidence'
    )
    parser.add_argument('--models', nargs='+', default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        '--out', type=Path, default=None, help='keep everything here (default: a temporary one)'
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        train = scenes(out, args.train_seeds, args.frames)
        held = scenes(out, args.heldout_seeds, args.heldout_frames)
        print(
            f'training: {len(train)} scene(s) x {args.frames} frames; '
            f'held out: {len(held)} x {args.heldout_frames}'
        )
        for name in args.models:
            target = out / f'hardened-{name}'
            start = time.perf_counter()
            # The loop as the docs give it: verify finds what breaks the model (on some training
            # frames), harden trains on that evidence and the criteria's regions, then gates.
            evidence = out / f'verify-{name}'
            backend, model = MODELS[name]
            chosen = ['--backend', backend, '--model', model]
            verify = ['verify', *train, '--criteria', str(CRITERIA), *chosen]
            budget = ['--evaluations', '300', '--population', '20', '--envelope-rounds', '2']  # the demo's
            main([*verify, *budget, '--every', str(args.evidence_every), '--out', str(evidence)])
            code = main(
                ['harden', *train, '--heldout', *held, *chosen, '--out', str(target),
                 '--results', str(evidence / 'evidence'), '--steps', str(args.steps)]
            )  # fmt: skip
            report(name, time.perf_counter() - start, figures(target))
            print(f'  exit status {code}')


if __name__ == '__main__':
    run()
