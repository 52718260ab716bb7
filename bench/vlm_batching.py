"""Benchmark: the `vlm` backend batched against one frame at a time, and the search's time outside it.

Run from the repository root:

    python bench/vlm_batching.py                       # 8 frames, 3 interleaved repetitions
    python bench/vlm_batching.py --frames 16 --repeats 5 --splitting on

Model: a random-initialised model of SmolVLM-256M-Instruct's shape (Idefics3: SigLIP-B/16 at 512 px
tiles, a SmolLM2-135M-shaped decoder; models/tiny_families.py build_base_vlm), built offline (timing
does not depend on the weights). Frames: synthetic underwater scenes at the demo's size (384x216).
By default the processor does not split frames into tiles (`--splitting off`: one 512-pixel view,
64 image tokens), as a CPU-bound robot would run SmolVLM; `--splitting on` is the released
processor (frames resized to 2048 px and cut into 512-pixel tiles: about 13 tiles a frame).

Variants, interleaved: the count kind (greedy answers, --max-new-tokens) and the confidence kind
(P(yes) of four yes/no questions after one cached prefill of each frame's image), each batched (all
frames in one call) and one frame per call; and the confidence kind as it ran before the cached
prefix (all frames batched, one whole prefill per (frame, class): the image encoded four times).
Printed: images/s (min / median / max) and the batched/single ratio. Checks (exit 1 on failure):
batched count answers equal one-at-a-time ones; confidences within --tolerance, and the cached-prefix
confidences within --tolerance of the whole prefills.

Then one `run_search` (Rand, --evaluations) with the batched count backend: the seconds inside the
model (ChatModel.generate) against the search's wall time, and the share outside the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Checks, fmt, interleaved, spread  # noqa: E402

from metavlm_ros.footage.scenes import SceneGenerator
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.models.tiny import build_base_model
from metavlm_ros.models.vlm import create_backend

DEMO_SIZE = (384, 216)
PER_CLASS = 'confidence, a prefill per class'


def frames_of(count: int, seed: int = 0) -> list[np.ndarray]:
    generator = SceneGenerator(*DEMO_SIZE, 5.0, seed=seed, frames=count, environment='shallow')
    return [generator.frame(i)[0] for i in range(count)]


def set_splitting(directory: Path, on: bool) -> None:
    path = directory / 'processor_config.json'
    config = json.loads(path.read_text())
    config.setdefault('image_processor', {})['do_image_splitting'] = on
    path.write_text(json.dumps(config, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--frames', type=int, default=8)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--max-new-tokens', type=int, default=40)
    parser.add_argument('--splitting', choices=('on', 'off'), default='off')
    parser.add_argument('--evaluations', type=int, default=16, help='budget of the timed search')
    parser.add_argument('--tolerance', type=float, default=1e-3)
    args = parser.parse_args()
    checks = Checks()
    with tempfile.TemporaryDirectory() as tmp:
        directory = build_base_model('vlm', Path(tmp) / 'smolvlm-256m')
        set_splitting(directory, args.splitting == 'on')
        frames = frames_of(args.frames)
        options = {'device': 'cpu', 'max_new_tokens': args.max_new_tokens}
        count = {
            'count, batched': create_backend('vlm', str(directory), batch_size=args.frames, **options),
            'count, one at a time': create_backend('vlm', str(directory), batch_size=1, **options),
        }
        confidence = {
            'confidence, batched': create_backend(
                'vlm', str(directory), kind='confidence', batch_size=args.frames, device='cpu'
            ),
            'confidence, one at a time': create_backend(
                'vlm', str(directory), kind='confidence', batch_size=1, device='cpu'
            ),
        }
        backends = {**count, **confidence}
        answers: dict[str, list] = {}
        batched_confidence = confidence['confidence, batched']
        per_class: dict[str, np.ndarray] = {}

        def judge(name: str):
            def run() -> None:
                answers[name] = backends[name].predict(frames)

            return run

        def one_prefill_per_class() -> None:
            # The way before the cached image prefix: every (frame, class) prefilled whole, the
            # image encoded once per class (a single question never shares a prefix).
            questions = batched_confidence.asked.questions
            columns = [batched_confidence.chat.yes_probability(frames, [q])[:, 0] for q in questions]
            per_class['values'] = np.stack(columns, axis=1)

        print(
            f'SmolVLM-256M-shaped model, {args.frames} frames {DEMO_SIZE[0]}x{DEMO_SIZE[1]}, '
            f'splitting {args.splitting}, input side {count["count, batched"].input_size} px, '
            f'{args.repeats} repetitions'
        )
        variants = {name: judge(name) for name in backends}
        variants[PER_CLASS] = one_prefill_per_class
        samples = interleaved(variants, args.repeats)
        rates = {name: [args.frames / s for s in values] for name, values in samples.items()}
        for name, values in rates.items():
            print(f'  {name:28s} images/s {fmt(values, digits=2)}')
        for kind in ('count', 'confidence'):
            batched = spread(rates[f'{kind}, batched'])[1]
            single = spread(rates[f'{kind}, one at a time'])[1]
            print(f'  {kind}: batched / one at a time (medians) = {batched / single:.2f}x (target >= 3x)')
        shared = spread(rates['confidence, batched'])[1] / spread(rates[PER_CLASS])[1]
        print(f'  confidence: image prefix cached / {PER_CLASS} (medians) = {shared:.2f}x')
        texts = [[p.text for p in answers[name]] for name in count]
        checks.check(texts[0] == texts[1], 'batched count answers equal one-at-a-time ones')
        values = [np.array([list(p.values.values()) for p in answers[name]]) for name in confidence]
        difference = float(np.abs(values[0] - values[1]).max())
        checks.check(difference <= args.tolerance, f'confidences within {args.tolerance} ({difference:.2e})')
        difference = float(np.abs(values[0] - per_class['values']).max())
        checks.check(
            difference <= args.tolerance,
            f'cached-prefix confidences within {args.tolerance} of whole prefills ({difference:.2e})',
        )

        backend = count['count, batched']
        inside = [0.0]
        generate = backend.chat.generate

        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return generate(*a, **k)
            finally:
                inside[0] += time.perf_counter() - start

        backend.chat.generate = timed
        config = SearchConfig(
            algorithm='random', population=min(args.frames, args.evaluations), evaluations=args.evaluations
        )
        start = time.perf_counter()
        result = run_search(frames[0], backend, config)
        wall = time.perf_counter() - start
        outside = wall - inside[0]
        print(
            f'  metavlm search (Rand, {len(result.evaluations)} evaluations, {result.model_calls} model '
            f'calls): {wall:.1f} s, {inside[0]:.1f} s in the model, {outside:.2f} s outside '
            f'({100 * outside / wall:.1f} %, target < 10 %)'
        )
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
