"""Hugging Face plumbing every in-process backend shares: finding a model offline, its weights' hash,
the batched pixel path and the loading/batching base class. All transformers code is in models/."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.options import DTYPES, Backend, Option

__all__ = [
    'HF_OPTIONS',
    'IMAGE_PROCESSORS',
    'IMAGE_PROCESSOR_OPTION',
    'PREPROCESS',
    'HFBackend',
    'PixelPath',
    'hf_config',
    'image_processor_class',
    'load_image_processor',
    'resolve_model',
    'torch_device',
    'torch_dtype',
    'weights_hash',
]

_DEMO_ROOT = Path(__file__).resolve().parent.parent / 'models'
_HF_ID = re.compile(r'^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$')
#: How frames become pixel values: PixelPath ('batched') or the Hugging Face processor ('processor').
PREPROCESS = ('batched', 'processor')

#: The image processors transformers has for a family: its PIL one and its torchvision ("fast") one.
#: transformers picks torchvision whenever it is installed; metavlm_ros picks what the option says, so a
#: model answers the same with or without torchvision installed unless asked otherwise.
IMAGE_PROCESSORS = ('pil', 'torchvision')

#: PIL's `reducing_gap` for frames far larger than the model's input: PIL first shrinks them by an
#: integer factor with a box filter, then resamples as the processor does. Frames less than
#: 2 * REDUCING_GAP times the input size are resampled exactly as the processor does
#: (docs/performance.md gives the measured difference for larger ones).
REDUCING_GAP = 2.0


def _hf() -> Any:
    """Import transformers lazily, offline: importing this module must stay cheap and never go online."""
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import transformers

    return transformers


def resolve_model(backend: str, model: str) -> str:
    """Find a model on this machine without touching the network.

    Args:
        backend: 'clip', 'blip' or 'instructblip'.
        model: a local directory, a Hugging Face id already in the local cache, or 'demo' for the demo
            model shipped inside the package.

    Returns:
        The model's local directory.

    Raises:
        ModelError: unknown backend, or a model that is not on disk (the message says how to fetch it).
    """
    from metavlm_ros.models.registry import backend_class  # the registry imports this module's users

    backend_class(backend)
    model = str(model).strip()
    if not model:
        raise ModelError('no model given; pass a local model directory, a Hugging Face id or demo')
    if model == 'demo':
        path = _DEMO_ROOT / f'demo-{backend}'
        if not (path / 'config.json').is_file():
            raise ModelError(f'demo model for {backend} is not built; run metavlm train-demo-models')
        return _checked_weights(str(path))
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelError(f'model {model!r} is a file; pass the model directory (with config.json)')
        if not (path / 'config.json').is_file():
            raise ModelError(f'model directory {model!r} has no config.json; it is not a saved model')
        return _checked_weights(str(path.resolve()))
    if not _HF_ID.match(model):
        raise ModelError(f'model directory {model!r} does not exist')
    from huggingface_hub import constants, snapshot_download

    try:
        # local_files_only: a model that is not cached fails at once instead of waiting on the network.
        directory = snapshot_download(model, local_files_only=True)
    except Exception:  # noqa: BLE001 -- the hub raises several types for 'not cached'; all mean the same
        raise ModelError(
            f'model {model!r} is neither a local directory nor in the local Hugging Face cache '
            f'({constants.HF_HUB_CACHE}); on a connected machine run `hf download {model}` and copy '
            f'that cache here, or pass a local directory'
        ) from None
    return _checked_weights(directory)


def _checked_weights(model_dir: str) -> str:
    """`model_dir`, once the headers of its safetensors files read (a truncated or random file fails)."""
    from safetensors import safe_open

    for path in sorted(Path(model_dir).glob('*.safetensors')):
        try:
            with safe_open(str(path), framework='np'):
                pass
        except Exception as exc:  # noqa: BLE001 -- SafetensorError, OSError: all mean a damaged file
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f'{path}: damaged weights ({first})') from None
    return model_dir


def weights_hash(model_dir: str | Path, length: int = 12) -> str:
    """Short sha256 of a model's safetensors files (names and contents), to record model identity.

    Args:
        model_dir: the model directory.
        length: number of hex digits kept.

    Returns:
        The hex digest prefix; '' when the directory holds no safetensors file.
    """
    files = sorted(Path(model_dir).glob('*.safetensors'))
    if not files:
        return ''
    # A process reads one model's identity more than once (`metavlm run` checks the results directory
    # before its tester node configures; the node checks it again): files whose path, inode, size,
    # modification and change times are unchanged are not read again (as git's index tells changed
    # files, by their stat).
    key = tuple((str(p.resolve()), *_stat_key(p.stat())) for p in files)
    if key not in _WEIGHTS_SHA256:
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode())
            with path.open('rb') as handle:
                for block in iter(lambda h=handle: h.read(1 << 22), b''):
                    digest.update(block)
        _WEIGHTS_SHA256[key] = digest.hexdigest()
    return _WEIGHTS_SHA256[key][:length]


#: weights_hash's digests by their files' path and _stat_key.
_WEIGHTS_SHA256: dict[tuple[tuple[Any, ...], ...], str] = {}


def _stat_key(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


@dataclass(frozen=True)
class PixelPath:
    """The image processor's steps (resize, centre crop, rescale, normalise) for a whole batch at once.

    The Hugging Face processor converts every frame to PIL and back several times and normalises it
    in float64 on the CPU; this path resizes each uint8 frame once with PIL (the same filter, so the
    same pixels), crops by slicing, stacks the batch and rescales and normalises it in one tensor
    operation on the model's device. `from_processor` returns None for a processor whose steps it
    does not reproduce; the backend then calls the processor itself.

    Attributes:
        shortest_edge: resize so the shorter side is this long (aspect kept); 0 for a fixed size.
        size: fixed resize size (height, width) when shortest_edge is 0.
        crop: centre-crop size (height, width), or None.
        resample: PIL resampling filter.
        scale: rescale factor (1/255).
        mean: per-channel mean.
        std: per-channel standard deviation.
    """

    shortest_edge: int
    size: tuple[int, int]
    crop: tuple[int, int] | None
    resample: int
    scale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @classmethod
    def from_processor(cls, processor: Any) -> PixelPath | None:
        """The path of a CLIP-, BLIP- or SigLIP-style image processor (or a processor holding it), or None."""
        ip = getattr(processor, 'image_processor', processor)
        # PixelPath resizes with PIL: it reproduces PIL image processors only.
        if not type(ip).__name__.endswith('Pil') or type(ip).__name__.removesuffix('Pil') not in (
            'CLIPImageProcessor',
            'BlipImageProcessor',
            'SiglipImageProcessor',
        ):
            return None
        size = dict(getattr(ip, 'size', None) or {})
        if not (getattr(ip, 'do_resize', False) and ip.do_rescale and ip.do_normalize):
            return None
        if getattr(ip, 'do_pad', False) or size.get('longest_edge') or getattr(ip, 'resample', None) is None:
            return None
        mean, std = list(ip.image_mean), list(ip.image_std)
        if len(mean) != 3 or len(std) != 3:
            return None
        shortest = int(size.get('shortest_edge') or 0)
        fixed = (int(size.get('height') or 0), int(size.get('width') or 0))
        if not shortest and not all(fixed):
            return None
        crop = None
        if getattr(ip, 'do_center_crop', False):
            crop_size = dict(ip.crop_size or {})
            crop = (int(crop_size.get('height') or 0), int(crop_size.get('width') or 0))
            # A crop larger than the resized frame would pad: left to the processor.
            if not all(crop) or max(crop) > (shortest or min(fixed)):
                return None
        return cls(shortest, fixed, crop, int(ip.resample), float(ip.rescale_factor), tuple(mean), tuple(std))

    @property
    def input_size(self) -> int:
        """Side of the square the model sees (the crop, else the resize size)."""
        return max(self.crop) if self.crop else (self.shortest_edge or max(self.size))

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize step, by the processor's own rule."""
        if not self.shortest_edge:
            return self.size
        short, long = min(height, width), max(height, width)
        new_long = int(self.shortest_edge * long / short)
        return (self.shortest_edge, new_long) if height <= width else (new_long, self.shortest_edge)

    def resize(self, frame: np.ndarray) -> np.ndarray:
        """One RGB uint8 frame resized and cropped as the processor would, still uint8 (H, W, 3)."""
        from PIL import Image

        height, width = self.resized_shape(*frame.shape[:2])
        if (height, width) != frame.shape[:2]:
            resized = Image.fromarray(frame).resize(
                (width, height), resample=self.resample, reducing_gap=REDUCING_GAP
            )
            frame = np.asarray(resized)
        if self.crop:
            top, left = (height - self.crop[0]) // 2, (width - self.crop[1]) // 2
            frame = frame[top : top + self.crop[0], left : left + self.crop[1]]
        return frame

    def pixel_values(self, frames: Sequence[np.ndarray], device: Any, dtype: Any) -> Any:
        """The batch's pixel_values tensor (N, 3, H, W) on `device` in `dtype`.

        The uint8 batch crosses to the device (a quarter of the float32 bytes) and is normalised there.
        """
        import torch

        batch = torch.from_numpy(np.stack([self.resize(f) for f in frames])).to(device)
        mean = torch.tensor(self.mean, device=device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=device).view(1, 3, 1, 1)
        pixels = batch.permute(0, 3, 1, 2).float().mul_(self.scale).sub_(mean).div_(std)
        return pixels.to(dtype).contiguous()


