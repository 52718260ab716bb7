"""What the backends ask and how answers are read: contrastive class prompts, count questions (text or
JSON answers), yes/no confidence questions and grounding questions (models/grounding.py), shared by the
in-process and served backends."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.counts import parse_counts, strip_code_fence
from metavlm_ros.models.grounding import BOX_FORMATS
from metavlm_ros.models.options import Option

__all__ = [
    'ANSWER_FORMATS',
    'DEFAULT_CLASS_PROMPTS',
    'PAPER_CLASS_PROMPTS',
    'PROMPT_PRESETS',
    'CHAT_COUNT_QUESTION',
    'CONFIDENCE_QUESTION',
    'COUNT_OPTIONS',
    'DETECTION_MAX_NEW_TOKENS',
    'JSON_COUNT_QUESTION',
    'PROMPT',
    'QUESTION_OPTIONS',
    'TABLE1_PROMPT',
    'answer_tokens',
    'check_confidence_question',
    'count_prediction',
    'count_question',
    'parse_json_counts',
]

#: CLIP's zero-shot text prompt per class (one prompt per class, docs/method.md §9).
DEFAULT_CLASS_PROMPTS: dict[str, str] = {
    'animal': 'a photo of an animal underwater',
    'vegetation': 'a photo of vegetation underwater',
    'object': 'a photo of a man-made object underwater',
    'trash': 'a photo of trash underwater',
}

#: The authors' CLIP prompts, one per category, as in their published scripts (ViT-L/14@336px, raw
#: cosine similarities; docs/models.md).
PAPER_CLASS_PROMPTS: dict[str, str] = {
    'animal': 'an underwater image containing fish, sharks, turtles, dolphins, jellyfish, and sea creatures '
    'with count',
    'vegetation': 'an underwater image containing seaweed, coral reefs, kelp, sea grass, and aquatic plants '
    'with count',
    'object': 'an underwater image containing diving equipment, ropes, nets, tools, and man-made structures '
    'with count',
    'trash': 'an underwater image containing plastic bottles, trash bags, marine debris, and garbage in '
    'water with count',
}

#: Named contrastive prompt sets: `prompts: paper` selects the authors' prompts.
PROMPT_PRESETS: dict[str, dict[str, str]] = {'default': DEFAULT_CLASS_PROMPTS, 'paper': PAPER_CLASS_PROMPTS}

#: The count prompt of the paper's Table 1, sent to BLIP and InstructBLIP.
TABLE1_PROMPT = (
    'Question: How many animals, vegetation, objects and trash are in this underwater image? '
    "Answer in the form 'Animals: <number> <kind>, ... Vegetation: <number> <kind>, ... "
    "Objects: <number> <kind>, ... Trash: <number> <kind>, ...' and write None for a category "
    'that is absent. Answer:'
)

#: Table 1's question as a chat message: the same request without the 'Question:' / 'Answer:' frame
#: that a chat template supplies itself.
CHAT_COUNT_QUESTION = (
    'How many animals, vegetation, objects and trash are in this underwater image? '
    "Answer in the form 'Animals: <number> <kind>, ... Vegetation: <number> <kind>, ... "
    "Objects: <number> <kind>, ... Trash: <number> <kind>, ...' and write None for a category "
    'that is absent.'
)

#: The count question for JSON answers; {classes} becomes the class list, {example} a JSON object of zeros.
JSON_COUNT_QUESTION = (
    'How many of each of these are in this underwater image: {classes}? '
    'Answer with only a JSON object that maps each of them to a whole number, like {example}'
)

#: The yes/no question of the generative confidence (Eqs. 3, 5, 8): {class} becomes each class's name.
CONFIDENCE_QUESTION = 'Is there {class} in this image? Answer yes or no.'

ANSWER_FORMATS = ('text', 'json')

#: The count question option, shared by every count-type backend (each has its own default).
PROMPT = Option(
    'prompt',
    str,
    None,
    "count-type models: the question (default: Table 1's, as a chat message for chat models)",
)

#: The options of every backend that counts from a generated answer.
COUNT_OPTIONS: tuple[Option, ...] = (
    PROMPT,
    Option(
        'max_new_tokens',
        int,
        40,
        'count-type models: longest answer, in tokens (kind detection: the default means 512)',
        low=1,
        high=4096,
    ),
    Option(
        'vocabularies',
        dict,
        None,
        'count-type models: words that count for a class (text answers), CLASS=WORD,WORD, e.g. '
        'trash=bottle,can',
        flag='--vocabulary',
    ),
)

#: The options of a generative backend that gives either prediction kind (in process or served).
QUESTION_OPTIONS: tuple[Option, ...] = (
    Option(
        'kind',
        str,
        'count',
        "generative models: 'count' (a question answered, parsed into counts: Eqs. 2, 4, 7), "
        "'confidence' (P(yes) of a yes/no question per class: Eqs. 3, 5, 8) or 'detection' (a "
        'grounding answer read as boxes: docs/models.md)',
        choices=('count', 'confidence', 'detection'),
    ),
    *COUNT_OPTIONS,
    Option(
        'answer_format',
        str,
        'text',
        "generative count: 'text' (Table 1's 'Animals: 2 fish ...') or 'json' ({\"animal\": 2, ...})",
        choices=ANSWER_FORMATS,
    ),
    Option(
        'confidence_question',
        str,
        None,
        f"generative confidence: the yes/no question, {{class}} for the class ('{CONFIDENCE_QUESTION}')",
    ),
    Option(
        'box_format',
        str,
        None,
        "generative detection: how answers write boxes: 'qwen2.5' (JSON bbox_2d, pixels of the "
        "model's resized input), 'qwen3' (JSON bbox_2d, 0-1000), 'paligemma' (<locYYYY><locXXXX>..., "
        "bins of 1024), 'florence2' (label<loc_X>..., bins of 1000); default: the model family's",
        choices=tuple(BOX_FORMATS),
    ),
)

#: Tokens a detection answer may take when max_new_tokens is left at its count default: a
#: Qwen2.5-VL object ({"bbox_2d": [...], "label": "..."}) takes about 30, so 40 holds one.
DETECTION_MAX_NEW_TOKENS = 512


def answer_tokens(kind: str, max_new_tokens: int) -> int:
    """The longest answer of a kind: max_new_tokens, except that its default (40, one count answer)
    means DETECTION_MAX_NEW_TOKENS for a detection answer."""
    default = next(o.default for o in COUNT_OPTIONS if o.name == 'max_new_tokens')
    return DETECTION_MAX_NEW_TOKENS if kind == 'detection' and max_new_tokens == default else max_new_tokens


def _article(name: str) -> str:
    return f'an {name}' if name[:1].lower() in 'aeiou' else f'a {name}'


def count_question(prompt: str | None, answer_format: str, classes: Sequence[str]) -> str:
    """The count question a chat model is asked: the user's, or the default for the answer format."""
    if prompt is not None:
        if not prompt.strip():
            raise ParameterError('prompt must not be empty')
        return prompt
    if answer_format == 'json':
        example = json.dumps(dict.fromkeys(classes, 0))
        return JSON_COUNT_QUESTION.format(classes=', '.join(classes), example=example)
    return CHAT_COUNT_QUESTION


