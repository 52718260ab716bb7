"""Chat VLMs' grounding answers as detections: each family's box format, to frame pixels and classes.

A grounding answer lists objects, each a label and a box, written as the model's family writes them
(BOX_FORMATS): Qwen2.5-VL's JSON `bbox_2d` in the pixels of its resized input, Qwen3-VL's JSON on a
0-1000 grid, PaliGemma's `<locYYYY><locXXXX><locYYYY><locXXXX> label` bins of 1024, Florence-2's
`label<loc_X><loc_Y><loc_X><loc_Y>` bins of 1000 (its open-vocabulary detection asked once per class).
Each box is brought to the pixels of the frame the model was given and clipped to it; each label to a
class of the vocabulary (counts.label_matcher).
An answer that does not follow its format is a parse failure (a failed evaluation), never "no
objects"; a label that names no class is left out (the answer keeps it, as a detector keeps only its
queried classes). A chat VLM states no score: every object it names scores 1.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.boxes import Detection
from metavlm_ros.method.prediction import Prediction
from metavlm_ros.models.counts import strip_code_fence

__all__ = [
    'BOX_FORMATS',
    'FAMILY_BOX_FORMATS',
    'RELEASED_QWEN_RESIZE',
    'BoxFormat',
    'QwenResize',
    'box_format_for',
    'detection_prediction',
    'family_of_model_id',
    'grounding_question',
    'grounding_questions',
    'parse_grounding',
]

# A label and a box (x1, y1, x2, y2) in the format's own units, before scaling to the frame.
Boxes = list[tuple[str, tuple[float, float, float, float]]]


@dataclass(frozen=True)
class QwenResize:
    """Qwen2-VL / Qwen2.5-VL's `smart_resize`: each side rounded to a multiple of `factor` (patch x
    merge), the area brought within [min_pixels, max_pixels] keeping the aspect ratio. The defaults
    are the released Qwen2.5-VL processor's (preprocessor_config.json: patch 14, merge 2, min_pixels
    3136, max_pixels 12845056)."""

    factor: int = 28
    min_pixels: int = 56 * 56
    max_pixels: int = 12845056

    def size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the processor resizes a frame of this size to."""
        # transformers' qwen2_vl smart_resize, step for step (Python's round: half to even).
        h_bar = round(height / self.factor) * self.factor
        w_bar = round(width / self.factor) * self.factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h_bar = max(self.factor, math.floor(height / beta / self.factor) * self.factor)
            w_bar = max(self.factor, math.floor(width / beta / self.factor) * self.factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / self.factor) * self.factor
            w_bar = math.ceil(width * beta / self.factor) * self.factor
        return w_bar, h_bar

    @classmethod
    def of_processor(cls, image_processor: Any) -> QwenResize:
        """The resize of a loaded Qwen image processor: its patch and merge sizes and pixel budget
        (min_pixels / max_pixels, or transformers 5's size {shortest_edge, longest_edge}: areas)."""
        size = dict(getattr(image_processor, 'size', None) or {})
        low = getattr(image_processor, 'min_pixels', None) or size.get('shortest_edge') or cls.min_pixels
        high = getattr(image_processor, 'max_pixels', None) or size.get('longest_edge') or cls.max_pixels
        patch = int(getattr(image_processor, 'patch_size', 14) or 14)
        merge = int(getattr(image_processor, 'merge_size', 2) or 2)
        return cls(patch * merge, int(low), int(high))


#: What a served Qwen2.5-VL resizes frames to: the released processor's settings (a server that
#: changes max_pixels moves the boxes; docs/models.md).
RELEASED_QWEN_RESIZE = QwenResize()


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_bbox_json(text: str) -> Boxes:
    """[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}, ...] (one object alone is accepted too)."""
    try:
        value = json.loads(strip_code_fence(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f'not JSON ({exc.msg} at character {exc.pos})') from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f'JSON {type(value).__name__}, not a list of objects')
    found = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f'item {index}: JSON {type(item).__name__}, not an object')
        box, label = item.get('bbox_2d'), item.get('label')
        if not isinstance(box, list) or len(box) != 4 or not all(map(_number, box)):
            raise ValueError(f'item {index}: bbox_2d {box!r} is not four numbers')
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f'item {index}: no label')
        found.append((label.strip(), tuple(float(v) for v in box)))
    return found


_PALIGEMMA_ENTRY = re.compile(r'\s*<loc(\d{4})><loc(\d{4})><loc(\d{4})><loc(\d{4})>\s*([^<>;]*?)\s*')


