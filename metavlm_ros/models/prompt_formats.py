"""How a question about an image becomes an image-text-to-text model's input, and how its answer is
decoded: chat turns, PaliGemma's prefix, Florence-2's task prompt (one declaration each)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    'CHAT_TEMPLATE',
    'FAMILY_PROMPT_FORMATS',
    'FLORENCE2_TASK',
    'PALIGEMMA_PREFIX',
    'PromptFormat',
    'family_prompt_format',
    'prompt_format_of',
]

_EVERY_KIND = ('count', 'confidence', 'detection')


@dataclass(frozen=True)
class PromptFormat:
    """One way of asking an image-text-to-text model.

    Attributes:
        name: what the model's identity records as its prompt_format.
        kinds: the prediction kinds a model asked this way gives.
        chat: the question is a user turn holding the image, rendered by the processor's chat
            template; otherwise the processor's text is `prefix` + the question.
        prefix: put before the question where there are no chat turns.
        tokenizer_specials: the tokenizer adds its own special tokens (<bos>) to the text; off where
            the processor frames the text itself (Florence2Processor: '<image>...<s>text</s>').
        keeps_special_tokens: answers are decoded with their special tokens (Florence-2 writes its
            boxes in `<loc_N>` tokens), only padding and the <s> ... </s> around an answer dropped.
    """

    name: str
    kinds: tuple[str, ...] = _EVERY_KIND
    chat: bool = True
    prefix: str = ''
    tokenizer_specials: bool = True
    keeps_special_tokens: bool = False

    def decode(self, tokenizer: Any, answers: Sequence[Sequence[int]]) -> list[str]:
        """Generated token ids (one answer a row) as text, stripped: special tokens skipped, or, where
        the format keeps them, kept but for padding and the <s> and </s> around an answer."""
        if not self.keeps_special_tokens:
            texts = tokenizer.batch_decode(answers, skip_special_tokens=True)
        else:
            around = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
            rows = [[token for token in row if token not in around] for row in answers]
            texts = tokenizer.batch_decode(rows, skip_special_tokens=False)
        return [text.strip() for text in texts]


#: A chat VLM's own template: one user turn holding the image, then the generation prompt.
CHAT_TEMPLATE = PromptFormat('chat_template')

#: PaliGemma without a chat template (as Google releases it): '<image>' + question, which
#: PaliGemmaProcessor turns into image tokens, <bos>, the question and '\n'.
PALIGEMMA_PREFIX = PromptFormat('paligemma-prefix', chat=False, prefix='<image>')

#: Florence-2: the question is a task prompt ('<OPEN_VOCABULARY_DETECTION>trash', '<OD>') that
#: Florence2Processor turns into its sentence ('Locate trash in the image.') framed by image tokens,
#: <s> and </s>; its answers are boxes (kind detection), never yes/no or counts.
FLORENCE2_TASK = PromptFormat(
    'florence2-task', kinds=('detection',), chat=False, tokenizer_specials=False, keeps_special_tokens=True
)

#: The families asked in a format of their own whatever their processor holds, by config.json's
#: model_type.
FAMILY_PROMPT_FORMATS: dict[str, PromptFormat] = {'florence2': FLORENCE2_TASK}


def family_prompt_format(model_type: str) -> PromptFormat:
    """The format a family is asked in as far as its model type tells (before anything loads): its
    own, or chat turns."""
    return FAMILY_PROMPT_FORMATS.get(model_type, CHAT_TEMPLATE)


def prompt_format_of(model_type: str, processor: Any) -> PromptFormat | None:
    """The format a loaded model is asked in: its family's own, else chat turns where the processor
    has a chat template, else PaliGemma's prefix for a PaliGemmaProcessor; None where none applies."""
    if model_type in FAMILY_PROMPT_FORMATS:
        return FAMILY_PROMPT_FORMATS[model_type]
    if getattr(processor, 'chat_template', None):
        return CHAT_TEMPLATE
    if type(processor).__name__ == 'PaliGemmaProcessor':
        return PALIGEMMA_PREFIX
    return None
