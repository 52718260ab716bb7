"""Benchmark check: `metavlm demo` gives the same verdict.json and compare.json at two commits.

Usage: python bench/same_verdicts.py --base REV [--frames 6] [--evaluations 300]
                                       [--base-out DIR] [--head-out DIR]

Runs `metavlm demo` (its defaults unless told) from a detached worktree of REV and from this working
tree, one after the other, each into a temporary directory, then compares every verdict.json and
compare.json the two wrote, by path under the demo's output, with the output directory's and the
tree's own paths taken out (the only things that must differ). `--base-out` reuses a demo REV wrote
earlier (its output directory) instead of running it again, `--head-out` one of the working tree. A
refactoring that must not change what the assurance workflow decides (issue 50) is checked this
way. Prints each file as equal or its first differences; exits 1 when any differs or is missing on
one side. Set ROS_DOMAIN_ID and
ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST to keep the demo's ROS traffic off other graphs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = ('verdict.json', 'compare.json')


def run_demo(tree: Path, out: Path, frames: int, evaluations: int) -> float:
    """`metavlm demo` with the package of `tree`; seconds it took."""
    env = {
        **os.environ,
        'PYTHONPATH': os.pathsep.join(filter(None, [str(tree), os.environ.get('PYTHONPATH')])),
    }
    command = [sys.executable, '-m', 'metavlm_ros.cli', 'demo', '--out', str(out)]
    command += ['--frames', str(frames), '--evaluations', str(evaluations)]
    start = time.perf_counter()
    subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


#: The demo models and the example criteria live in the tree that ran the demo: their paths name it.
_TREE = re.compile(r'"/[^"]*?/(metavlm_ros/models|config/criteria)/')


def documents(out: Path) -> dict[str, str]:
    """Every verdict.json and compare.json under `out`, by relative path, as sorted-key JSON text with
    `out`'s own path replaced by OUT, and the tree's by TREE."""
    found = {}
    for name in NAMES:
        for path in sorted(out.rglob(name)):
            text = path.read_text(encoding='utf-8')
            text = _TREE.sub(r'"TREE/\1/', text.replace(str(out.resolve()), 'OUT').replace(str(out), 'OUT'))
            found[str(path.relative_to(out))] = json.dumps(json.loads(text), indent=1, sort_keys=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--base', required=True, help='the commit to compare with (a git revision)')
    parser.add_argument('--frames', type=int, default=6)
    parser.add_argument('--evaluations', type=int, default=300)
    parser.add_argument('--base-out', type=Path, help="an earlier demo's output at --base, reused")
    parser.add_argument('--head-out', type=Path, help="an earlier demo's output of the working tree, reused")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix='same-verdicts-') as scratch:
        scratch = Path(scratch)
        base_out = args.base_out
        if base_out is None:
            tree = scratch / 'base'
            subprocess.run(['git', 'worktree', 'add', '--detach', str(tree), args.base], cwd=ROOT, check=True)
            try:
                base_out = scratch / 'base-out'
                print(f'demo at {args.base}: {run_demo(tree, base_out, args.frames, args.evaluations):.0f} s')
            finally:
                subprocess.run(['git', 'worktree', 'remove', '--force', str(tree)], cwd=ROOT, check=True)
        head_out = args.head_out
        if head_out is None:
            head_out = scratch / 'head-out'
            print(
                f'demo in the working tree: {run_demo(ROOT, head_out, args.frames, args.evaluations):.0f} s'
            )
        ours, theirs = documents(base_out), documents(head_out)
        different = 0
        for name in sorted(set(ours) | set(theirs)):
            if name not in ours or name not in theirs:
                print(f'{name}: only in {"the base" if name in ours else "the working tree"}')
                different += 1
            elif ours[name] == theirs[name]:
                print(f'{name}: equal ({len(ours[name])} characters)')
            else:
                different += 1
                diff = difflib.unified_diff(
                    ours[name].splitlines(), theirs[name].splitlines(), 'base', 'head', n=1
                )
                print(f'{name}: DIFFERENT\n' + '\n'.join(list(diff)[:40]))
        print(f'{len(set(ours) | set(theirs)) - different} of {len(set(ours) | set(theirs))} files equal')
        return 1 if different or not ours else 0


if __name__ == '__main__':
    sys.exit(main())
