"""Zero-shot SigLIP and SigLIP 2: per class, the sigmoid probability of the image and the class prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ModelError
from metavlm_ros.models.backends.clip import ContrastiveBackend
from metavlm_ros.models.hf import hf_config
from metavlm_ros.models.registry import register

__all__ = ['SiglipBackend']

_MODEL_TYPES = ('siglip', 'siglip2')


@register
class SiglipBackend(ContrastiveBackend):
    """SigLIP / SigLIP 2: each class is judged on its own, sigmoid(scale * cosine + bias), as the model was
    trained (a pairwise sigmoid loss, not a softmax over classes): the probability that the prompt
    describes the image, independent of the other classes' (docs/method.md §9)."""

    name = 'siglip'

    def _processor_class(self, transformers: Any) -> Any:
        return transformers.AutoProcessor

    def _model_class(self, transformers: Any) -> Any:
        model_type = hf_config(self.model_path).get('model_type')
        if model_type not in _MODEL_TYPES:
            raise ModelError(
                f'{self.model_path} is a {model_type or "unknown"} model, not SigLIP or SigLIP 2 '
                f'(config model_type {"/".join(_MODEL_TYPES)})'
            )
        return transformers.AutoModel

    def _prepare(self) -> None:
        # SigLIP was trained on text padded to its full length (64 tokens); shorter padding changes
        # the text embedding, so the prompts are padded the same way.
        length = int(self.model.config.text_config.max_position_embeddings)
        self.text_padding = {'padding': 'max_length', 'max_length': length}
        super()._prepare()
        self._bias = float(self.model.logit_bias)

    def _confidences(self, cosine: Any) -> Any:
        return (self._scale * cosine + self._bias).sigmoid()

    @classmethod
    def build_tiny(cls, directory: Path, *, version: int = 1, **variant: Any) -> None:
        """A tiny SigLIP (version 1) or SigLIP 2 (version 2: NaFlex image processing)."""
        from metavlm_ros.models.tiny_siglip import build_tiny_siglip

        build_tiny_siglip(directory, version=version, seed=None)  # build_tiny_model seeded it