def _read_paligemma(text: str) -> Boxes:
    """'<locYYYY><locXXXX><locYYYY><locXXXX> label ; ...': y before x, bins of 1024 (0-1023)."""
    body = text.strip()
    if not body:
        return []  # PaliGemma lists boxes only: nothing found is an empty answer
    found = []
    for index, entry in enumerate(body.split(';')):
        match = _PALIGEMMA_ENTRY.fullmatch(entry)
        if match is None:
            shown = entry.strip()[:60]
            raise ValueError(f'entry {index} {shown!r} is not <locYYYY><locXXXX><locYYYY><locXXXX> label')
        y1, x1, y2, x2 = (int(v) for v in match.groups()[:4])
        if max(y1, x1, y2, x2) > 1023:
            raise ValueError(f'entry {index}: a location bin above 1023')
        if not match.group(5):
            raise ValueError(f'entry {index}: no label')
        found.append((match.group(5), (float(x1), float(y1), float(x2), float(y2))))
    return found


_FLORENCE_ANSWER = re.compile(r'(?:[^<]+(?:<loc_\d+>){4,})+')
_FLORENCE_PHRASE = re.compile(r'([^<]+)((?:<loc_\d+>)+)')


def _read_florence(text: str) -> Boxes:
    """'label<loc_X1><loc_Y1><loc_X2><loc_Y2>...' (x before y, bins of 1000 read at their centres),
    as Florence2Processor.post_process_generation reads its '<OD>' task."""
    body = re.sub(r'</?s>|<pad>', '', text).strip()
    if not body:
        return []  # Florence-2 lists boxes only: nothing found is an empty answer
    if _FLORENCE_ANSWER.fullmatch(body) is None:
        raise ValueError(f'{body[:60]!r} is not label<loc_X><loc_Y><loc_X><loc_Y>...')
    found = []
    for match in _FLORENCE_PHRASE.finditer(body):
        label, bins = match.group(1).strip(), [int(v) for v in re.findall(r'<loc_(\d+)>', match.group(2))]
        if len(bins) % 4 or max(bins) > 999:
            raise ValueError(f'{label!r}: locations are not whole boxes of bins 0-999')
        if not label:
            raise ValueError('a box without a label')
        for at in range(0, len(bins), 4):
            found.append((label, tuple(b + 0.5 for b in bins[at : at + 4])))
    return found


@dataclass(frozen=True)
class BoxFormat:
    """How a family writes boxes: the question that asks for them, how an answer reads, and the
    scale (sx, sy) of its units to a frame's pixels.

    Attributes:
        name: the `box_format` option's value.
        units: what the numbers mean, for docs and messages.
        question: the default question; {classes} becomes the classes joined by `joiner`; one with
            {class} is asked once per class (grounding_questions).
        joiner: how the classes are listed in the question.
        read: an answer -> (label, box in units) per object; raises ValueError with the reason.
        scale: (frame width, height, Qwen resize) -> (sx, sy).
    """

    name: str
    units: str
    question: str
    joiner: str
    read: Callable[[str], Boxes]
    scale: Callable[[int, int, QwenResize], tuple[float, float]]


def _input_scale(width: int, height: int, resize: QwenResize) -> tuple[float, float]:
    resized_width, resized_height = resize.size(width, height)
    return width / resized_width, height / resized_height


#: Every box format, by the name `box_format` takes.
BOX_FORMATS: dict[str, BoxFormat] = {
    f.name: f
    for f in (
        # Qwen2.5-VL cookbook (spatial understanding): 'Outline the position of each ... and output
        # all the coordinates in JSON format.'
        BoxFormat(
            'qwen2.5',
            "JSON bbox_2d, pixels of the model's resized input",
            'Outline the position of each {classes} in this underwater image and output all the '
            'coordinates in JSON format, with its kind as the label; output [] if there is none.',
            ', ',
            _read_bbox_json,
            _input_scale,
        ),
        # Qwen3-VL cookbook (2D grounding): relative coordinates on a 0-1000 grid.
        BoxFormat(
            'qwen3',
            'JSON bbox_2d, 0-1000 grid',
            'Locate every instance that belongs to the following categories: "{classes}". Report bbox '
            'coordinates in JSON format; report [] if there is none.',
            ', ',
            _read_bbox_json,
            lambda width, height, resize: (width / 1000, height / 1000),
        ),
        # PaliGemma's detection prefix: 'detect cat ; dog'.
        BoxFormat(
            'paligemma',
            '<locYYYY><locXXXX><locYYYY><locXXXX> label, bins of 1024',
            'detect {classes}',
            ' ; ',
            _read_paligemma,
            lambda width, height, resize: (width / 1024, height / 1024),
        ),
        # Florence-2's open-vocabulary detection task, one class a prompt: it answers with the phrase
        # it was given as every box's label ('<OD>' names its own categories instead: docs/models.md).
        BoxFormat(
            'florence2',
            'label<loc_X><loc_Y><loc_X><loc_Y>, bins of 1000',
            '<OPEN_VOCABULARY_DETECTION>{class}',
            ', ',
            _read_florence,
            lambda width, height, resize: (width / 1000, height / 1000),
        ),
    )
}

#: The box format of each model family (config.json's model_type) that grounds in one.
FAMILY_BOX_FORMATS: dict[str, str] = {
    'qwen2_5_vl': 'qwen2.5',
    'qwen3_vl': 'qwen3',
    'qwen3_vl_moe': 'qwen3',
    'paligemma': 'paligemma',
    'florence2': 'florence2',
}

