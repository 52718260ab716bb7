"""`metavlm train-demo-models`: train the embedded demo models on synthetic scenes, reproducibly."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from metavlm_ros.common.errors import ParameterError

DEFAULT_OUT = Path(__file__).resolve().parent.parent / 'models'
#: The demo models the command trains, in the order it trains them (the detector starts from the CLIP).
MODELS = ('clip', 'blip', 'detector')


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `train-demo-models` subcommand."""
    from metavlm_ros.demo.config import TrainingConfig

    defaults = TrainingConfig()
    parser = subparsers.add_parser(
        'train-demo-models',
        help='train the embedded demo CLIP, BLIP and detector on synthetic underwater scenes',
        description=(
            'Render synthetic underwater scenes with ground-truth captions and boxes, train a small CLIP '
            '(contrastive), a small BLIP (Table 1 answers) and, with --models detector, a small OWL-ViT '
            'detector started from the demo CLIP; save them as transformers models (demo-clip/, '
            'demo-blip/, demo-detector/) and print loss curves and held-out metrics.'
        ),
    )
    parser.add_argument(
        '--out',
        type=Path,
        default=DEFAULT_OUT,
        help='directory for demo-clip/, demo-blip/ and demo-detector/ (default: the package)',
    )
    parser.add_argument(
        '--seed', type=int, default=defaults.seed, help='seed of data, weights and batch order'
    )
    parser.add_argument(
        '--models',
        default='clip,blip',
        help=f'comma-separated subset of {",".join(MODELS)}, trained in that order (default: clip,blip)',
    )
    parser.add_argument('--train-frames', type=int, default=defaults.train_frames, help='training frames')
    parser.add_argument(
        '--frames-per-scene',
        type=int,
        default=defaults.frames_per_scene,
        help='training frames taken from each scene (fewer: more distinct scenes)',
    )
    parser.add_argument('--heldout-frames', type=int, default=defaults.heldout_frames, help='held-out frames')
    parser.add_argument('--clip-steps', type=int, default=defaults.clip_steps, help='CLIP optimiser steps')
    parser.add_argument('--blip-steps', type=int, default=defaults.blip_steps, help='BLIP optimiser steps')
    parser.add_argument('--batch-size', type=int, default=defaults.batch_size, help='frames per step')
    parser.add_argument('--threads', type=int, default=defaults.threads, help='torch CPU threads')
    parser.add_argument(
        '--blip-vision-from',
        type=Path,
        default=None,
        metavar='CLIP_DIR',
        help=(
            'start the BLIP vision tower from this trained demo CLIP '
            '(default: the CLIP trained in the same run, else random initialisation)'
        ),
    )
    parser.add_argument(
        '--blip-vision-lr-scale',
        type=float,
        default=defaults.blip_vision_lr_scale,
        help='learning-rate factor of a BLIP vision tower started from a CLIP (default 1/3)',
    )
    parser.add_argument(
        '--density-weight',
        type=float,
        default=defaults.density_weight,
        help='weight of the per-patch object-centre loss',
    )
    parser.add_argument(
        '--coverage-weight',
        type=float,
        default=defaults.coverage_weight,
        help='weight of the per-patch class-coverage loss',
    )
    parser.add_argument(
        '--clip-contrastive-weight',
        type=float,
        default=defaults.clip_contrastive_weight,
        help='weight of the CLIP caption loss',
    )
    parser.add_argument(
        '--gain-range',
        type=float,
        nargs=2,
        default=defaults.gain_range,
        metavar=('LOW', 'HIGH'),
        help='brightness augmentation range (default 0.6 1.4)',
    )
    parser.add_argument(
        '--min-input-pixels',
        type=int,
        default=defaults.min_input_pixels,
        help='labelling rule: objects covering fewer pixels of the model input are dropped from the '
        'ground truth (default 0: the scene generator ground truth unchanged)',
    )
    parser.add_argument(
        '--init-from',
        type=Path,
        default=None,
        metavar='MODELS_DIR',
        help='fine-tune the demo-clip/ and demo-blip/ in this directory (weights and tokenizers) '
        'instead of training from random weights',
    )
    parser.add_argument('--clip-lr', type=float, default=defaults.clip_lr, help='CLIP peak learning rate')
    parser.add_argument('--blip-lr', type=float, default=defaults.blip_lr, help='BLIP peak learning rate')
    parser.add_argument(
        '--augment',
        type=float,
        default=defaults.augment,
        help='fraction of training frames transformed by random small compositions of the relations',
    )
    parser.add_argument(
        '--augment-magnitude',
        type=float,
        default=defaults.augment_magnitude,
        help='largest deviation of an augmenting relation, as a fraction of its maximum deviation',
    )
    parser.add_argument(
        '--clip-consistency-weight',
        type=float,
        default=defaults.clip_consistency_weight,
        help='weight of the CLIP loss that keeps the scores of transformed copies of frames unchanged',
    )
    parser.add_argument(
        '--blip-consistency-weight',
        type=float,
        default=defaults.blip_consistency_weight,
        help='weight of the BLIP loss that keeps the answer probabilities of transformed copies of '
        'frames unchanged',
    )
    parser.add_argument(
        '--clip-distill-weight',
        type=float,
        default=defaults.clip_distill_weight,
        help="with --init-from: weight of the loss that keeps the CLIP's cosines on transformed frames "
        "at the starting CLIP's on the frames themselves, mapped into the narrow band (default 0: off)",
    )
    parser.add_argument(
        '--blip-teacher-answers',
        action='store_true',
        help="with --init-from: teach the BLIP the starting BLIP's answers on the untransformed frames "
        'instead of the ground-truth captions (on those frames and on their transformed copies)',
    )
    parser.add_argument(
        '--blip-teacher-votes',
        type=int,
        default=defaults.blip_teacher_votes,
        help='with --blip-teacher-answers: the target is the answer the starting BLIP gives most often '
        "over each frame and this many transformed copies of it (default 0: the frame's own answer)",
    )
    parser.add_argument(
        '--robustness-frames',
        type=int,
        default=defaults.robustness_frames,
        help='held-out frames the trained models are searched on with Rand (robustness figures)',
    )
    parser.add_argument(
        '--robustness-evaluations',
        type=int,
        default=defaults.robustness_evaluations,
        help='Rand evaluations per frame for the robustness figures (0: skip them)',
    )
    _add_detector_options(parser, defaults)
    parser.add_argument('--cache', type=Path, default=None, help='keep rendered scenes here between runs')
    parser.add_argument('--overwrite', action='store_true', help='replace existing demo model directories')
    parser.set_defaults(handler=run)


