"""Benchmark: peak resident memory of `metavlm search` on one 4K frame, at the defaults and at full size.

Run from the repository root: ``python bench/memory.py [--model base] [--evaluations 60]``.

Each setting runs `metavlm search` in a fresh process (so one run's memory cannot hide another's)
with a CLIP of the released ViT-B/32 shape (random weights, built offline; `--model tiny` for the
test suite's) on a 3840x2160 synthetic frame; the process reports its peak resident set size
(VmHWM). Settings alternate over --repeats repetitions; min / median / max are printed. Target: at
the defaults, below 1.5 GiB. Exits 1 if a search fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, rotations  # noqa: E402
from transforms import synthetic_frame  # noqa: E402

CHILD = """
import json, sys
import torch
torch.set_num_threads(int(sys.argv[1]))
from metavlm_ros.cli import main
code = main(sys.argv[2:])
with open('/proc/self/status') as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith('VmHWM:'))
print(json.dumps({'code': code, 'peak_kib': peak}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', choices=('base', 'tiny'), default='base')
    parser.add_argument('--evaluations', type=int, default=60)
    parser.add_argument('--population', type=int, default=30)
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--size', default='3840x2160')
    parser.add_argument('--threads', type=int, default=2)
    args = parser.parse_args(argv)
    from metavlm_ros.models.tiny import build_base_model, build_tiny_model

    width, height = (int(v) for v in args.size.split('x'))
    settings = {
        'defaults (auto working size)': [],
        'full size (--working-size full)': ['--working-size', 'full'],
    }
    peaks: dict[str, list[float]] = {name: [] for name in settings}
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as tmp:
        tmp = Path(tmp)
        model = (build_base_model if args.model == 'base' else build_tiny_model)('clip', tmp / 'clip', seed=0)
        image = tmp / 'frame.png'
        cv2.imwrite(str(image), synthetic_frame(width, height)[..., ::-1])
        for r, order in enumerate(rotations(list(settings), args.repeats)):
            for name in order:
                command = [
                    *('search', str(image), '--model', str(model), '--device', 'cpu', '--quiet'),
                    *('--evaluations', str(args.evaluations), '--population', str(args.population)),
                    *('--out', str(tmp / f'out{r}-{len(peaks[name])}-{name[:4]}'), *settings[name]),
                ]
                done = subprocess.run(
                    [sys.executable, '-c', CHILD, str(args.threads), *command],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                report = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
                if not checks.check(report.get('code') == 0, f'{name}: search {r} finished'):
                    print(done.stderr[-2000:])
                    continue
                peaks[name].append(report['peak_kib'] / 1024.0)
    print(
        f'{args.model} CLIP, {width}x{height} frame, {args.evaluations} evaluations, '
        f'population {args.population}'
    )
    for name, values in peaks.items():
        if values:
            print(f'  {name:<34} peak RSS MiB (min / median / max): {fmt(values, digits=0)}')
    return checks.exit_code()


if __name__ == '__main__':
    raise SystemExit(main())
