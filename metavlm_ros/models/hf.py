"""The base class of every in-process Hugging Face backend: device, dtype, offline loading and batching.
All transformers code is in models/."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.image_processors import (
    IMAGE_PROCESSOR_OPTION,
    image_processor_class,
    load_image_processor,
)
from metavlm_ros.models.model_files import offline_transformers, resolve_model, weights_hash
from metavlm_ros.models.options import DTYPES, Backend, Option
from metavlm_ros.models.pixel_path import PREPROCESS, PixelPath

__all__ = [
    'HF_OPTIONS',
    'HFBackend',
    'hf_config',
    'torch_device',
    'torch_dtype',
]


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
        transformers = offline_transformers()
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
