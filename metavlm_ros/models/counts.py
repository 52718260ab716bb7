"""Parse a count-type VLM's answer (Table 1 format or a free caption) into per-class object counts."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from metavlm_ros.common.errors import ParameterError
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'DEFAULT_VOCABULARIES',
    'NUMBER_WORDS',
    'SECTION_ALIASES',
    'label_matcher',
    'parse_counts',
    'strip_code_fence',
]


#: Words read as quantities. 'a'/'an' count one; vague quantities ('few', 'several', 'many' ...)
#: count three and 'a couple'/'pair'/'multiple' two, so that a changed vague answer still changes
#: the count; 'no', 'none', 'zero' and 'without' count zero.
NUMBER_WORDS: dict[str, int] = {
    'zero': 0, 'no': 0, 'none': 0, 'without': 0, 'nothing': 0,
    'a': 1, 'an': 1, 'one': 1, 'single': 1, 'lone': 1,
    'two': 2, 'three': 3, 'four': 4, 'five': 5, 'six': 6, 'seven': 7, 'eight': 8, 'nine': 9,
    'ten': 10, 'eleven': 11, 'twelve': 12, 'thirteen': 13, 'fourteen': 14, 'fifteen': 15,
    'sixteen': 16, 'seventeen': 17, 'eighteen': 18, 'nineteen': 19, 'twenty': 20,
    'couple': 2, 'pair': 2, 'multiple': 2, 'dozen': 12,
    'few': 3, 'several': 3, 'many': 3, 'numerous': 3, 'lots': 3,
}  # fmt: skip

# Words that deny presence; an item made only of these counts zero.
_NEGATIONS = frozenset({'no', 'none', 'zero', 'without', 'nothing', 'absent', 'null'})
# Articles count one only when a kind follows; a dangling article is not a number.
_ARTICLES = frozenset({'a', 'an'})
# A quantity applies to a kind at most this many words later ('two small yellow fish').
_WINDOW = 3

#: Default vocabulary of kinds per class, singular forms; plurals are derived ('fish' also matches
#: 'fishes', 'bottle' 'bottles', 'jellyfish' 'jellyfishes', 'tyre' 'tyres').
DEFAULT_VOCABULARIES: dict[str, tuple[str, ...]] = {
    'animal': (
        'animal', 'fish', 'crab', 'starfish', 'sea star', 'jellyfish', 'octopus', 'squid', 'shrimp',
        'lobster', 'eel', 'shark', 'ray', 'stingray', 'turtle', 'seal', 'dolphin', 'whale', 'urchin',
        'sea urchin', 'sea cucumber', 'anemone', 'sea anemone', 'sponge', 'coral', 'mussel', 'oyster',
        'clam', 'scallop', 'snail', 'shell', 'seahorse', 'diver', 'bird', 'creature',
    ),
    'vegetation': (
        'vegetation', 'plant', 'seaweed', 'seagrass', 'sea grass', 'kelp', 'algae', 'alga', 'weed',
        'grass', 'moss', 'leaf', 'posidonia',
    ),
    'object': (
        'object', 'pipe', 'pipeline', 'box', 'rov part', 'rov', 'robot', 'rope', 'anchor', 'chain',
        'cable', 'wire', 'pole', 'post', 'block', 'brick', 'tool', 'propeller', 'hose', 'buoy',
        'wreck', 'boat', 'ship', 'frame', 'cage', 'crate', 'container', 'barrel', 'pillar', 'structure',
    ),
    'trash': (
        'trash', 'litter', 'debris', 'garbage', 'waste', 'rubbish', 'bottle', 'plastic bottle',
        'glass bottle', 'can', 'tin can', 'tin', 'bag', 'plastic bag', 'tyre', 'tire', 'net',
        'fishing net', 'cup', 'plastic', 'wrapper', 'packaging', 'straw', 'lid', 'cap', 'glove',
        'mask', 'shoe', 'jar', 'carton', 'plastic piece', 'piece of plastic',
    ),
}  # fmt: skip

#: Section headers of the Table 1 answer format, by class (singular and plural are both accepted;
#: any class's own name, singular or plural, is always a header for it).
SECTION_ALIASES: dict[str, tuple[str, ...]] = {
    'animal': ('animal', 'fauna'),
    'vegetation': ('vegetation', 'plant', 'flora'),
    'object': ('object',),
    'trash': ('trash', 'litter', 'debris', 'garbage', 'waste', 'rubbish'),
}

# A word that may also be a verb ('you can see') only counts with a quantity right before it.
_NEEDS_QUANTITY = frozenset({('can',), ('tin',), ('post',), ('ray',), ('seal',)})

_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+")
# Template placeholders a model may echo ('<number> <kind>') and 'n/a' say nothing is there.
_PLACEHOLDER = re.compile(r'<[^<>]*>|\bn/a\b')
_ITEM_SPLIT = re.compile(r'[,;/&+\n]|\band\b|\bor\b|\bwith\b')


_FENCE = re.compile(r'^```(?:json)?\s*(.*?)\s*```$', re.DOTALL | re.IGNORECASE)


def strip_code_fence(text: str) -> str:
    """An answer without the Markdown code fence a chat model may put around its JSON (```json ... ```)."""
    body = (text or '').strip()
    fenced = _FENCE.match(body)
    return fenced.group(1) if fenced else body


def _plurals(word: str) -> set[str]:
    """Singular and plural forms of one word (regular English plurals, '-y', '-f', '-fe' and '-us')."""
    forms = {word, word + 's', word + 'es'}
    if word.endswith('y') and len(word) > 1 and word[-2] not in 'aeiou':
        forms.add(word[:-1] + 'ies')
    if word.endswith('f'):
        forms.add(word[:-1] + 'ves')
    if word.endswith('fe'):
        forms.add(word[:-2] + 'ves')
    if word.endswith('us'):
        forms.add(word[:-2] + 'i')
    if word.endswith('a'):
        forms.add(word + 'e')
    return forms


def _kind_table(vocabularies: Mapping[str, Sequence[str]]) -> dict[tuple[str, ...], str]:
    """Map every tokenised kind (all plural forms of its last word) to its class."""
    table: dict[tuple[str, ...], str] = {}
    for cls, words in vocabularies.items():
        for phrase in words:
            tokens = _TOKEN.findall(phrase.lower())
            if not tokens:
                continue
            for last in _plurals(tokens[-1]):
                # The first class to claim a phrase keeps it, so the order of classes breaks ties.
                table.setdefault((*tokens[:-1], last), cls)
    return table


def _quantity(token: str) -> int | None:
    if token.isdigit():
        return int(token)
    return NUMBER_WORDS.get(token)


def _scan(
    tokens: list[str], kinds: dict[tuple[str, ...], str], longest: int
) -> tuple[dict[str, int], int, bool]:
    """Count kind mentions in a token list.

    Returns:
        Counts per class of the kinds found, the sum of explicit numbers that no kind took, and whether
        any explicit quantity or negation occurred.
    """
    counts: dict[str, int] = {}
    loose = 0
    quantified = False
    pending: tuple[int, int, bool] | None = None  # value, position, is_article
    i = 0
    while i < len(tokens):
        match = None
        for size in range(min(longest, len(tokens) - i), 0, -1):
            phrase = tuple(tokens[i : i + size])
            if phrase in kinds:
                match = phrase
                break
        if match is None:
            value = _quantity(tokens[i])
            if value is not None:
                if pending is not None and not pending[2]:
                    loose += pending[0]
                article = tokens[i] in _ARTICLES
                quantified = quantified or not article
                # 'a couple', 'a dozen', 'a few': the later quantity word wins over the article.
                pending = (value, i, article)
            elif tokens[i] in _NEGATIONS:
                quantified = True
                pending = (0, i, False)
            i += 1
            continue
        near = pending is not None and i - pending[1] <= _WINDOW
        if match in _NEEDS_QUANTITY and not near:
            i += len(match)
            continue
        cls = kinds[match]
        counts[cls] = counts.get(cls, 0) + (pending[0] if near else 1)
        pending = None
        i += len(match)
    if pending is not None and not pending[2]:
        loose += pending[0]
    return counts, loose, quantified


def _header_pattern(classes: Sequence[str]) -> tuple[re.Pattern[str], dict[str, str]]:
    names: dict[str, str] = {}
    for cls in classes:
        for alias in (cls, *SECTION_ALIASES.get(cls, ())):
            for form in _plurals(alias.lower()):
                names.setdefault(form, cls)
    alternatives = '|'.join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf'\b({alternatives})\s*:', re.IGNORECASE), names


def _merged_vocabularies(
    classes: tuple[str, ...], vocabularies: Mapping[str, Sequence[str]] | None, caller: str
) -> dict[str, tuple[str, ...]]:
    """Each class's kinds: the vocabulary given for it, else its default one, else its own name.

    Raises:
        ParameterError: a vocabulary names a class not in `classes`, or `classes` is empty.
    """
    if not classes:
        raise ParameterError(f'{caller} needs at least one class')
    vocabularies = dict(vocabularies or {})
    unknown = sorted(set(vocabularies) - set(classes))
    if unknown:
        raise ParameterError(
            f'vocabulary given for unknown class(es) {", ".join(unknown)}; classes: {", ".join(classes)}'
        )
    return {cls: tuple(vocabularies.get(cls, DEFAULT_VOCABULARIES.get(cls, (cls,)))) for cls in classes}


def parse_counts(
    text: str,
    classes: Sequence[str] = CLASSES,
    vocabularies: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, int]:
    """Read per-class object counts from a VLM answer.

    Table 1 answers ('Animals: 2 fish, 1 crab Vegetation: None Objects: 1 pipe Trash: 3 bottles') are
    read section by section: a section's count is the sum of its items, an item being a number with or
    without a kind ('2 fish', '3'), a number word ('two', 'a', 'several'), or a bare kind (one). 'None',
    'no', '0' count zero, and a missing section counts zero. Without any section header the text is a
    free caption: every kind of a class's vocabulary found counts the quantity just before it (within
    three words), or one ('two fish near a plastic bottle' -> animal 2, trash 1).

    Args:
        text: the generated answer.
        classes: class ids to report, in order.
        vocabularies: per class, the kinds that belong to it; replaces the default vocabulary of each
            class it names. Classes without a vocabulary match only their own name.

    Returns:
        A count (int >= 0) for every class.

    Raises:
        ParameterError: a vocabulary names a class not in `classes`, or `classes` is empty.
    """
    classes = tuple(classes)
    kinds = _kind_table(_merged_vocabularies(classes, vocabularies, 'parse_counts'))
    longest = max((len(k) for k in kinds), default=1)
    counts = dict.fromkeys(classes, 0)
    lowered = _PLACEHOLDER.sub(' ', (text or '').lower())

    pattern, names = _header_pattern(classes)
    headers = list(pattern.finditer(lowered))
    if not headers:
        found, _, _ = _scan(_TOKEN.findall(lowered), kinds, longest)
        counts.update({cls: counts[cls] + n for cls, n in found.items()})
        return counts

    for index, header in enumerate(headers):
        cls = names[header.group(1).lower()]
        end = headers[index + 1].start() if index + 1 < len(headers) else len(lowered)
        for item in _ITEM_SPLIT.split(lowered[header.end() : end]):
            tokens = _TOKEN.findall(item)
            if not tokens:
                continue
            found, loose, quantified = _scan(tokens, kinds, longest)
            total = sum(found.values()) + loose
            # An item naming something without a number ('octopus') still says one is there.
            if total == 0 and not quantified:
                total = 1
            counts[cls] += total
    return counts


def label_matcher(
    classes: Sequence[str] = CLASSES, vocabularies: Mapping[str, Sequence[str]] | None = None
) -> Callable[[str], str | None]:
    """The class a model's label for one object names ('plastic bottle' -> trash), as counts read kinds.

    A label that is a class's own name (singular or plural, any case) is that class. Otherwise the
    label's words are matched against every class's kinds (the vocabulary given for it, else its
    default one; plural forms derived) and the last kind found decides, as the head of an English
    noun phrase comes last ('fish net': a net, trash). A label that names no kind (a 'rock' where no
    class lists it) is None.

    Raises:
        ParameterError: a vocabulary names a class not in `classes`, or `classes` is empty.
    """
    classes = tuple(classes)
    kinds = _kind_table(_merged_vocabularies(classes, vocabularies, 'label_matcher'))
    own = {form: cls for cls in reversed(classes) for form in _plurals(cls.lower())}
    longest = max((len(k) for k in kinds), default=1)

    def match(label: str) -> str | None:
        text = ' '.join(str(label).lower().split())
        if text in own:
            return own[text]
        tokens = _TOKEN.findall(text)
        found = None
        i = 0
        while i < len(tokens):
            for size in range(min(longest, len(tokens) - i), 0, -1):
                phrase = tuple(tokens[i : i + size])
                if phrase in kinds:
                    found = kinds[phrase]
                    i += size
                    break
            else:
                i += 1
        return found

    return match
