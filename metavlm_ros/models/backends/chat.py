"""Any Hugging Face image-text-to-text chat VLM in process (Qwen2-VL, SmolVLM, PaliGemma, LLaVA, Gemma 3):
a count question (Eq. 2), a yes/no question per class (Eq. 3) or a grounding question (boxes,
models/grounding.py; Florence-2's task prompts too), through models/generative.py."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ModelError, ParameterError
from metavlm_ros.common.images import check_frame
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.anyres_pixels import AnyResPixelPath
from metavlm_ros.models.counts import label_matcher, parse_counts
from metavlm_ros.models.grounding import (
    RELEASED_QWEN_RESIZE,
    QwenResize,
    box_format_for,
    detection_prediction,
    grounding_question,
    grounding_questions,
)
from metavlm_ros.models.hf import hf_config, torch_device, torch_dtype
from metavlm_ros.models.idefics3_pixels import Idefics3PixelPath
from metavlm_ros.models.image_processors import IMAGE_PROCESSOR_OPTION, crops_frames, image_processor_class
from metavlm_ros.models.model_files import resolve_model, weights_hash
from metavlm_ros.models.options import Backend
from metavlm_ros.models.pixel_path import GRADIENT_PROCESSORS, GRADIENT_TORCHVISION_PROCESSORS, PixelPath
from metavlm_ros.models.prompt_formats import family_prompt_format
from metavlm_ros.models.questions import (
    QUESTION_OPTIONS,
    answer_tokens,
    check_confidence_question,
    class_questions,
    count_prediction,
    count_question,
)
from metavlm_ros.models.qwen_pixels import QwenPixelPath
from metavlm_ros.models.registry import register

__all__ = ['ChatBackend', 'GenerativeQuestions']

#: The image processors rebuilt in torch that bring frames' pixels to the model differentiably.
DifferentiablePath = PixelPath | QwenPixelPath | Idefics3PixelPath | AnyResPixelPath

# Files whose content fixes how a frame and a question become the model's input.
_PROCESSOR_FILES = (
    'chat_template.jinja',
    'chat_template.json',
    'processor_config.json',
    'preprocessor_config.json',
    'tokenizer_config.json',
)


class GenerativeQuestions:
    """What a generative backend (in process or served) asks, checked before any model is reached.

    Attributes:
        kind: 'count', 'confidence' or 'detection'.
        question: the count question, the grounding question (with {class} where it is asked per
            class) or the yes/no question's template.
        questions: what each frame is asked, in order: the count question; the grounding question, or
            one per class (models/grounding.py grounding_questions); one yes/no question per class.
        box_format: how a grounding answer writes boxes (kind 'detection'; None while the model's
            family is not known: `family` None).
        resize: how a Qwen2.5-VL resizes frames (box format 'qwen2.5'): the released processor's
            unless the backend knows its own.
    """

    def __init__(
        self,
        *,
        classes: Sequence[str],
        kind: str,
        prompt: str | None,
        answer_format: str,
        confidence_question: str | None,
        vocabularies: Mapping[str, Sequence[str]] | None,
        box_format: str | None = None,
        family: str | None = None,
    ) -> None:
        self.kind = kind
        self.classes = tuple(classes)
        self.answer_format = answer_format
        self.vocabularies = dict(vocabularies) if vocabularies else None
        self.questions: list[str] = []
        self.box_format: str | None = None
        self.resize = RELEASED_QWEN_RESIZE
        does = {'count': 'counts (kind count)', 'detection': 'detects (kind detection)'}.get(kind, '')
        if kind != 'confidence' and confidence_question is not None:
            raise ParameterError(f'confidence_question is for kind confidence; this model {does}')
        if kind != 'detection' and box_format is not None:
            does = does or 'gives confidences'
            raise ParameterError(f'box_format is for kind detection; this model {does}')
        if kind == 'count':
            self.question = count_question(prompt, answer_format, self.classes)
            self.questions = [self.question]
            # Validates the vocabularies against the classes before any model is reached.
            parse_counts('', self.classes, self.vocabularies)
        elif kind == 'detection':
            if answer_format != 'text':
                raise ParameterError(f'answer_format is for kind count; this model {does}')
            self.match = label_matcher(self.classes, self.vocabularies)
            # `family` None: asked before the model is known (check); its family decides the default.
            if box_format is not None or family is not None:
                self.box_format = box_format_for(box_format, family or '')
            self.question = grounding_question(prompt, self.box_format or 'qwen2.5', self.classes)
            self.questions = grounding_questions(self.question, self.classes)
        else:
            given = [name for name, value in (('prompt', prompt), ('vocabularies', vocabularies)) if value]
            if answer_format != 'text':
                given.append('answer_format')
            if given:
                raise ParameterError(f'{", ".join(given)}: for kind count; this model gives confidences')
            self.question = check_confidence_question(confidence_question)
            self.questions = class_questions(self.question, self.classes)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], family: str | None = None) -> GenerativeQuestions:
        """The questions of a backend's resolved options (QUESTION_OPTIONS and classes)."""
        asked = ('classes', 'kind', 'prompt', 'answer_format', 'confidence_question', 'vocabularies')
        return cls(**{name: options[name] for name in asked}, box_format=options['box_format'], family=family)

    def answer(self, answers: Sequence[str], frame: np.ndarray) -> Prediction:
        """The generated answers to `questions` about `frame` as a Prediction: counts, or boxes in the
        frame's pixels (a grounding asked per class fails where any of its answers does not parse)."""
        if self.kind == 'detection':
            size = (frame.shape[1], frame.shape[0])
            return detection_prediction(answers, self.box_format, size, self.classes, self.match, self.resize)
        return self.count(answers[0])

    def count(self, answer: str) -> Prediction:
        return count_prediction(answer, self.classes, self.answer_format, self.vocabularies)

    def confidence(self, probabilities: Sequence[float]) -> Prediction:
        return Prediction('confidence', dict(zip(self.classes, map(float, probabilities), strict=True)))


