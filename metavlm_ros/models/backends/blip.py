"""BLIP and InstructBLIP: the Table 1 question, greedy answers parsed into per-class counts (Eq. 2)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.counts import parse_counts
from metavlm_ros.models.hf import HFBackend
from metavlm_ros.models.pixel_path import PixelPath
from metavlm_ros.models.questions import COUNT_OPTIONS, TABLE1_PROMPT, count_prediction
from metavlm_ros.models.registry import register

__all__ = ['BlipBackend', 'CountBackend', 'InstructBlipBackend']


class CountBackend(HFBackend):
    """Generative VLMs asked the Table 1 prompt; the greedy answer is parsed into per-class counts."""

    kinds = ('count',)
    options = COUNT_OPTIONS

    def __init__(
        self,
        model: str,
        *,
        prompt: str | None,
        max_new_tokens: int,
        vocabularies: Mapping[str, Sequence[str]] | None,
        **common: Any,
    ) -> None:
        prompt = TABLE1_PROMPT if prompt is None else prompt
        if not prompt.strip():
            raise ParameterError('prompt must not be empty')
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.vocabularies = dict(vocabularies) if vocabularies else None
        # Validates the vocabularies against the classes before the (slow) model load.
        parse_counts('', common['classes'], self.vocabularies)
        super().__init__(model, **common)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> None:
        if options['prompt'] is not None and not options['prompt'].strip():
            raise ParameterError('prompt must not be empty')
        parse_counts('', options['classes'], options['vocabularies'])

    def _answer_ids(self, inputs: dict[str, Any], output: Any) -> Any:
        """The generated tokens that are the answer, without any echoed prompt."""
        return output

    def _prepare(self) -> None:
        from PIL import Image

        # The prompt's tokens do not depend on the frame: tokenised once, repeated for every batch.
        side = self.input_size or 32
        inputs = self._inputs(images=[Image.new('RGB', (side, side))], text=[self.prompt])
        inputs.pop('pixel_values')
        self._text = inputs

    def _predict_batch(self, images: dict[str, Any]) -> list[Prediction]:
        n = images['pixel_values'].shape[0]
        inputs = {k: v.repeat(n, *[1] * (v.dim() - 1)) for k, v in self._text.items()}
        inputs.update(images)
        output = self.model.generate(
            **inputs, max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1
        )
        texts = self.processor.batch_decode(self._answer_ids(inputs, output), skip_special_tokens=True)
        return [count_prediction(text, self.classes, 'text', self.vocabularies) for text in texts]


@register
class BlipBackend(CountBackend):
    """BLIP captioning (prompt-conditioned) or, when the checkpoint says so, BLIP question answering."""

    name = 'blip'

    def _processor_class(self, transformers: Any) -> Any:
        return transformers.BlipProcessor

    def _model_class(self, transformers: Any) -> Any:
        config = transformers.AutoConfig.from_pretrained(self.model_path, local_files_only=True)
        if 'BlipForQuestionAnswering' in (config.architectures or ()):
            return transformers.BlipForQuestionAnswering
        return transformers.BlipForConditionalGeneration

    def _answer_ids(self, inputs: dict[str, Any], output: Any) -> Any:
        # The captioner continues the prompt: its output repeats the prompt less the final [SEP].
        if self.model.__class__.__name__ == 'BlipForConditionalGeneration':
            return output[:, inputs['input_ids'].shape[1] - 1 :]
        return output

    def _captions(self) -> bool:
        return self.model.__class__.__name__ == 'BlipForConditionalGeneration'

    def _answer_batch(self, rows: Sequence[Sequence[int]]) -> tuple[Any, Any, Any]:
        """Teacher forcing's input ids, attention mask and labels for answers given as token ids (each
        ended by [SEP] where the answer ended), in the layout `generate` decodes in: the decoder's
        start token, the prompt, the answer; labels only on the answer's tokens."""
        import torch

        tokenizer = self.processor.tokenizer
        prefix = [self.model.config.text_config.bos_token_id]
        prefix += tokenizer(self.prompt, add_special_tokens=False)['input_ids']
        width = len(prefix) + max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(prefix) + len(row)] = torch.tensor([*prefix, *row])
            labels[i, len(prefix) : len(prefix) + len(row)] = torch.tensor(list(row))
        attention = (labels != -100) | (torch.arange(width)[None, :] < len(prefix))
        return ids.to(self.device), attention.long().to(self.device), labels.to(self.device)

    def answer_loss(self, images: dict[str, Any], answers: Sequence[str]) -> Any:
        """The mean cross-entropy of `answers` (one a frame) given the frames and the prompt, by teacher
        forcing in the layout `generate` decodes in (the prompt after the decoder's start token, the
        answer ended by [SEP]): differentiable, for `metavlm harden` (BLIP captioning checkpoints).

        Raises:
            ParameterError: A question-answering checkpoint (its answers are decoded by a second text
                model this does not train).
        """
        if not self._captions():
            raise ParameterError(f'{self.model_path}: hardening takes BLIP captioning checkpoints only')
        tokenizer = self.processor.tokenizer
        rows = [
            tokenizer(a, add_special_tokens=False)['input_ids'] + [tokenizer.sep_token_id] for a in answers
        ]
        ids, attention, labels = self._answer_batch(rows)
        output = self.model(
            pixel_values=images['pixel_values'], input_ids=ids, attention_mask=attention, labels=labels
        )
        return output.loss

    @property
    def pixel_scores(self) -> Callable[[Any], Any] | None:
        """The log-probability of the model's own answer as a function of frames' pixels that torch
        differentiates, in every class's column; None for a question-answering checkpoint (its answer
        comes from a second text model) or an image processor PixelPath does not follow.

        The function takes frames as a float tensor (N, 3, H, W) of 0..255 values and gives (N, classes).
        Each frame's pixels reach the model through `PixelPath.differentiable_pixel_values`; from those
        same pixel values the model answers greedily (as `predict` does, without gradient) and the
        answer's tokens, its [SEP] included where it ended, are scored by teacher forcing: the sum of
        their log-probabilities (answer_loss's cross-entropy times their number, for a whole answer).
        Every class gets the whole answer's number: a class's count is read from words anywhere in the
        answer (its section header, a number before its kind, a 'None' or a caption's other words),
        so no span of tokens is its part alone, and a class the answer leaves out would have none.
        """
        path = PixelPath.from_processor(self.processor)
        if path is None or not self._captions():
            return None
        return partial(self._answer_log_probability, path)

    def _answer_log_probability(self, path: PixelPath, pixels: Any) -> Any:
        import torch

        values = path.differentiable_pixel_values(pixels.to(self.device), self.dtype)
        count = len(values)
        with torch.no_grad():
            inputs = {k: v.clone().repeat(count, *[1] * (v.dim() - 1)) for k, v in self._text.items()}
            inputs['pixel_values'] = values.detach()
            output = self.model.generate(
                **inputs, max_new_tokens=self.max_new_tokens, do_sample=False, num_beams=1
            )
        end = self.processor.tokenizer.sep_token_id
        rows = []
        for answer in self._answer_ids(inputs, output).tolist():
            # The answer is its tokens up to its [SEP]; after it, generate pads.
            rows.append(answer[: answer.index(end) + 1] if end in answer else answer)
        ids, attention, labels = self._answer_batch(rows)
        logits = self.model(pixel_values=values, input_ids=ids, attention_mask=attention).logits
        # Position t predicts token t + 1.
        targets = labels[:, 1:]
        chosen = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, targets.clamp(min=0)[..., None])
        total = (chosen[..., 0] * (targets != -100)).sum(dim=1)
        return total[:, None].expand(count, len(self.classes))

    @classmethod
    def build_tiny(cls, directory: Path, **variant: Any) -> None:
        from transformers import BlipConfig, BlipForConditionalGeneration, BlipProcessor

        from metavlm_ros.models import tiny

        tokenizer = tiny.bert_tokenizer()
        config = BlipConfig(
            text_config=tiny.blip_text(
                tokenizer, **tiny.text_shape(), encoder_hidden_size=tiny.HIDDEN, max_position_embeddings=512
            ),
            vision_config=tiny.vision_shape(),
            projection_dim=16,
        )
        BlipForConditionalGeneration(config).save_pretrained(directory, safe_serialization=True)
        BlipProcessor(image_processor=tiny.blip_image_processor(), tokenizer=tokenizer).save_pretrained(
            directory
        )

    @classmethod
    def build_base(cls, directory: Path) -> None:
        """Salesforce/blip-image-captioning-base's shape (ViT-B/16 at 384 px, BERT-base decoder)."""
        from transformers import BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

        from metavlm_ros.models import tiny

        tokenizer = tiny.bert_tokenizer()
        # BlipConfig's defaults are BLIP base's: ViT-B/16 at 384 px, BERT-base text decoder.
        model = BlipForConditionalGeneration(
            BlipConfig(text_config=tiny.blip_text(tokenizer, vocab_size=30524))
        )
        model.save_pretrained(directory, safe_serialization=True)
        BlipProcessor(image_processor=BlipImageProcessor(), tokenizer=tokenizer).save_pretrained(directory)


