"""Any image-text-to-text checkpoint with a chat template (or PaliGemma's prefix, Florence-2's task prompt):
batched greedy answers and yes/no probabilities."""

from __future__ import annotations

import hashlib
import inspect
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from metavlm_ros.common.errors import ModelError
from metavlm_ros.common.images import check_frame
from metavlm_ros.models.image_processors import input_side, load_image_processor
from metavlm_ros.models.prompt_formats import prompt_format_of

__all__ = ['ANSWER_WORDS', 'PIXEL_SETTINGS', 'PREFIX_FAMILIES', 'ChatModel']

#: Model types whose yes/no questions run after one cached prefill of the frame's image: causal
#: attention over the text after the image (PaliGemma attends both ways over its whole prefix, the
#: question included; Qwen2-VL keeps its 3-D rope offsets on the model between calls), each proven
#: equal to whole prefills by test/models/test_generative.py.
PREFIX_FAMILIES = ('idefics3', 'smolvlm', 'llava', 'gemma3')

#: Processor outputs laid out by token (batch, sequence): cut with input_ids to a shared prefix.
_SEQUENCE_INPUTS = ('input_ids', 'attention_mask', 'token_type_ids', 'mm_token_type_ids')

#: The spellings of each answer word counted for it when they are one token ('yes', 'Yes', ' yes'...).
ANSWER_WORDS: dict[str, tuple[str, ...]] = {
    'yes': ('yes', 'Yes', 'YES', ' yes', ' Yes', ' YES'),
    'no': ('no', 'No', 'NO', ' no', ' No', ' NO'),
}

#: Image-processor settings that change the pixels or the image tokens a model sees; identity()
#: records those a processor has.
PIXEL_SETTINGS = (
    'do_resize',
    'size',
    'resample',
    'do_center_crop',
    'crop_size',
    'do_rescale',
    'rescale_factor',
    'do_normalize',
    'image_mean',
    'image_std',
    'do_convert_rgb',
    'do_pad',
    'min_pixels',
    'max_pixels',
    'patch_size',
    'merge_size',
    'temporal_patch_size',
    'do_image_splitting',
    'max_image_size',
    'image_grid_pinpoints',
    'max_num_patches',
    'do_pan_and_scan',
)

