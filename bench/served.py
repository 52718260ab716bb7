"""Benchmark: a VLM judged through `transformers serve` (1, 4, 16 requests in flight) vs in process.

Usage: python bench/served.py [--frames 16] [--repeats 5] [--sizes 768 64] [--max-new-tokens 40]
Builds the tiny random-weight LLaVA (models/tiny_families.py), serves it with `transformers serve` on
127.0.0.1 (the transformers[serving] extra, requirements-dev.txt), and judges the same frames with
the `openai` backend at 1, 4 and 16 requests in flight (answer cache off) and with the in-process
`vlm` backend, interleaved. Sizes are the frames' longer side: 64 is the working size a search
gives the tiny model (2 x its 32 px input side, told to the served backend as `input_side`), 768
the one it gives a served model whose input side is not given (2 x 384).
Where the time goes, per request: PNG encoding and the base64 JSON body (the client's own cost),
an HTTP round trip that does no model work (GET /v1/models), and a whole chat request one at a time.
Checks: served and in-process answers agree; at the model's working size the client's own cost is
< 10% of a round trip (at other sizes the share is printed with the round trip it is 10% of).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'bench'))
sys.path.insert(0, str(ROOT))
from timing import Checks, fmt, interleaved  # noqa: E402

from metavlm_ros.common.codec import encode_png  # noqa: E402
from metavlm_ros.common.images import resize_longer_side, working_size_for  # noqa: E402
from metavlm_ros.footage.scenes import SceneGenerator  # noqa: E402
from metavlm_ros.models.vlm import create_backend  # noqa: E402

# The one way the tests start the server: the same flags, port choice and shutdown.
from test.models.served_server import transformers_serve  # noqa: E402

IN_FLIGHT = (1, 4, 16)


def _client_cost(backend, frame, repeats: int) -> tuple[float, float]:
    """Seconds per request of (PNG encode + base64, the whole JSON body as the client sends it)."""
    started = time.perf_counter()
    for _ in range(repeats):
        base64.b64encode(encode_png(frame))
    encode = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        json.dumps(backend._request_body(frame, backend.asked.question, confidence=False)).encode()
    return encode, (time.perf_counter() - started) / repeats


def _http_floor(backend, repeats: int) -> float:
    """Seconds of an HTTP round trip that does no model work (GET /v1/models through the same client)."""
    started = time.perf_counter()
    for _ in range(repeats):
        backend.client.models.with_raw_response.list()
    return (time.perf_counter() - started) / repeats


def bench_size(side: int, args: argparse.Namespace, endpoint: str, model: str, checks: Checks) -> None:
    generator = SceneGenerator(1280, 960, 10.0, seed=5, frames=args.frames)
    frames = [resize_longer_side(generator.frame(i)[0], side) for i in range(args.frames)]
    tokens = {'max_new_tokens': args.max_new_tokens}
    local = create_backend('vlm', model, device='cpu', **tokens)
    served = {
        n: create_backend(
            'openai',
            model,
            endpoint=endpoint,
            max_in_flight=n,
            cache_size=0,
            input_side=local.input_size,
            **tokens,
        )
        for n in IN_FLIGHT
    }
    try:
        expected = local.predict(frames)
        checks.check(
            all(served[n].predict(frames) == expected for n in IN_FLIGHT),
            f'{side} px: served answers equal the in-process ones at 1, 4 and 16 in flight',
        )
        variants = {'in process (vlm)': lambda: local.predict(frames)}
        variants.update(
            {f'served, {n} in flight': (lambda b=served[n]: b.predict(frames)) for n in IN_FLIGHT}
        )
        samples = interleaved(variants, args.repeats)
        print(f'{side} px frames ({frames[0].shape[1]}x{frames[0].shape[0]}), {args.frames} per call:')
        for name, seconds in samples.items():
            rates = [args.frames / s for s in seconds]
            print(f'  {name:24s} evaluations/s min / median / max: {fmt(rates)}')
        one = served[1]
        round_trip = one.stats.request_s / one.stats.requests  # every request of in-flight 1, all repeats
        encode, body = _client_cost(one, frames[0], 20)
        floor = _http_floor(one, 20)
        print(
            f'  per request (1 in flight): round trip {round_trip * 1e3:.1f} ms = HTTP without model work '
            f'{floor * 1e3:.1f} ms + server (decode, model) {(round_trip - floor) * 1e3:.1f} ms; '
            f'client: PNG + base64 {encode * 1e3:.2f} ms, whole JSON body {body * 1e3:.2f} ms'
        )
        share = body / round_trip
        what = f'{side} px: the client cost {body * 1e3:.2f} ms is {100 * share:.1f}% of a round trip'
        working = working_size_for('auto', 1280, 960, one.input_size)
        if side == working:
            checks.check(share < 0.1, f'{what} (< 10% at the working size {working} px)')
        else:
            print(
                f'  note: {what}; 10% of any round trip over {body * 1e4:.0f} ms (not the working size here)'
            )
    finally:
        for backend in served.values():
            backend.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--frames', type=int, default=16)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--sizes', type=int, nargs='+', default=[768, 64], metavar='PX')
    parser.add_argument('--max-new-tokens', type=int, default=40)
    args = parser.parse_args()
    checks = Checks()
    from metavlm_ros.models.tiny_families import build_tiny_vlm

    with tempfile.TemporaryDirectory(prefix='metavlm-bench-') as root:
        model_dir = Path(root) / 'llava'
        build_tiny_vlm('llava', model_dir)
        with transformers_serve(model_dir, Path(root) / 'serve.log') as (endpoint, model):
            print(f'transformers serve of the tiny LLaVA at {endpoint}')
            for side in args.sizes:
                bench_size(side, args, endpoint, model, checks)
    return checks.exit_code()


if __name__ == '__main__':
    sys.exit(main())