def torch_device(device: str) -> Any:
    """The torch device a `device` option names ('auto': CUDA when available, decided now)."""
    import torch

    if device == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):
        raise ParameterError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from None
    if chosen.type == 'cuda' and not torch.cuda.is_available():
        raise ParameterError(f'device {device!r} requested but CUDA is not available')
    return chosen


def torch_dtype(dtype: str, device: Any, *, half_on_gpu: bool = False) -> Any:
    """The torch dtype a `dtype` option names on `device`.

    'auto' is float32: full precision keeps batched and one-by-one judgements identical. Only a backend
    of 7B-class models (half_on_gpu) is halved on a GPU. bfloat16 on a CPU is faster but changes answers
    (docs/performance.md), so it is never chosen for the user.
    """
    import torch

    if dtype not in DTYPES:
        raise ParameterError(f'dtype must be one of {", ".join(DTYPES)}, got {dtype!r}')
    if dtype == 'auto':
        return torch.float16 if device.type == 'cuda' and half_on_gpu else torch.float32
    return getattr(torch, dtype)


#: Which of its family's image processors a model's frames go through (identity: it changes answers).
IMAGE_PROCESSOR_OPTION = Option(
    'image_processor',
    str,
    'pil',
    "the family's image processor: 'pil' (transformers' reference one, the same with or without "
    "torchvision) or 'torchvision' (its fast one, which transformers picks when torchvision is "
    'installed); the class used is recorded in the results',
    choices=IMAGE_PROCESSORS,
    identity=True,
)