#: Processor attributes that set how many image tokens stand for an image.
_TOKEN_SETTINGS = (
    'image_seq_len',
    'image_seq_length',
    'num_image_tokens',
    'num_additional_image_tokens',
    'vision_feature_select_strategy',
    'vision_aspect_ratio',
    'patch_size',
)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ChatModel:
    """An `AutoModelForImageTextToText` checkpoint asked one question per frame through its chat template.

    Loads offline (local files, safetensors, no remote code). Every call is one padded batch, padded
    on the left for decoder-only models so that the last position of every row is where the answer
    starts; the processor's own image handling is used unchanged (Qwen2-VL's dynamic resolution and
    image_grid_thw, Idefics3's image splitting and pixel_attention_mask, Gemma 3's token_type_ids).

    PaliGemma has no chat turns: its prompt is a prefix (image tokens, <bos>, the task text, '\\n')
    that PaliGemmaProcessor assembles itself from text holding '<image>' tokens. A PaliGemma
    checkpoint with a chat template renders the question through it (the processor still adds the
    <bos> and '\\n'); one without (as Google's releases) is given '<image>' + question, the
    processor's documented layout, and identity() says 'paligemma-prefix' as its prompt format.

    Florence-2 is asked a task prompt, its answers keep their `<loc_N>` tokens (prompt_formats.py).

    Attributes:
        architecture: the model class that runs ('Idefics3ForConditionalGeneration', ...).
        model_type: config.model_type ('qwen2_vl', 'idefics3', ...).
        input_side: the longer side, in pixels, the processor brings an image to
            (image_processors.py `input_side`).
        prompt_format: how a question becomes the prompt and an answer is decoded
            (models/prompt_formats.py).
        last_logits_only: whether forward() takes logits_to_keep (computes only the logits asked for).
        processor: the Hugging Face processor.
        model: the Hugging Face model, in eval mode on the given device and dtype.
    """

    def __init__(
        self, model_dir: str | Path, *, device: Any, dtype: Any, image_processor: str = 'pil'
    ) -> None:
        """Load processor and model from a local directory.

        Args:
            model_dir: a local saved-model directory (config.json, safetensors weights, processor files).
            device: torch.device to run on.
            dtype: torch.dtype of the weights.
            image_processor: 'pil' or 'torchvision': which of its family's image processors the
                processor holds (models/image_processors.py load_image_processor).

        Raises:
            ModelError: the checkpoint cannot be loaded, is not image-text-to-text, or its processor has
                no chat template (PaliGemma and Florence-2 excepted, see the class docstring).
        """
        os.environ.setdefault('HF_HUB_OFFLINE', '1')  # nothing here may reach the network
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

        self.model_dir = str(model_dir)
        self.device = device
        self.dtype = dtype
        offline = {'local_files_only': True, 'trust_remote_code': False}
        verbosity = transformers.logging.get_verbosity()
        bars = transformers.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        try:
            config = transformers.AutoConfig.from_pretrained(self.model_dir, **offline)
            architectures = list(getattr(config, 'architectures', None) or [])
            # AutoModelForImageTextToText picks its class by model_type; one outside its mapping
            # (CLIP, a text-only LM) cannot be asked a question about an image.
            if config.model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
                name = architectures[0] if architectures else config.model_type
                raise ModelError(
                    f'{self.model_dir}: {name} is not an image-text-to-text model; the vlm backend needs '
                    'a checkpoint AutoModelForImageTextToText loads (a chat VLM such as SmolVLM or Qwen2-VL)'
                )
            images = load_image_processor(self.model_dir, image_processor)
            self.processor = transformers.AutoProcessor.from_pretrained(
                self.model_dir, image_processor=images, **offline
            )
            self.model = transformers.AutoModelForImageTextToText.from_pretrained(
                self.model_dir, use_safetensors=True, dtype=dtype, **offline
            )
        except (OSError, ImportError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as exc:
            raise ModelError(
                f'cannot load image-text-to-text model from {self.model_dir}: {_first_line(exc)}'
            ) from None
        finally:
            transformers.logging.set_verbosity(verbosity)
            if bars:
                transformers.logging.enable_progress_bar()
        self.architecture = type(self.model).__name__  # the class that runs, whatever the config lists
        self.model_type = str(config.model_type)
        self.tokenizer = getattr(self.processor, 'tokenizer', None)
        if self.tokenizer is None:
            raise ModelError(f'{self.model_dir}: the processor has no tokenizer')
        template = getattr(self.processor, 'chat_template', None) or None
        found = prompt_format_of(self.model_type, self.processor)
        if found is None:
            raise ModelError(
                f'{self.model_dir}: the processor has no chat template, so a question cannot be put as a '
                'chat message; add chat_template.jinja to the model directory'
            )
        self.prompt_format = found
        self.chat_template = template if isinstance(template, str) else repr(template)
        self._encoder_decoder = bool(getattr(self.model.config, 'is_encoder_decoder', False))
        # Left padding puts every row's last prompt token at the last position: the first answer token
        # is predicted there, for generate() and for one prefill alike.
        self.tokenizer.padding_side = 'right' if self._encoder_decoder else 'left'
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.to(device).eval()
        self.input_side = input_side(self.processor)
        # Only the last position's logits are needed for a yes/no answer; the whole sequence's would
        # be rows x tokens x vocabulary floats (GBs for SmolVLM's split images).
        self.last_logits_only = 'logits_to_keep' in inspect.signature(self.model.forward).parameters
        self._answer_ids: dict[str, list[int]] | None = None
        self._question_ids: dict[tuple[str, ...], list[list[int]] | None] = {}
        forward = inspect.signature(self.model.forward).parameters
        # transformers renames a forward's past_key_values to cache (5.24 warns, 5.40 removes it).
        self._cache_argument = 'cache' if 'cache' in forward else 'past_key_values'

    # -- prompts and inputs ----------------------------------------------------------------------
    def _prompt(self, question: str) -> str:
        """The question as the model's prompt text: one user turn holding the image, then the
        generation prompt (or the format's prefix and the question, where it has no chat turns)."""
        if not self.prompt_format.chat:
            return self.prompt_format.prefix + question
        messages = [{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': question}]}]
        try:
            return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # noqa: BLE001 -- jinja raises several types; all mean a bad template
            raise ModelError(
                f'{self.model_dir}: the chat template fails on a question: {_first_line(exc)}'
            ) from None

    def _inputs(self, frames: Sequence[np.ndarray], prompts: Sequence[str]) -> dict[str, Any]:
        """One padded batch: row i is prompts[i] about frames[i], through the processor, on the device."""
        import torch
        from PIL import Image

        images = [[Image.fromarray(check_frame(f, what=f'frame {i}'))] for i, f in enumerate(frames)]
        bos = self.tokenizer.bos_token
        # A template that writes <bos> itself (Gemma 3) must not get a second one from the tokenizer.
        special = self.prompt_format.tokenizer_specials and not (
            bos and prompts[:1] and prompts[0].startswith(bos)
        )
        with warnings.catch_warnings():
            # PaliGemmaProcessor builds training labels with np.array(tensor), which NumPy 2 warns about.
            warnings.filterwarnings('ignore', message='__array__ implementation', category=DeprecationWarning)
            inputs = self.processor(
                images=images,
                text=list(prompts),
                padding=True,
                padding_side=self.tokenizer.padding_side,  # explicit: a processor may keep its saved side
                return_tensors='pt',
                add_special_tokens=special,
            )
        inputs.pop('labels', None)  # PaliGemma's processor adds training labels; inference needs none
        moved = {}
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor):
                # Pixels take the model's dtype; ids, masks and grids keep their integer types.
                value = (
                    value.to(self.device, self.dtype) if value.is_floating_point() else value.to(self.device)
                )
            moved[key] = value
        return moved

    def prompt_inputs(self, frames: Sequence[np.ndarray], questions: Sequence[str]) -> dict[str, Any]:
        """The batch `generate` answers from: row i is questions[i] about frames[i] in the chat prompt,
        padded on the left for decoder-only models (on the right for encoder-decoders)."""
        return self._inputs(frames, [self._prompt(q) for q in questions])

    # -- predictions -----------------------------------------------------------------------------
    def generate(self, frames: Sequence[np.ndarray], question: str, max_new_tokens: int) -> list[str]:
        """Greedy answers to one question about each frame, in one padded batch.

        Args:
            frames: RGB uint8 frames of shape (H, W, 3); sizes may differ.
            question: the user's question (the image precedes it in the user turn).
            max_new_tokens: the most tokens an answer may have.

        Returns:
            One answer per frame: the generated tokens only, as the prompt format decodes them.
        """
        return self.prompt_format.decode(self.tokenizer, self.generate_ids(frames, question, max_new_tokens))

    def generate_ids(
        self, frames: Sequence[np.ndarray], question: str, max_new_tokens: int
    ) -> list[list[int]]:
        """The token ids `generate` decodes: per frame the generated tokens only, padding after the end
        of a shorter answer included (what hardening teaches, token for token)."""
        import torch

        if not frames:
            return []
        inputs = self.prompt_inputs(frames, [question] * len(frames))
        with torch.inference_mode():
            output = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        # Decoder-only models return the prompt followed by the answer; encoder-decoders the answer.
        answers = output if self._encoder_decoder else output[:, inputs['input_ids'].shape[1] :]
        return answers.tolist()

    def yes_probability(self, frames: Sequence[np.ndarray], questions: Sequence[str]) -> np.ndarray:
        """P(yes) / (P(yes) + P(no)) of the first answer token, for every frame and question.

        No generation: a forward pass to the first answer position for every (frame, question), all in
        one batch; the probabilities of a word's single-token spellings (answer_tokens) are summed.
        Where the questions share the prompt up to the image (see `_question_tokens`), each frame's image
        and prompt prefix go through the model once and every question continues from that cached
        prefix: the same causal computation as one whole prefill per (frame, question), with the vision
        encoder and the image tokens paid once per frame instead of once per question.

        Args:
            frames: RGB uint8 frames of shape (H, W, 3).
            questions: yes/no questions, each put to every frame.

        Returns:
            float64 array of shape (len(frames), len(questions)), values in [0, 1].

        Raises:
            ModelError: 'yes' or 'no' is not a single token in this tokenizer.
        """
        import torch

        self.answer_tokens()  # raises before any model call
        if not frames or not questions:
            return np.zeros((len(frames), len(questions)))
        prompts = [self._prompt(q) for q in questions]
        suffixes = self._question_tokens(frames[0], tuple(questions), prompts) if len(questions) > 1 else None
        with torch.inference_mode():
            if suffixes is not None:
                logits = self._logits_after_prefix(frames, prompts, suffixes)
            else:
                logits = self._logits_of_whole_prompts(frames, prompts)
            probability = self.yes_share(logits)
        return probability.cpu().double().numpy().reshape(len(frames), len(questions))

    def yes_scores(self, frames: Sequence[np.ndarray], questions: Sequence[str]) -> Any:
        """`yes_probability` as a tensor that torch differentiates (frames x questions, on the device): one
        whole prefill per (frame, question), outside inference mode, for training (`metavlm harden`)."""
        logits = self._logits_of_whole_prompts(frames, [self._prompt(q) for q in questions])
        return self.yes_share(logits).reshape(len(frames), len(questions))

    def yes_share(self, logits: Any) -> Any:
        """P(yes) / (P(yes) + P(no)) of next-token logits (rows x vocabulary), summed over the words'
        single-token spellings (answer_tokens): one value a row, differentiable."""
        import torch

        ids = self.answer_tokens()
        logp = torch.log_softmax(logits.float(), dim=-1)
        yes = torch.logsumexp(logp[:, ids['yes']], dim=-1)
        no = torch.logsumexp(logp[:, ids['no']], dim=-1)
        # P(yes) / (P(yes) + P(no)) = sigmoid(log P(yes) - log P(no)), stable when both are tiny.
        return torch.sigmoid(yes - no)

    def _logits_of_whole_prompts(self, frames: Sequence[np.ndarray], prompts: Sequence[str]) -> Any:
        """Next-token logits after each (frame, prompt), frame-major: one prefill per pair."""
        import torch

        pairs = [(frame, prompt) for frame in frames for prompt in prompts]
        inputs = self._inputs([f for f, _ in pairs], [p for _, p in pairs])
        if self._encoder_decoder:
            start = self.model.generation_config.decoder_start_token_id
            inputs['decoder_input_ids'] = torch.full((len(pairs), 1), start, device=self.device)
        keep = {'logits_to_keep': 1} if self.last_logits_only else {}
        return self.model(**inputs, **keep).logits[:, -1, :]

    def _logits_after_prefix(
        self, frames: Sequence[np.ndarray], prompts: Sequence[str], suffixes: Sequence[Sequence[int]]
    ) -> Any:
        """Next-token logits after each (frame, question), frame-major, from one cached prefix per frame.

        Every frame's first prompt goes through the processor (the image once) and loses its
        question's own tokens (`suffixes[0]`; what is left, the prefix, may differ in length from frame
        to frame where the processor tiles images); those prefixes (left-padded) are prefilled once,
        their cache repeated for every question, and the questions' own tokens (right-padded, so
        every real token keeps its distance to the image) run on it; each row's logits are read at
        its question's last token.
        """
        import torch

        inputs = self._inputs(frames, [prompts[0]] * len(frames))
        first = torch.tensor(suffixes[0], device=self.device)
        if not bool((inputs['input_ids'][:, -len(first) :] == first).all()):
            # A frame whose question tokens differ from the first frame's: whole prompts, as always.
            return self._logits_of_whole_prompts(frames, prompts)
        length = inputs['input_ids'].shape[1] - len(first)
        for key in _SEQUENCE_INPUTS:
            if key in inputs:
                inputs[key] = inputs[key][:, :length]
        output = self.model(**inputs, use_cache=True, logits_to_keep=1)
        cache = output[self._cache_argument]
        repeats = len(suffixes)
        cache.batch_repeat_interleave(repeats)
        width = max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([list(s) + [pad] * (width - len(s)) for s in suffixes], device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in suffixes], device=self.device)
        attention = torch.cat(
            [inputs['attention_mask'].repeat_interleave(repeats, dim=0), mask.repeat(len(frames), 1)], dim=1
        )
        last = torch.tensor([len(s) - 1 for s in suffixes], device=self.device).repeat(len(frames))
        output = self.model(
            input_ids=ids.repeat(len(frames), 1),
            attention_mask=attention,
            cache_position=torch.arange(length, length + width, device=self.device),
            logits_to_keep=last[:, None],
            **{self._cache_argument: cache},
        )
        return output.logits[:, 0, :]

    def _question_tokens(
        self, frame: np.ndarray, questions: tuple[str, ...], prompts: Sequence[str]
    ) -> list[list[int]] | None:
        """Each question's own token ids: what follows the start its whole prompt shares with the others'.

        Read from the processor's own tokens for `frame` (once for these questions, then remembered):
        the longest common start of the prompts' token ids, which must hold every image token and
        leave every question at least one token of its own. None where the questions cannot run after
        a shared prefix (a model outside PREFIX_FAMILIES, no known image token id, an image token
        after the shared start).
        """
        if questions in self._question_ids:
            return self._question_ids[questions]
        found = None
        image_token = next(
            (
                getattr(self.model.config, name)
                for name in ('image_token_id', 'image_token_index')
                if isinstance(getattr(self.model.config, name, None), int)
            ),
            None,
        )
        if self.model_type in PREFIX_FAMILIES and image_token is not None:
            whole = [self._inputs([frame], [p])['input_ids'][0].tolist() for p in prompts]
            length = 0
            while length < min(map(len, whole)) - 1 and len({w[length] for w in whole}) == 1:
                length += 1
            suffixes = [w[length:] for w in whole]
            if image_token in whole[0][:length] and not any(image_token in s for s in suffixes):
                found = suffixes
        self._question_ids[questions] = found
        return found

    def answer_tokens(self) -> dict[str, list[int]]:
        """The token ids counted as 'yes' and as 'no': their spellings that are one token each.

        Raises:
            ModelError: no spelling of 'yes' (or of 'no') is a single token in this tokenizer.
        """
        if self._answer_ids is None:
            found: dict[str, list[int]] = {}
            unknown = self.tokenizer.unk_token_id
            for word, spellings in ANSWER_WORDS.items():
                ids = set()
                for spelling in spellings:
                    encoded = self.tokenizer.encode(spelling, add_special_tokens=False)
                    if len(encoded) == 1 and encoded[0] != unknown:
                        ids.add(encoded[0])
                if not ids:
                    raise ModelError(
                        f'{self.model_dir}: {word!r} is not a single token in this tokenizer in any of '
                        f'{", ".join(map(repr, spellings))}; the yes/no confidence needs one token per answer'
                    )
                found[word] = sorted(ids)
            if set(found['yes']) & set(found['no']):
                raise ModelError(f'{self.model_dir}: the tokenizer gives "yes" and "no" a common token')
            self._answer_ids = found
        return {word: list(ids) for word, ids in self._answer_ids.items()}

    def identity(self) -> dict:
        """What fixes this model's answers besides its weights: architecture, processor and prompt.

        Returns:
            A JSON-serialisable dict: architecture, model_type, processor (class name),
            image_processor (class name), image_settings (the pixel-changing settings), token_settings
            (how many tokens an image becomes), prompt_format ('chat_template', 'paligemma-prefix' or
            'florence2-task'), chat_template_sha256 ('' without chat turns), input_side.
        """
        image_processor = getattr(self.processor, 'image_processor', None)
        settings = image_processor.to_dict() if image_processor is not None else {}
        return {
            'architecture': self.architecture,
            'model_type': self.model_type,
            'processor': type(self.processor).__name__,
            'image_processor': type(image_processor).__name__,
            'image_settings': {k: _plain(settings[k]) for k in PIXEL_SETTINGS if settings.get(k) is not None},
            'token_settings': {
                k: _plain(getattr(self.processor, k))
                for k in _TOKEN_SETTINGS
                if getattr(self.processor, k, None) is not None
            },
            'prompt_format': self.prompt_format.name,
            'chat_template_sha256': hashlib.sha256(self.chat_template.encode()).hexdigest()
            if self.prompt_format.chat
            else '',
            'input_side': self.input_side,
        }


def _plain(value: Any) -> Any:
    """A setting as JSON-able plain data (SizeDicts, enums and tuples become dicts, ints and lists)."""
    if isinstance(value, dict) or hasattr(value, 'items'):
        return {str(k): _plain(v) for k, v in dict(value.items()).items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):  # IntEnum resampling filters become plain ints
        if isinstance(value, kind):
            return kind(value)
    if hasattr(value, 'value'):  # enums (PIL resampling filters)
        return _plain(value.value)
    return str(value)
