"""What is trained and how it goes back into the model: LoRA adapters (peft) or the full vision tower, and
the weight-space blend with the base model (WiSE-FT)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from metavlm_ros.common.errors import ParameterError

__all__ = [
    'FULL_LIMIT',
    'METHODS',
    'Tuning',
    'attach',
    'blend',
    'choose_method',
    'vision_parameters',
]

METHODS = ('auto', 'lora', 'full')
#: 'auto' fine-tunes a vision tower of fewer parameters than this in full, and larger ones with LoRA:
#: a small tower's full update costs little and adapts it most; a ViT-B's (86 M) wants adapters.
FULL_LIMIT = 20_000_000
#: The vision tower's modules by name, in the Hugging Face families the tool loads: CLIP's, SigLIP's and
#: BLIP's `vision_model` and CLIP's projection of its output into the shared space; the chat VLMs' tower
#: (Idefics3 / SmolVLM `model.vision_model`, Qwen2-VL `model.visual` with its patch merger, LLaVA,
#: PaliGemma, Gemma 3 `model.vision_tower`) and the connector that projects it into the language model's
#: embeddings (Idefics3 `model.connector`, the others' `model.multi_modal_projector`); the detectors'
#: image side: OWL-ViT's and OWLv2's vision tower with the heads that read its patches (class, box,
#: objectness and their layer norm), Grounding DINO's backbone and its projections into the encoder.
_VISION = re.compile(
    r'^(vision_model|visual_projection'
    r'|model\.(vision_model|visual|vision_tower|connector|multi_modal_projector|backbone|input_proj_vision)'
    r'|owl(vit|v2)\.vision_model|class_head|box_head|objectness_head|layer_norm)\b'
)
#: The linear layers LoRA adapts, inside the vision tower only: attention (CLIP's and SigLIP's q, k, v and
#: out projections, BLIP's and Qwen2-VL's fused qkv and projection) and the MLP (fc1 and fc2; Qwen2.5-VL's
#: gated one; Qwen3-VL's linear_fc1 and linear_fc2; Grounding DINO's Swin backbone's query, key and value).
#: Qwen2-VL's patch embedding (a convolution) is left out; the detectors' heads are small and train in full.
_LORA_TARGETS = (
    r'(.*(vision_model|visual|vision_tower)\..*\.'
    r'(q_proj|k_proj|v_proj|out_proj|qkv|attn\.proj|projection|(linear_)?fc[12]|gate_proj|up_proj|down_proj))'
    r'|(.*backbone\..*\.attention\.self\.(query|key|value))'
)

#: Model types peft cannot put LoRA adapters on (they have no input embeddings it can read): tuned in full.
_FULL_ONLY = ('grounding-dino', 'mm-grounding-dino')
#: The heads of the detector families that LoRA leaves to train in full.
_DETECTOR_HEADS = ('class_head', 'box_head', 'objectness_head')


def vision_parameters(model: Any) -> dict[str, Any]:
    """The vision tower's parameters by name (empty: the model has no tower this module knows)."""
    return {name: p for name, p in model.named_parameters() if _VISION.match(name)}


def choose_method(model: Any, method: str) -> str:
    """'lora' or 'full' for `method` ('auto': by the vision tower's size, `FULL_LIMIT`).

    Raises:
        ParameterError: An unknown method, or a model without a vision tower to train.
    """
    if method not in METHODS:
        raise ParameterError(f'--method must be one of {", ".join(METHODS)}, got {method!r}')
    tower = vision_parameters(model)
    if not tower:
        raise ParameterError(f'{type(model).__name__} has no vision tower this tool knows to harden')
    model_type = getattr(getattr(model, 'config', None), 'model_type', '')
    if model_type in _FULL_ONLY:
        # peft wraps a model only through its input embeddings, which transformers does not give these.
        if method == 'lora':
            raise ParameterError(f'--method lora: peft cannot wrap {model_type} models; use full (or auto)')
        return 'full'
    if method != 'auto':
        return method
    return 'full' if sum(p.numel() for p in tower.values()) < FULL_LIMIT else 'lora'


@dataclass
class Tuning:
    """A model made ready to train: its trainable parameters by name; `finish()` gives back the model in
    its own class and layout (LoRA merged), ready to blend and save."""

    model: Any
    method: str
    rank: int
    trainable: dict[str, Any] = field(default_factory=dict)
    _peft: Any = None

    def finish(self) -> Any:
        """The plain model: adapters merged into the weights they adapt (peft's merge_and_unload)."""
        if self._peft is not None:
            self.model = self._peft.merge_and_unload()
            self._peft = None
        for p in self.model.parameters():
            p.requires_grad_(False)
        return self.model


def attach(model: Any, method: str, *, rank: int = 8) -> Tuning:
    """Freeze `model` but what `method` trains: LoRA adapters of rank `rank` on the vision tower's linear
    layers (peft), or the whole vision tower ('full'). The text tower is never trained: the class prompts'
    embeddings, which every answer is measured against, stay as they are.

    Raises:
        ParameterError: A rank below 1.
    """
    for p in model.parameters():
        p.requires_grad_(False)
    if method == 'full':
        tower = vision_parameters(model)
        for p in tower.values():
            p.requires_grad_(True)
        return Tuning(model, method, 0, tower)
    if rank < 1:
        raise ParameterError(f'--rank must be at least 1, got {rank}')
    import torch
    from peft import LoraConfig, get_peft_model

    # A detector's heads (OWL's class, box and objectness heads) are a few small layers read by every
    # patch: trained in full beside the tower's adapters (peft's modules_to_save), merged back as they are.
    heads = [name for name in _DETECTOR_HEADS if isinstance(getattr(model, name, None), torch.nn.Module)]
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=_LORA_TARGETS,
        modules_to_save=heads or None,
    )
    # get_peft_model adds the adapters inside `model` itself: the backend holding it runs them.
    wrapped = get_peft_model(model, config)
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    return Tuning(model, method, rank, trainable, wrapped)


def blend(base: Mapping[str, Any], tuned: Mapping[str, Any], alpha: float) -> dict[str, Any]:
    """WiSE-FT's weight-space ensemble: (1 - alpha) * base + alpha * tuned for every floating-point
    tensor (others, such as position ids, from `tuned`). alpha 0 is the base model, 1 the fine-tuned one.

    Raises:
        ParameterError: alpha outside [0, 1], or state dicts of different tensors.
    """
    if not 0 <= alpha <= 1:
        raise ParameterError(f'blend alpha must lie in [0, 1], got {alpha}')
    if set(base) != set(tuned):
        raise ParameterError('cannot blend models of different layouts')
    return {
        name: (base[name] * (1 - alpha) + value * alpha) if value.is_floating_point() else value
        for name, value in tuned.items()
    }