def _backend_of(image_processor: Any) -> str:
    """'pil' or 'torchvision': the backend an image processor instance computes with."""
    try:
        from transformers.image_processing_backends import PilBackend, TorchvisionBackend
    except ImportError:  # a transformers without backend classes: their names say it
        return 'pil' if type(image_processor).__name__.endswith('Pil') else 'torchvision'
    if isinstance(image_processor, TorchvisionBackend):
        return 'torchvision'
    if isinstance(image_processor, PilBackend):
        return 'pil'
    return 'pil' if type(image_processor).__name__.endswith('Pil') else 'torchvision'


def load_image_processor(model_dir: str, choice: str) -> Any:
    """The model's image processor computing with `choice` ('pil' or 'torchvision'), exactly that one.

    Raises:
        ParameterError: `choice` is not one of IMAGE_PROCESSORS, or 'torchvision' without torchvision.
        ModelError: the model has no image processor, or its family none of that kind (transformers
            would fall back to the other one, which would answer differently than asked).
    """
    if choice not in IMAGE_PROCESSORS:
        raise ParameterError(f'image_processor must be one of {", ".join(IMAGE_PROCESSORS)}, got {choice!r}')
    if choice == 'torchvision' and importlib.util.find_spec('torchvision') is None:
        raise ParameterError("image_processor 'torchvision' needs torchvision, which is not installed")
    transformers = _hf()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the fallback warning is turned into a refusal below
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(
            model_dir, local_files_only=True, trust_remote_code=False, backend=choice
        )
    except (OSError, ImportError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f'cannot load the image processor of {model_dir}: {first}') from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    if _backend_of(processor) != choice:
        raise ModelError(
            f'{model_dir}: its family has no {choice} image processor (transformers offers '
            f'{type(processor).__name__}); set image_processor to {_backend_of(processor)}'
        )
    return processor