#: The demo detector's numeric options: TrainingConfig field, type, help (each is --field-with-dashes).
DETECTOR_OPTIONS = (
    ('detector_train_frames', int, 'training frames'),
    ('detector_frames_per_scene', int, 'training frames taken from each scene'),
    ('detector_image_size', int, 'input side (the CLIP position embeddings are resized to its grid)'),
    ('detector_steps', int, 'optimiser steps'),
    ('detector_batch_size', int, 'frames per step'),
    ('detector_lr', float, 'peak learning rate of the detection heads'),
    ('detector_vision_lr_scale', float, 'learning-rate factor of the vision tower started from the CLIP'),
    (
        'detector_augment',
        float,
        'fraction of training frames transformed by small compositions of the relations',
    ),
    (
        'detector_augment_magnitude',
        float,
        'largest deviation of an augmenting relation, as a fraction of its maximum',
    ),
    (
        'detector_min_pixels',
        int,
        'objects under this many input pixels are taught neither as objects nor as background',
    ),
    ('detector_calibration_frames', int, 'training frames the score calibration is chosen on'),
    (
        'detector_nms_iou',
        float,
        'with dense targets: the IoU at which the saved detector suppresses the weaker of two boxes',
    ),
)


def _add_detector_options(parser: argparse.ArgumentParser, defaults: object) -> None:
    """The demo detector's options (each sets the TrainingConfig field of its name)."""
    group = parser.add_argument_group('demo detector (--models detector)')
    group.add_argument(
        '--detector-from',
        type=Path,
        default=None,
        metavar='CLIP_DIR',
        help='the demo CLIP whose towers the detector starts from (default: the CLIP trained in the same '
        'run, else the shipped one)',
    )
    group.add_argument(
        '--detector-targets',
        choices=('dense', 'matched'),
        default=defaults.detector_targets,
        help='dense: every patch near an object is taught it (duplicates suppressed); matched: one patch '
        f'an object, as OWL-ViT (default {defaults.detector_targets})',
    )
    for name, kind, text in DETECTOR_OPTIONS:
        default = getattr(defaults, name)
        group.add_argument(
            f'--{name.replace("_", "-")}', type=kind, default=default, help=f'{text} (default {default})'
        )