@register
class ChatBackend(Backend):
    """An `AutoModelForImageTextToText` checkpoint with a chat template, loaded from disk.

    kind 'count': the question as a chat message with the image, greedy answers in one padded batch,
    parsed as Table 1 text or strict JSON (a JSON answer that does not parse is a parse failure).
    kind 'confidence': per class, P(yes) / (P(yes) + P(no)) of the first answer token of a yes/no
    question, from one prefill per frame whose cache every class question continues (or one prefill
    per (frame, class) where the family needs it), without generating (docs/method.md §9).
    kind 'detection': a grounding question, greedy answers read in the family's box format
    (models/grounding.py), boxes in the pixels of the frame given. Florence-2, asked by task prompt
    (models/prompt_formats.py), gives this kind only: one open-vocabulary detection per class.
    """

    name = 'vlm'
    kinds = ('count', 'confidence', 'detection')
    options = (*QUESTION_OPTIONS, IMAGE_PROCESSOR_OPTION)

    @classmethod
    def kind_for(cls, options: Mapping[str, Any]) -> str:
        return str(options['kind'])

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        GenerativeQuestions.from_options(options)

    @classmethod
    def describe(cls, model_dir: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
        """Architecture, and the sha256 of each file that decides how a frame and a question become
        the model's input (chat template, processor and tokenizer settings)."""
        config = hf_config(model_dir)
        files = {}
        for name in _PROCESSOR_FILES:
            path = Path(model_dir or '') / name
            if path.is_file():
                files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        described = {
            'architectures': config.get('architectures'),
            'model_type': config.get('model_type'),
            'image_processor': image_processor_class(model_dir, options['image_processor']),
            'files': files,
        }
        if options['kind'] == 'detection':  # the format answers are read in, the family's by default
            described['box_format'] = box_format_for(options['box_format'], config.get('model_type') or '')
        return described

    def __init__(
        self,
        model: str,
        *,
        classes: Sequence[str],
        device: str,
        dtype: str,
        batch_size: int,
        max_new_tokens: int,
        image_processor: str = 'pil',
        **questions: Any,
    ) -> None:
        # Everything a user can get wrong is checked before the (slow) load; `questions`: the kind,
        # prompt, answer_format, confidence_question, vocabularies and box_format (QUESTION_OPTIONS).
        self.model_path = resolve_model(self.name, model)
        family = str(hf_config(str(self.model_path)).get('model_type') or '')
        self.asked = GenerativeQuestions(classes=classes, family=family, **questions)
        kind = self.asked.kind
        asked_as = family_prompt_format(family)
        if kind not in asked_as.kinds:
            raise ParameterError(
                f'{self.model_path}: a {family} model ({asked_as.name} prompts) gives kind '
                f'{" or ".join(asked_as.kinds)} only, not {kind}'
            )
        from metavlm_ros.models.generative import ChatModel

        self.model_id = str(model)
        self.classes = tuple(classes)
        self.chosen_kind = kind
        self.batch_size = batch_size
        self.max_new_tokens = answer_tokens(kind, max_new_tokens)
        device_ = torch_device(device)
        self.chat = ChatModel(
            self.model_path,
            device=device_,
            dtype=torch_dtype(dtype, device_),
            image_processor=image_processor,
        )
        if kind == 'confidence':
            self.chat.answer_tokens()  # a tokenizer without single-token yes/no fails now, not mid-search
        images = getattr(self.chat.processor, 'image_processor', None)
        if getattr(images, 'merge_size', None):  # a Qwen processor: its own resize, not the released one
            self.asked.resize = QwenResize.of_processor(images)
        if kind == 'detection' and crops_frames(images):
            raise ModelError(
                f'{self.model_path}: its image processor crops frames (do_center_crop), so the boxes of a '
                'grounding answer cannot be brought back to the whole frame'
            )
        self.input_size = self.chat.input_side
        self._hash: str | None = None

    def predict(self, frames: Sequence[np.ndarray]) -> list[Prediction]:
        """Judge frames, `batch_size` per model call (a confidence call holds frames x classes rows)."""
        frames = [check_frame(frame, what=f'frame {index}') for index, frame in enumerate(frames)]
        predictions: list[Prediction] = []
        for start in range(0, len(frames), self.batch_size):
            chunk = frames[start : start + self.batch_size]
            if self.kind != 'confidence':
                # One batch per question: a count's one, a grounding's one or one per class.
                replies = [self.chat.generate(chunk, q, self.max_new_tokens) for q in self.asked.questions]
                predictions.extend(map(self.asked.answer, zip(*replies, strict=True), chunk))
            else:
                rows = self.chat.yes_probability(chunk, self.asked.questions)
                predictions.extend(self.asked.confidence(row) for row in rows)
        return predictions

    @property
    def model(self) -> Any:
        """The Hugging Face model answering (what `metavlm harden` trains and saves)."""
        return self.chat.model

    def scores(self, frames: Sequence[np.ndarray]) -> Any:
        """Per-class P(yes) / (P(yes) + P(no)) of a batch of frames (frames x classes, a tensor that torch
        differentiates): `predict`'s confidences, from whole prefills, for `metavlm harden` (kind
        confidence).

        Raises:
            ParameterError: This model gives another kind of answer.
        """
        self._trains('confidence')
        return self.chat.yes_scores(frames, self.asked.questions)

    def answer_ids(self, frames: Sequence[np.ndarray]) -> list[list[int]]:
        """The token ids of the count answer `predict` decodes, one row a frame: the greedy tokens up to
        and with the model's end-of-answer token (without it where the answer ran to max_new_tokens).
        The very tokens generation chose, which a decoded text tokenised again need not give back.

        Raises:
            ParameterError: This model gives another kind of answer.
        """
        self._trains('count')
        end = set(self._end_tokens())
        rows = []
        for start in range(0, len(frames), self.batch_size):
            chunk = list(frames[start : start + self.batch_size])
            for row in self.chat.generate_ids(chunk, self.asked.question, self.max_new_tokens):
                stop = next((i for i, token in enumerate(row) if token in end), None)
                rows.append(row if stop is None else row[: stop + 1])
        return rows

    def answer_loss(self, frames: Sequence[np.ndarray], answers: Sequence[str | Sequence[int]]) -> Any:
        """The mean cross-entropy of `answers` (one a frame) by teacher forcing, after the chat prompt
        `predict` asks: the same template, image placement and left padding `generate` decodes from, each
        answer's tokens after its prompt, positions as `generate` gives them. An answer is a text
        (tokenised, then ended by the model's end-of-answer token) or token ids as `answer_ids` gives
        them (taken as they are). Differentiable, for `metavlm harden` (kind count).

        Raises:
            ParameterError: This model gives another kind of answer, or is an encoder-decoder or
                PaliGemma (whose answer tokens attend otherwise than its prompt's).
        """
        import torch

        self._trains('count')
        family = self.chat.model_type
        if not self._teacher_forces():
            raise ParameterError(f'{self.model_path}: hardening does not take {family} models yet')
        inputs = self.chat.prompt_inputs(frames, [self.asked.question] * len(frames))
        end = self._end_tokens()[:1]
        rows = [
            self.chat.tokenizer(a, add_special_tokens=False)['input_ids'] + end
            if isinstance(a, str)
            else list(a)
            for a in answers
        ]
        logits, labels = self._teacher_forced(inputs, rows)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def _teacher_forces(self) -> bool:
        # An encoder-decoder's or PaliGemma's answer tokens attend otherwise than its prompt's.
        encoder_decoder = getattr(self.chat.model.config, 'is_encoder_decoder', False)
        return not encoder_decoder and self.chat.model_type != 'paligemma'

    def _end_tokens(self) -> list[int]:
        end = self.chat.model.generation_config.eos_token_id
        return [] if end is None else list(end) if isinstance(end, list) else [end]

    def _teacher_forced(self, inputs: dict[str, Any], rows: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        """The logits that predict each answer's tokens (rows of token ids, one a prompt of `inputs`)
        after its prompt, and their labels (-100 past an answer's end): (rows, width, vocabulary) and
        (rows, width)."""
        import torch

        model, tokenizer = self.chat.model, self.chat.tokenizer
        width = max(map(len, rows))
        answer = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            answer[i, : len(row)] = labels[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
        answer, labels = answer.to(self.chat.device), labels.to(self.chat.device)
        inputs = dict(inputs)
        inputs['input_ids'] = torch.cat([inputs['input_ids'], answer], dim=1)
        inputs['attention_mask'] = torch.cat([inputs['attention_mask'], (labels != -100).long()], dim=1)
        for key in ('token_type_ids', 'mm_token_type_ids'):  # the answer's tokens are text
            if key in inputs:
                inputs[key] = torch.cat([inputs[key], torch.zeros_like(answer)], dim=1)
        # generate() numbers positions from the attention mask (left padding; Qwen2-VL's 3-D rope):
        # teacher forcing must see the answer where generation puts it.
        if 'position_ids' in inspect.signature(model.forward).parameters:
            inputs['position_ids'] = model._prepare_position_ids_for_generation(inputs['input_ids'], inputs)
        keep = {'logits_to_keep': width + 1} if self.chat.last_logits_only else {}
        # The logits at the prompt's last position and the answer's predict the answer's tokens.
        return model(**inputs, **keep).logits[:, -(width + 1) : -1].float(), labels

    @property
    def pixel_scores(self) -> Callable[[Any], Any] | None:
        """The model's answer as a function of frames' pixels that torch differentiates, (N, classes);
        None where the pixels cannot reach the model differentiably here.

        Kind confidence: `predict`'s confidences, each from a whole prefill (as Qwen2-VL's are). Kind
        count: the log-probability of the model's own answer, in every class's column (BLIP's,
        models/backends/blip.py, says why the whole answer's), for a model teacher forcing scores as it
        generates (answer_loss's; not PaliGemma). The frames' pixels must be what the model sees:
        an image processor PixelPath follows (one resized, cropped frame: LLaVA-1.5's CLIP processor,
        PaliGemma's SigLIP one, Gemma 3's without pan-and-scan, PIL or torchvision), Qwen2-VL's
        dynamic-resolution patches (QwenPixelPath; Qwen2.5-VL and Qwen3-VL use it too) or Idefics3's
        tiles (Idefics3PixelPath, SmolVLM's, PIL or torchvision) or LLaVA-OneVision's AnyRes tiles
        (AnyResPixelPath, PIL). Gemma 3's pan-and-scan crops, LLaVA-OneVision's torchvision processor
        and kind detection have no such path: those are mapped by occlusion.
        """
        processor = self.chat.processor
        path = (
            PixelPath.from_processor(processor, GRADIENT_PROCESSORS, GRADIENT_TORCHVISION_PROCESSORS)
            or QwenPixelPath.from_processor(processor)
            or Idefics3PixelPath.from_processor(processor)
            or AnyResPixelPath.from_processor(processor)
        )
        # A count is scored by teacher forcing its answer; a confidence by one prefill of each question.
        encoder_decoder = getattr(self.chat.model.config, 'is_encoder_decoder', False)
        scored = {'count': self._teacher_forces(), 'confidence': not encoder_decoder}
        if path is None or not scored.get(self.kind, False):
            return None
        score = self._answer_log_probability if self.kind == 'count' else self._confidences
        return partial(score, path)

    def _pixel_inputs(self, path: DifferentiablePath, pixels: Any, questions: Sequence[str]) -> Any:
        """The prompt batch of every frame of `pixels` with every question (frame-major), whose pixel
        values are the path's, differentiable in `pixels`."""
        count = len(pixels)
        values = path.differentiable_pixel_values(pixels.to(self.chat.device), self.chat.dtype)
        # The prompt's tokens (how many image tokens: fixed, or by the frame's size for Qwen2-VL) from
        # the frames as whole numbers; the pixel values the model sees are the differentiable ones.
        frames = list(pixels.detach().round().clamp(0, 255).byte().permute(0, 2, 3, 1).cpu().numpy())
        asked = [(frame, question) for frame in frames for question in questions]
        inputs = self.chat.prompt_inputs([f for f, _ in asked], [q for _, q in asked])
        # Each frame's values once for each of its questions: whole frames or (Qwen2-VL) its patches.
        values = values.unflatten(0, (count, -1)).repeat_interleave(len(questions), dim=0).flatten(0, 1)
        if tuple(inputs['pixel_values'].shape) != tuple(values.shape):
            raise ModelError(
                f'{self.model_path}: the processor gives pixel values {tuple(inputs["pixel_values"].shape)}, '
                f'the differentiable path {tuple(values.shape)}'
            )
        inputs['pixel_values'] = values
        return inputs

    def _confidences(self, path: DifferentiablePath, pixels: Any) -> Any:
        """Each frame's P(yes) / (P(yes) + P(no)) per class from its differentiable pixel values, one
        whole prefill per (frame, class)."""
        inputs = self._pixel_inputs(path, pixels, self.asked.questions)
        keep = {'logits_to_keep': 1} if self.chat.last_logits_only else {}
        logits = self.chat.model(**inputs, **keep).logits[:, -1, :]
        return self.chat.yes_share(logits).reshape(len(pixels), len(self.classes))

    def _answer_log_probability(self, path: DifferentiablePath, pixels: Any) -> Any:
        """Each frame's greedy answer from its differentiable pixel values, and the sum of its tokens'
        log-probabilities (its end token included where it ended) by teacher forcing."""
        import torch

        inputs = self._pixel_inputs(path, pixels, [self.asked.question])
        with torch.no_grad():
            prompt = {k: v.detach() if k == 'pixel_values' else v for k, v in inputs.items()}
            output = self.chat.model.generate(
                **prompt,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=self.chat.tokenizer.pad_token_id,
            )
        ends, rows = set(self._end_tokens()), []
        for answer in output[:, inputs['input_ids'].shape[1] :].tolist():
            # The answer is its tokens up to its end token; after it, generate pads.
            stop = next((i for i, token in enumerate(answer) if token in ends), None)
            rows.append(answer if stop is None else answer[: stop + 1])
        logits, labels = self._teacher_forced(inputs, rows)
        chosen = torch.log_softmax(logits, dim=-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        total = (chosen * (labels != -100)).sum(dim=1)
        return total[:, None].expand(len(pixels), len(self.classes))

    def _trains(self, kind: str) -> None:
        if self.kind != kind:
            raise ParameterError(f'{self.model_path}: a kind {self.kind} model has no {kind} to train')

    def weights_hash(self) -> str:
        if self._hash is None:
            self._hash = weights_hash(self.model_path, length=64)
        return self._hash

    def identity(self) -> dict[str, Any]:
        """The loaded model's own account of itself (models/generative.py ChatModel.identity)."""
        return self.chat.identity()

    @classmethod
    def build_tiny(cls, directory: Path, *, family: str = 'idefics3', **variant: Any) -> None:
        """A tiny random-weight VLM of a real family (models/tiny_families.py FAMILIES, and
        TASK_PROMPT_FAMILIES: Florence-2)."""
        from metavlm_ros.models.tiny_families import build_tiny_vlm

        build_tiny_vlm(family, directory, seed=None)  # build_tiny_model seeded it

    @classmethod
    def build_base(cls, directory: Path) -> None:
        """SmolVLM-256M's shape (Idefics3), for benchmarks (models/tiny_families.py build_base_vlm)."""
        from metavlm_ros.models.tiny_families import build_base_vlm

        build_base_vlm(directory, seed=None)