def check_confidence_question(question: str | None) -> str:
    """The yes/no question template, checked: it must name the class with {class}.

    Raises:
        ParameterError: no {class} placeholder, or another placeholder.
    """
    question = CONFIDENCE_QUESTION if question is None else question
    if '{class}' not in question:
        raise ParameterError(
            f'confidence_question {question!r} has no {{class}} placeholder: the question must name the class'
        )
    try:
        question.format_map({'class': 'x'})
    except (KeyError, ValueError, IndexError) as exc:
        raise ParameterError(f'confidence_question {question!r}: bad placeholder ({exc})') from None
    return question


def class_questions(template: str, classes: Sequence[str]) -> list[str]:
    """The yes/no question of each class ('Is there an animal in this image? ...')."""
    return [template.format_map({'class': _article(c)}) for c in classes]


def parse_json_counts(text: str, classes: Sequence[str]) -> dict[str, int]:
    """Read a JSON answer {"animal": 2, ...} strictly.

    The answer must be one JSON object (a Markdown code fence around it is allowed: chat models add
    one), naming every class, and nothing else, with a whole number >= 0 each.

    Raises:
        ValueError: the reason the answer is not such an object (recorded as a parse failure).
    """
    try:
        value = json.loads(strip_code_fence(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f'not JSON ({exc.msg} at character {exc.pos})') from None
    if not isinstance(value, dict):
        raise ValueError(f'JSON {type(value).__name__}, not an object')
    missing = [c for c in classes if c not in value]
    extra = sorted(set(value) - set(classes))
    if missing or extra:
        parts = ([f'missing {", ".join(missing)}'] if missing else []) + (
            [f'unknown {", ".join(extra)}'] if extra else []
        )
        raise ValueError('; '.join(parts))
    counts = {}
    for cls in classes:
        count = value[cls]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f'{cls}: {count!r} is not a whole number >= 0')
        counts[cls] = count
    return counts


def count_prediction(
    text: str, classes: Sequence[str], answer_format: str, vocabularies: Mapping[str, Any] | None
) -> Prediction:
    """A count Prediction from an answer; a JSON answer that does not parse is a parse failure
    (Prediction.error set, no values), never zero counts."""
    text = text.strip()
    if answer_format == 'json':
        try:
            counts = parse_json_counts(text, classes)
        except ValueError as exc:
            return Prediction('count', {}, text, error=f'unparseable answer: {exc}')
    else:
        counts = parse_counts(text, classes, vocabularies)
    return Prediction('count', {c: float(counts[c]) for c in classes}, text)