def image_processor_class(model_dir: str | None, choice: str) -> str | None:
    """The class name of the image processor `load_image_processor` gives (None: no model directory
    or none loads), for identity records: read from the processor's config, without the weights."""
    if not model_dir or not (Path(model_dir) / 'config.json').is_file():
        return None
    try:
        return type(load_image_processor(model_dir, choice)).__name__
    except (ModelError, ParameterError):
        return None


#: Options of every in-process Hugging Face backend, beyond the common ones.
HF_OPTIONS: tuple[Option, ...] = (
    IMAGE_PROCESSOR_OPTION,
    Option(
        'preprocess',
        str,
        'batched',
        "'batched': one resize per frame, normalised on the device; 'processor': the Hugging Face "
        'processor frame by frame (the reference the batched path is tested against)',
        choices=PREPROCESS,
    ),
)


def hf_config(model_dir: str | None) -> dict[str, Any]:
    """A saved model's config.json as a dict ({} when there is none to read)."""
    path = Path(model_dir or '') / 'config.json'
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class HFBackend(Backend):
    """Shared Hugging Face plumbing: device, dtype, offline loading and batching under inference_mode.

    Subclasses name their model and processor classes and implement `_predict_batch`.
    """

    #: Whether dtype 'auto' halves the model on a GPU (a 7B-class model would need ~30 GB in float32).
    half_on_gpu: ClassVar[bool] = False

    @classmethod
    def all_options(cls) -> tuple[Option, ...]:
        return super().all_options() + HF_OPTIONS

    @classmethod
    def describe(cls, model_dir: str | None, options: Any) -> dict[str, Any]:
        return {
            'architectures': hf_config(model_dir).get('architectures'),
            'image_processor': image_processor_class(model_dir, options['image_processor']),
        }

    def __init__(
        self,
        model: str,
        *,
        classes: Sequence[str],
        device: str,
        dtype: str,
        batch_size: int,
        preprocess: str = 'batched',
        image_processor: str = 'pil',
    ) -> None:
        # Resolve first: a missing model must fail at once, before any slow import or load.
        self.model_path = resolve_model(self.name, model)
        import torch

        if not isinstance(batch_size, int) or batch_size < 1:
            raise ParameterError(f'batch_size must be a positive integer, got {batch_size!r}')
        if dtype not in DTYPES:
            raise ParameterError(f'dtype must be one of {", ".join(DTYPES)}, got {dtype!r}')
        if preprocess not in PREPROCESS:
            raise ParameterError(f'preprocess must be one of {", ".join(PREPROCESS)}, got {preprocess!r}')
        self.model_id = str(model)
        self.classes = tuple(classes)
        self.batch_size = batch_size
        self.device = self._device(device)
        self.dtype = self._dtype(dtype)
        self._hash: str | None = None
        transformers = _hf()
        verbosity = transformers.logging.get_verbosity()
        bars = transformers.logging.is_progress_bar_enabled()
        # Load-time advice (torchvision, fast processors) and progress bars are noise in a test run.
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        try:
            self.processor = self._processor_class(transformers).from_pretrained(
                self.model_path,
                local_files_only=True,
                trust_remote_code=False,
                image_processor=load_image_processor(self.model_path, image_processor),
            )
            self.model = self._model_class(transformers).from_pretrained(
                self.model_path,
                local_files_only=True,
                use_safetensors=True,
                trust_remote_code=False,
                dtype=self.dtype,
            )
        except (OSError, ImportError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f'cannot load {self.name} model from {self.model_path}: {first}') from None
        finally:
            transformers.logging.set_verbosity(verbosity)
            if bars:
                transformers.logging.enable_progress_bar()
        self.model.to(self.device).eval()
        path = PixelPath.from_processor(self.processor)
        self.input_size = path.input_size if path else _processor_side(self.processor)
        # 'processor' (or a processor PixelPath does not reproduce): the processor judges every frame.
        self._pixel_path = path if preprocess == 'batched' else None
        with torch.inference_mode():
            self._prepare()

    # -- what subclasses define ------------------------------------------------------------------
    def _processor_class(self, transformers: Any) -> Any:
        raise NotImplementedError

    def _model_class(self, transformers: Any) -> Any:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Compute once what every batch reuses (CLIP's text embeddings)."""

    def _predict_batch(self, images: dict[str, Any]) -> list[Prediction]:
        """Judge one batch, given as the model's image inputs (pixel_values, and what else the
        processor makes: Siglip2's pixel_attention_mask and spatial_shapes)."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------
    def _device(self, device: str) -> Any:
        return torch_device(device)

    def _dtype(self, dtype: str) -> Any:
        return torch_dtype(dtype, self.device, half_on_gpu=self.half_on_gpu)

    def _inputs(self, **kwargs: Any) -> dict[str, Any]:
        """Run the processor and move tensors to the model's device, pixels in the model's dtype."""
        batch = self.processor(return_tensors='pt', **kwargs)
        moved = {}
        for key, value in batch.items():
            if hasattr(value, 'to'):
                value = (
                    value.to(self.device, self.dtype) if value.is_floating_point() else value.to(self.device)
                )
            moved[key] = value
        return moved

    def image_inputs(self, frames: Sequence[np.ndarray]) -> dict[str, Any]:
        """The model's image inputs for a batch of frames, on its device, floats in its dtype."""
        if self._pixel_path is not None:
            return {'pixel_values': self._pixel_path.pixel_values(frames, self.device, self.dtype)}
        from PIL import Image

        return self._inputs(images=[Image.fromarray(f) for f in frames])

    def predict(self, frames: Sequence[np.ndarray]) -> list[Prediction]:
        """Judge frames in batches of `batch_size` under torch.inference_mode; see VLMBackend.predict."""
        import torch

        frames = [check_frame(frame, what=f'frame {index}') for index, frame in enumerate(frames)]
        predictions: list[Prediction] = []
        with torch.inference_mode():
            for start in range(0, len(frames), self.batch_size):
                predictions.extend(
                    self._predict_batch(self.image_inputs(frames[start : start + self.batch_size]))
                )
        return predictions

    def weights_hash(self) -> str:
        """The sha256 of the loaded model's safetensors files, as identity records hold it (first call)."""
        if self._hash is None:
            self._hash = weights_hash(self.model_path, length=64)
        return self._hash


def _processor_side(processor: Any) -> int:
    """The input side a processor PixelPath does not reproduce resizes to, when it says; else 0."""
    ip = getattr(processor, 'image_processor', processor)
    for sizes in (getattr(ip, 'crop_size', None), getattr(ip, 'size', None)):
        sizes = dict(sizes or {})
        side = sizes.get('height') or sizes.get('shortest_edge')
        if side:
            return int(side)
    return 0