# A served model is known by its id only: the family its name says ('Qwen/Qwen2.5-VL-7B-Instruct',
# Ollama's 'qwen2.5vl:7b').
_MODEL_ID_FAMILIES = (
    (re.compile(r'qwen2\.?5[-_ ]?vl', re.IGNORECASE), 'qwen2_5_vl'),
    (re.compile(r'qwen3[-_ ]?vl', re.IGNORECASE), 'qwen3_vl'),
    (re.compile(r'paligemma', re.IGNORECASE), 'paligemma'),
    (re.compile(r'florence[-_ ]?2', re.IGNORECASE), 'florence2'),
)


def family_of_model_id(model_id: str) -> str:
    """The family a served model's id names ('' when it names none of FAMILY_BOX_FORMATS')."""
    return next((family for pattern, family in _MODEL_ID_FAMILIES if pattern.search(model_id)), '')


def box_format_for(box_format: str | None, family: str) -> str:
    """The box format asked for, else the family's.

    Raises:
        ParameterError: none given and the family has none.
    """
    if box_format is not None:
        return box_format
    if family in FAMILY_BOX_FORMATS:
        return FAMILY_BOX_FORMATS[family]
    raise ParameterError(
        f'box_format: no default for a model of family {family or "unknown"!r}; name how its answers '
        f'write boxes: {", ".join(BOX_FORMATS)}'
    )


def grounding_question(prompt: str | None, box_format: str, classes: Sequence[str]) -> str:
    """The grounding question a chat model is asked: the user's, or the format's default (with {class}
    where it is asked once per class)."""
    if prompt is not None:
        if not prompt.strip():
            raise ParameterError('prompt must not be empty')
        return prompt
    form = BOX_FORMATS[box_format]
    return form.question.replace('{classes}', form.joiner.join(classes))


def grounding_questions(question: str, classes: Sequence[str]) -> list[str]:
    """What each frame is asked: a question holding {class} once per class (the class's name in its
    place, in class order), any other question once."""
    if '{class}' not in question:
        return [question]
    return [question.replace('{class}', cls) for cls in classes]


def parse_grounding(
    text: str,
    box_format: str,
    size: tuple[int, int],
    match: Callable[[str], str | None],
    resize: QwenResize = RELEASED_QWEN_RESIZE,
) -> tuple[Detection, ...]:
    """The objects of a grounding answer, boxes in the pixels of the frame of `size` (width, height).

    Args:
        text: the answer.
        box_format: a name of BOX_FORMATS.
        size: the frame's (width, height), as the model was given it.
        match: a label -> its class, or None (counts.label_matcher).
        resize: how the model resized the frame (box format 'qwen2.5' only).

    Returns:
        One Detection (score 1) per object whose label names a class, in the answer's order.

    Raises:
        ValueError: the answer does not follow the format, or a box has no area in the frame.
    """
    form = BOX_FORMATS[box_format]
    width, height = size
    sx, sy = form.scale(width, height, resize)
    found = []
    for index, (label, (x1, y1, x2, y2)) in enumerate(form.read(text)):
        box = (
            min(max(x1 * sx, 0.0), width),
            min(max(y1 * sy, 0.0), height),
            min(max(x2 * sx, 0.0), width),
            min(max(y2 * sy, 0.0), height),
        )
        if not (box[0] < box[2] and box[1] < box[3]):
            raise ValueError(
                f'object {index} ({label!r}): box {[x1, y1, x2, y2]} has no area in the {width}x{height} '
                'frame'
            )
        cls = match(label)
        if cls is not None:
            found.append(Detection(cls, 1.0, box))
    return tuple(found)


def detection_prediction(
    text: str | Sequence[str],
    box_format: str,
    size: tuple[int, int],
    classes: Sequence[str],
    match: Callable[[str], str | None],
    resize: QwenResize = RELEASED_QWEN_RESIZE,
) -> Prediction:
    """A detection Prediction from a grounding answer, or from the answers to a frame's questions (one
    per class: grounding_questions), each read on its own (parse_grounding) and recorded one a line.
    One that does not parse makes a parse failure (Prediction.error set, no values), never no objects."""
    answers = [text.strip()] if isinstance(text, str) else [answer.strip() for answer in text]
    recorded = '\n'.join(answers)
    detections: list[Detection] = []
    for index, answer in enumerate(answers):
        try:
            detections.extend(parse_grounding(answer, box_format, size, match, resize))
        except ValueError as exc:
            which = f'answer {index}: ' if len(answers) > 1 else ''
            return Prediction('detection', {}, recorded, error=f'unparseable answer: {which}{exc}')
    values: Mapping[str, float] = {c: float(sum(d.cls == c for d in detections)) for c in classes}
    return Prediction('detection', dict(values), recorded, tuple(detections))