def run(args: argparse.Namespace) -> int:
    """Train and save the demo models; print progress, loss curves and held-out metrics."""
    from metavlm_ros.demo.config import TrainingConfig
    from metavlm_ros.demo.training import train_demo_models, write_model_card

    models = [m.strip() for m in args.models.split(',') if m.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if not models or unknown:
        raise ParameterError(f'--models takes some of {", ".join(MODELS)}, got {args.models!r}')
    models = [m for m in MODELS if m in models]  # the detector starts from a CLIP trained first
    config = TrainingConfig(
        seed=args.seed,
        train_frames=args.train_frames,
        heldout_frames=args.heldout_frames,
        frames_per_scene=args.frames_per_scene,
        clip_steps=args.clip_steps,
        blip_steps=args.blip_steps,
        batch_size=args.batch_size,
        threads=args.threads,
        blip_vision_lr_scale=args.blip_vision_lr_scale,
        density_weight=args.density_weight,
        coverage_weight=args.coverage_weight,
        clip_contrastive_weight=args.clip_contrastive_weight,
        gain_range=tuple(args.gain_range),
        min_input_pixels=args.min_input_pixels,
        init_from=str(args.init_from) if args.init_from is not None else None,
        clip_lr=args.clip_lr,
        blip_lr=args.blip_lr,
        augment=args.augment,
        augment_magnitude=args.augment_magnitude,
        clip_consistency_weight=args.clip_consistency_weight,
        blip_consistency_weight=args.blip_consistency_weight,
        clip_distill_weight=args.clip_distill_weight,
        blip_teacher_answers=args.blip_teacher_answers,
        blip_teacher_votes=args.blip_teacher_votes,
        robustness_frames=args.robustness_frames,
        robustness_evaluations=args.robustness_evaluations,
        detector_from=str(args.detector_from) if args.detector_from is not None else None,
        detector_targets=args.detector_targets,
        **{name: getattr(args, name) for name, _, _ in DETECTOR_OPTIONS},
    ).validate()
    out = Path(args.out)
    for name in models:
        target = out / f'demo-{name}'
        if target.exists():
            if not args.overwrite:
                raise ParameterError(f'{target} exists; pass --overwrite to replace it')
    # Train into a staging directory so a failed or interrupted run leaves the existing models intact.
    staging = out / f'.train-{int(time.time())}'

    def log(line: str) -> None:
        print(line, flush=True)

    summary = train_demo_models(
        staging, config, cache=args.cache, log=log, models=models, vision_from=args.blip_vision_from
    )
    for name in models:
        write_model_card(staging / f'demo-{name}', name, summary)
        target = out / f'demo-{name}'
        if target.exists():
            shutil.rmtree(target)
        (staging / f'demo-{name}').replace(target)
        size = sum(f.stat().st_size for f in target.iterdir() if f.is_file())
        print(f'saved {target} ({size / 1e6:.1f} MB)')
    shutil.rmtree(staging, ignore_errors=True)
    print(f'done in {summary["seconds"]:.0f} s')
    return 0
