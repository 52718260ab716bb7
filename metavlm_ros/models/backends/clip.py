"""Zero-shot CLIP: per class, the cosine (or softmax) of the image and class-prompt embeddings (Eq. 3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.hf import HFBackend
from metavlm_ros.models.options import Option
from metavlm_ros.models.questions import PROMPT_PRESETS
from metavlm_ros.models.registry import register

__all__ = ['CONTRASTIVE_OPTIONS', 'ClipBackend', 'ContrastiveBackend', 'prompts_for']

#: The options of every contrastive (one text prompt per class) backend.
CONTRASTIVE_OPTIONS: tuple[Option, ...] = (
    Option(
        'prompts',
        str,
        'default',
        "the class prompt preset: 'default' or 'paper' (the authors' four category prompts)",
        choices=tuple(PROMPT_PRESETS),
    ),
    Option(
        'class_prompts',
        list,
        None,
        "one text prompt per class, in the order of classes ('' keeps the preset's)",
        mapping=True,
    ),
)


def prompts_for(
    classes: Sequence[str], preset: str, class_prompts: Mapping[str, str] | Sequence[str] | None
) -> dict[str, str]:
    """Each class's prompt: the preset's (or 'a photo of <class> underwater'), overridden by class_prompts.

    Args:
        classes: the classes, in order.
        preset: a key of PROMPT_PRESETS.
        class_prompts: class -> prompt, or one prompt per class in class order ('' keeps the preset's).

    Raises:
        ParameterError: a prompt list of the wrong length, or a prompt for an unknown class.
    """
    given: dict[str, str] = {}
    if isinstance(class_prompts, Mapping):
        given = dict(class_prompts)
    elif class_prompts:
        prompts = list(class_prompts)
        if len(prompts) != len(classes):
            raise ParameterError(
                f'class_prompts: {len(prompts)} prompts for {len(classes)} classes; give one per class'
            )
        given = {c: p for c, p in zip(classes, prompts, strict=True) if p}
    unknown = sorted(set(given) - set(classes))
    if unknown:
        raise ParameterError(f'class_prompts: a prompt given for unknown class(es) {", ".join(unknown)}')
    chosen = {c: PROMPT_PRESETS[preset].get(c, f'a photo of {c} underwater') for c in classes}
    chosen.update(given)
    return chosen


class ContrastiveBackend(HFBackend):
    """A contrastive image-text model: text embeddings of the class prompts computed once, one image
    embedding per frame, and a per-class confidence from their similarity (`_confidences`)."""

    kinds = ('confidence',)
    options = CONTRASTIVE_OPTIONS
    #: Keyword arguments of the processor for the class prompts (SigLIP was trained on fixed-length text).
    text_padding: dict[str, Any] = {'padding': True}

    def __init__(
        self,
        model: str,
        *,
        prompts: str,
        class_prompts: Mapping[str, str] | Sequence[str] | None,
        classes: Sequence[str],
        **common: Any,
    ) -> None:
        self.class_prompts = prompts_for(classes, prompts, class_prompts)
        super().__init__(model, classes=classes, **common)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        prompts_for(options['classes'], options['prompts'], options['class_prompts'])

    @staticmethod
    def _embedding(output: Any) -> Any:
        # transformers 4 returns the projected tensor, 5 an output object holding it.
        return output if hasattr(output, 'norm') else output.pooler_output

    def _prepare(self) -> None:
        prompts = [self.class_prompts[c] for c in self.classes]
        text = self._inputs(text=prompts, truncation=True, **self.text_padding)
        embeds = self._embedding(self.model.get_text_features(**text)).float()
        self._text = embeds / embeds.norm(dim=-1, keepdim=True)
        self._scale = float(self.model.logit_scale.exp())

    def scores(self, images: dict[str, Any]) -> Any:
        """Per-class confidences (frames x classes) of a batch of image inputs (`image_inputs`), as the
        tensor `predict` reads its numbers from: differentiable outside inference mode, for training and
        attribution. The class prompts' embeddings stay as computed at load time (the text tower is not
        trained)."""
        import torch

        embeds = self._embedding(self.model.get_image_features(**images)).float()
        # _text was made under inference_mode: outside it, only a plain copy can take part in autograd.
        text = self._text if torch.is_inference_mode_enabled() else self._text.clone()
        return self._confidences((embeds / embeds.norm(dim=-1, keepdim=True)) @ text.T)

    def _predict_batch(self, images: dict[str, Any]) -> list[Prediction]:
        rows = self.scores(images).cpu().numpy().astype(float)
        return [
            Prediction('confidence', dict(zip(self.classes, map(float, row), strict=True))) for row in rows
        ]

    def _confidences(self, cosine: Any) -> Any:
        """Per-class confidences (frames x classes) from the cosine similarities."""
        raise NotImplementedError


@register
class ClipBackend(ContrastiveBackend):
    """Zero-shot CLIP: the cosine similarity (the paper's choice) or a softmax over the classes."""

    name = 'clip'
    options = (
        *CONTRASTIVE_OPTIONS,
        Option(
            'confidence',
            str,
            'cosine',
            'CLIP confidence: cosine (the paper) or softmax over logit_scale * cosine',
            choices=('cosine', 'softmax'),
        ),
    )

    def __init__(self, model: str, *, confidence: str, **options: Any) -> None:
        self.confidence = confidence
        super().__init__(model, **options)

    def _processor_class(self, transformers: Any) -> Any:
        return transformers.CLIPProcessor

    def _model_class(self, transformers: Any) -> Any:
        return transformers.CLIPModel

    def _confidences(self, cosine: Any) -> Any:
        return (self._scale * cosine).softmax(dim=-1) if self.confidence == 'softmax' else cosine

    @classmethod
    def build_tiny(cls, directory: Path, **variant: Any) -> None:
        from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

        from metavlm_ros.models import tiny

        tokenizer = tiny.clip_tokenizer()
        text = {
            'vocab_size': len(tokenizer),
            **tiny.text_shape(),
            'max_position_embeddings': 77,
            'bos_token_id': tokenizer.bos_token_id,
            'eos_token_id': tokenizer.eos_token_id,
            'pad_token_id': tokenizer.pad_token_id,
        }
        config = CLIPConfig(text_config=text, vision_config=tiny.vision_shape(), projection_dim=16)
        CLIPModel(config).save_pretrained(directory, safe_serialization=True)
        side = tiny.TINY_IMAGE_SIZE
        images = CLIPImageProcessor(
            size={'shortest_edge': side},
            crop_size={'height': side, 'width': side},
            image_mean=tiny.MEAN,
            image_std=tiny.STD,
        )
        CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(directory)

    @classmethod
    def build_base(cls, directory: Path) -> None:
        """openai/clip-vit-base-patch32's shape (ViT-B/32 at 224 px, 12-layer text tower, 49408 tokens)."""
        from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

        from metavlm_ros.models import tiny

        tokenizer = tiny.clip_tokenizer()
        text = {
            'vocab_size': 49408,
            'bos_token_id': tokenizer.bos_token_id,
            'eos_token_id': tokenizer.eos_token_id,
            'pad_token_id': tokenizer.pad_token_id,
        }
        # CLIPConfig's defaults are ViT-B/32's: 768-wide 12-layer vision, patch 32, 224 px.
        CLIPModel(CLIPConfig(text_config=text)).save_pretrained(directory, safe_serialization=True)
        CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(directory)