@register
class InstructBlipBackend(CountBackend):
    """InstructBLIP: the Q-Former and the language model both see the prompt."""

    name = 'instructblip'
    # A 7B-class language model (Vicuna) would need ~30 GB in float32 on a GPU.
    half_on_gpu = True

    def _processor_class(self, transformers: Any) -> Any:
        return transformers.InstructBlipProcessor

    def _model_class(self, transformers: Any) -> Any:
        return transformers.InstructBlipForConditionalGeneration

    def _answer_ids(self, inputs: dict[str, Any], output: Any) -> Any:
        # A decoder-only language model (Vicuna) echoes its input ids; an encoder-decoder (Flan-T5) does not.
        if self.model.config.text_config.is_encoder_decoder:
            return output
        return output[:, inputs['input_ids'].shape[1] :]

    @classmethod
    def build_tiny(cls, directory: Path, *, language_model: str = 'llama', **variant: Any) -> None:
        """A tiny InstructBLIP whose language model is decoder-only like Vicuna ('llama') or an
        encoder-decoder like Flan-T5 ('t5')."""
        from transformers import (
            InstructBlipConfig,
            InstructBlipForConditionalGeneration,
            InstructBlipProcessor,
        )

        from metavlm_ros.models import tiny

        if language_model not in ('llama', 't5'):
            raise ParameterError(f"language_model must be 'llama' or 't5', got {language_model!r}")
        num_query_tokens = 4
        processor = InstructBlipProcessor(
            image_processor=tiny.blip_image_processor(),
            tokenizer=tiny.t5_tokenizer() if language_model == 't5' else tiny.llama_tokenizer(),
            qformer_tokenizer=tiny.bert_tokenizer(),
            num_query_tokens=num_query_tokens,
        )
        tokenizer, qformer_tokenizer = processor.tokenizer, processor.qformer_tokenizer
        qformer = {
            'vocab_size': len(qformer_tokenizer),
            **tiny.text_shape(),
            'encoder_hidden_size': tiny.HIDDEN,
            'max_position_embeddings': 512,
            'pad_token_id': qformer_tokenizer.pad_token_id,
        }
        config = InstructBlipConfig(
            vision_config=tiny.vision_shape(),
            qformer_config=qformer,
            text_config=tiny.language_model(language_model, tokenizer),
            num_query_tokens=num_query_tokens,
            image_token_index=tokenizer.convert_tokens_to_ids('<image>'),
        )
        InstructBlipForConditionalGeneration(config).save_pretrained(directory, safe_serialization=True)
        processor.save_pretrained(directory)
