"""Tests of the shipped demo CLIP and BLIP: offline loading, held-out quality, violations, and the trainer."""

import json
from pathlib import Path

import numpy as np
import pytest

import metavlm_ros
from metavlm_ros.common.errors import ParameterError
from metavlm_ros.demo.config import (
    BLIP_EXACT_TARGET,
    BLIP_PRESENCE_TARGET,
    CLIP_AUC_TARGET,
    SECTION_TOKENS,
    TrainingConfig,
)
from metavlm_ros.demo.evaluation import evaluate_blip, evaluate_clip, roc_auc
from metavlm_ros.demo.scenes import heldout_set
from metavlm_ros.demo.training import train_demo_models, write_model_card
from metavlm_ros.method.prediction import CLASSES
from metavlm_ros.method.search import SearchConfig, run_search
from metavlm_ros.models.vlm import TABLE1_PROMPT, create_backend, resolve_model

MODELS = Path(metavlm_ros.__file__).resolve().parent / 'models'
# The whole fixed held-out set, the one the trainer prints its metrics on (about half a minute to
# render and judge on two cores): a prefix would make the thresholds a coin toss for rare classes.
HELDOUT_FRAMES = TrainingConfig().heldout_frames


@pytest.fixture(scope='module')
def heldout():
    return heldout_set(HELDOUT_FRAMES, workers=2)


@pytest.fixture(scope='module')
def clip():
    return create_backend('clip', 'demo', device='cpu')


@pytest.fixture(scope='module')
def blip():
    return create_backend('blip', 'demo', device='cpu')


def test_demo_blip_answers_parse_in_the_table1_format(blip, heldout):
    # The format part of the issue-5 target holds on its own: every answer has all four sections.
    metrics = evaluate_blip(blip, heldout)
    assert metrics['parsed'] == 1.0, metrics['examples']


@pytest.mark.parametrize('backend', ['clip', 'blip'])
def test_shipped_model_directories_are_complete_and_small(backend):
    directory = MODELS / f'demo-{backend}'
    assert resolve_model(backend, 'demo') == str(directory)
    for name in ('config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'README.md'):
        assert (directory / name).is_file(), name
    assert (directory / 'processor_config.json').is_file() or (
        directory / 'preprocessor_config.json'
    ).is_file()
    assert (directory / 'model.safetensors').stat().st_size <= 10 * 1024 * 1024
    assert not list(directory.glob('*.bin')), 'weights must be safetensors only'
    card = (directory / 'README.md').read_text()
    assert 'demonstration only' in card and 'synthetic' in card


def test_roc_auc_by_hand():
    # Positives score 0.35 and 0.8; negatives 0.1 and 0.4: 3 of 4 (positive, negative) pairs ordered.
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert roc_auc([0.5, 0.5], [False, True]) == pytest.approx(0.5)
    assert np.isnan(roc_auc([0.1, 0.2], [True, True]))


def test_heldout_prefix_has_both_labels_for_every_class(heldout):
    present = heldout.counts > 0
    assert present.any(axis=0).all() and (~present).any(axis=0).all()


# The held-out thresholds settled in issue 15 (what the 45-minute CPU budget reaches; see the model
# cards for the shipped pair's scores), on the same 300 frames the trainer prints its metrics on.
def test_demo_clip_loads_offline_and_separates_class_presence(clip, heldout):
    assert clip.kind == 'confidence' and clip.name == 'clip'
    auc = evaluate_clip(clip, heldout)
    assert set(auc) == set(CLASSES)
    for cls, value in auc.items():
        assert value >= CLIP_AUC_TARGET, f'{cls}: ROC AUC {value:.3f}'


def test_demo_blip_loads_offline_and_counts_in_the_table1_format(blip, heldout):
    assert blip.kind == 'count' and blip.prompt == TABLE1_PROMPT
    metrics = evaluate_blip(blip, heldout)
    assert metrics['parsed'] == 1.0, metrics['examples']
    for cls in CLASSES:
        assert metrics['exact'][cls] >= BLIP_EXACT_TARGET, (cls, metrics['exact'])
        assert metrics['presence'][cls] >= BLIP_PRESENCE_TARGET, (cls, metrics['presence'])


def test_demo_blip_tokenizer_keeps_the_table1_spelling():
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(MODELS / 'demo-blip', local_files_only=True)
    answer = 'Animals: 2 fish, 1 crab Vegetation: 1 seaweed Objects: None Trash: 1 bottle'
    ids = processor.tokenizer(answer)['input_ids']
    assert processor.tokenizer.decode(ids, skip_special_tokens=True) == answer
    assert all(token in processor.tokenizer.get_vocab() for token in SECTION_TOKENS.values())


def test_tokenizer_training_is_repeatable():
    # The tokenizers trainers number some symbols in hash-map order; the recipe must not inherit that.
    from metavlm_ros.demo.builders import demo_blip_tokenizer, demo_clip_tokenizer, demo_corpus
    from metavlm_ros.footage.scenes import SceneGenerator
    from metavlm_ros.footage.truth import caption

    captions = [caption(SceneGenerator(256, 144, 1, seed).frame(0)[1]) for seed in range(12)]
    corpus = demo_corpus(captions)
    for build in (lambda: demo_clip_tokenizer(corpus, 48), lambda: demo_blip_tokenizer(corpus)):
        vocabularies = [build().get_vocab() for _ in range(4)]
        assert all(v == vocabularies[0] for v in vocabularies[1:])

    def merges():
        return json.loads(demo_clip_tokenizer(corpus, 48).backend_tokenizer.to_str())['model']['merges']

    first = merges()
    assert merges() == first
    assert len(first) > 100  # it still learns merges, not only the listed symbols


@pytest.mark.parametrize('name', ['clip', 'blip'])
def test_a_short_search_on_a_demo_frame_finds_a_violation(name, request, heldout):
    backend = request.getfixturevalue(name)
    config = SearchConfig(population=12, evaluations=48, seed=3)
    result = run_search(heldout.frames[0], backend, config, image_id='heldout-0')
    assert len(result.evaluations) == 48
    assert any(any(ev.violation.values()) for ev in result.evaluations)


def test_coverage_maps_count_only_visible_ground_truth_objects():
    from metavlm_ros.demo.scenes import _coverage

    # A 4x4-pixel label map on a 2x2 grid: object 0 (a fish in the ground truth) fills the top-left
    # cell and half the top-right; object 1 fills the bottom-right cell but is not in the ground truth
    # (too hidden to count), so it covers nothing.
    labels = np.full((4, 4), -1, np.int16)
    labels[0:2, 0:3] = 0
    labels[2:4, 2:4] = 1

    class Truth:
        boxes = [{'class': 'animal', 'id': 0}]

    cells = _coverage(labels, Truth(), 2)
    animal = CLASSES.index('animal')
    assert cells[..., animal] == pytest.approx(np.array([[1.0, 0.5], [0.0, 0.0]]))
    assert cells.sum() == pytest.approx(1.5)


def test_training_config_rejects_bad_values():
    with pytest.raises(ParameterError, match='clip_steps'):
        TrainingConfig(clip_steps=0).validate()
    with pytest.raises(ParameterError, match='multiple of patch_size'):
        TrainingConfig(image_size=100, patch_size=16).validate()
    with pytest.raises(ParameterError, match='coverage_weight'):
        TrainingConfig(coverage_weight=-1.0).validate()
    with pytest.raises(ParameterError, match='clip_lr'):
        TrainingConfig(clip_lr=0.0).validate()
    with pytest.raises(ParameterError, match='gain_range'):
        TrainingConfig(gain_range=(1.4, 0.6)).validate()
    with pytest.raises(ParameterError, match='min_input_pixels'):
        TrainingConfig(min_input_pixels=-1).validate()
    with pytest.raises(ParameterError, match='augment_magnitude'):
        TrainingConfig(augment_magnitude=0.0).validate()
    with pytest.raises(ParameterError, match='augment must'):
        TrainingConfig(augment=1.5).validate()
    with pytest.raises(ParameterError, match='robustness_evaluations'):
        TrainingConfig(robustness_evaluations=-1).validate()
    with pytest.raises(ParameterError, match='does not hold demo-clip'):
        TrainingConfig(init_from='/nonexistent').validate()
    with pytest.raises(ParameterError, match='clip_distill_weight needs init_from'):
        TrainingConfig(clip_distill_weight=1.0).validate()
    with pytest.raises(ParameterError, match='clip_distill_weight must be'):
        TrainingConfig(clip_distill_weight=-1.0).validate()
    with pytest.raises(ParameterError, match='blip_teacher_answers needs init_from'):
        TrainingConfig(blip_teacher_answers=True).validate()
    with pytest.raises(ParameterError, match='blip_teacher_votes must be'):
        TrainingConfig(blip_teacher_votes=-1).validate()
    with pytest.raises(ParameterError, match='blip_teacher_votes needs blip_teacher_answers'):
        TrainingConfig(blip_teacher_votes=4).validate()
    with pytest.raises(ParameterError, match='blip_consistency_pairs must lie'):
        TrainingConfig(blip_consistency_weight=1.0, blip_consistency_pairs=1.0).validate()
    with pytest.raises(ParameterError, match='blip_consistency_weight be zero or positive'):
        TrainingConfig(blip_consistency_weight=-1.0).validate()
    with pytest.raises(ParameterError, match='blip_consistency_weight needs augment'):
        TrainingConfig(blip_consistency_weight=1.0, augment=0.0).validate()
    with pytest.raises(ParameterError, match='clip_consistency_weight needs augment'):
        TrainingConfig(clip_consistency_weight=1.0, augment=0.0).validate()


def _truth_with_a_speck():
    from metavlm_ros.footage.truth import KINDS, GroundTruth

    # A 64x64 frame squashed to a 32x32 model input (4 frame pixels per input pixel): object 3, a
    # fish, shows 40x40 frame pixels = 400 input pixels; object 7, a crab, 8x8 = 16 input pixels.
    kinds = {k: 0 for c in CLASSES for k in KINDS[c]}
    kinds.update(fish=1, crab=1)
    fish = {'class': 'animal', 'kind': 'fish', 'id': 3, 'visible': 1.0, 'box': [0, 0, 40, 40]}
    crab = {'class': 'animal', 'kind': 'crab', 'id': 7, 'visible': 1.0, 'box': [50, 50, 58, 58]}
    boxes = [fish | {'area': 1600 / 4096}, crab | {'area': 64 / 4096}]
    counts = dict.fromkeys(CLASSES, 0) | {'animal': 2}
    return GroundTruth(counts, kinds, boxes, 5, 'pool')


def test_demo_labelling_rule_drops_objects_too_small_for_the_model_input():
    from metavlm_ros.demo.scenes import demo_truth
    from metavlm_ros.footage.truth import caption

    truth = _truth_with_a_speck()
    kept = demo_truth(truth, image_size=32, min_pixels=32)
    assert kept.counts['animal'] == 1 and kept.kind_counts == truth.kind_counts | {'crab': 0}
    assert [b['id'] for b in kept.boxes] == [3]
    assert caption(kept).startswith('Animals: 1 fish Vegetation: None')
    assert kept.frame_index == 5 and kept.environment == 'pool'
    # The threshold is in pixels of the model input: a 64-pixel input makes the crab 64 pixels.
    assert demo_truth(truth, image_size=64, min_pixels=32).counts['animal'] == 2
    assert demo_truth(truth, image_size=32, min_pixels=0) is truth
    # The generator's truth is left as it was.
    assert truth.counts['animal'] == 2 and len(truth.boxes) == 2


def test_heldout_set_keeps_the_generator_counts_next_to_a_labelling_rule(heldout):
    # Without a rule the two agree; with one, objects are only removed (and half the held-out
    # animals are specks of a few input pixels, so some frames change).
    assert (heldout.counts == heldout.generator_counts).all()
    ruled = heldout_set(30, min_input_pixels=32)
    assert (ruled.generator_counts == heldout.generator_counts[:30]).all()
    assert (ruled.counts <= ruled.generator_counts).all()
    assert (ruled.counts < ruled.generator_counts).any()
    assert ruled.environments == [('pool', 'shallow', 'deep')[(i // 3) % 3] for i in range(30)]


def test_auc_within_environments_does_not_reward_recognising_the_environment():
    from metavlm_ros.demo.evaluation import auc_by_environment, presence_auc
    from metavlm_ros.demo.scenes import SceneSet

    # Animals show in every pool frame and in no deep frame; a score that only says "pool" ranks
    # every positive above every negative over all frames, and is useless within each environment.
    counts = np.zeros((8, len(CLASSES)), np.int64)
    counts[:4, 0] = 1
    counts[[0, 2, 4, 6], 1] = 1
    environments = ['pool'] * 4 + ['deep'] * 4
    scores = np.zeros((8, len(CLASSES)))
    scores[:4] = 1.0
    scenes = SceneSet([], np.zeros((8, 1, 1, 3), np.uint8), counts, [''] * 8, environments=environments)
    assert presence_auc(scores, counts)['animal'] == pytest.approx(1.0)
    within = auc_by_environment(scores, scenes)
    assert set(within) == {'pool', 'deep'}
    assert np.isnan(within['pool']['animal']) and np.isnan(within['deep']['animal'])
    assert within['pool']['vegetation'] == pytest.approx(0.5)


def _toy_config(**changes) -> TrainingConfig:
    """The recipe at toy size (seconds on one process), with `changes` on top."""
    toy = dict(
        train_frames=8,
        heldout_frames=3,
        frames_per_scene=4,
        clip_steps=2,
        blip_steps=2,
        batch_size=4,
        workers=1,
        robustness_evaluations=0,
    )
    return TrainingConfig(**(toy | changes))


def test_training_recipe_runs_and_saves_loadable_models(tmp_path):
    # A few seconds: the whole recipe (with a labelling rule) at toy size, so the default suite runs it.
    config = _toy_config(
        train_frames=12, heldout_frames=6, frames_per_scene=6, min_input_pixels=32, robustness_evaluations=6
    )
    lines = []
    summary = train_demo_models(tmp_path, config, log=lines.append)
    for name in ('clip', 'blip'):
        assert (tmp_path / f'demo-{name}' / 'model.safetensors').is_file()
        saved = json.loads((tmp_path / f'demo-{name}' / 'training.json').read_text())
        assert len(saved['loss_curve']) == 1
        assert summary[name]['heldout']
    assert any(line.startswith('clip held-out ROC AUC') for line in lines)
    assert any(line.startswith('blip held-out exact count') for line in lines)
    # The robustness figures: Rand on the held-out frames (6 frames: every 15th is frame 0 only).
    assert any(
        line.startswith('clip robustness (Rand, 6 evaluations x 1 held-out frames), Th 0.05')
        for line in lines
    )
    assert any(
        line.startswith('blip robustness (Rand, 6 evaluations x 1 held-out frames), count') for line in lines
    )
    assert sum(summary['blip']['heldout']['robustness']['evaluations']['count'].values()) == 6
    # Under a labelling rule the same answers are also judged against the generator's truth, and the
    # CLIP is judged within each environment of the held-out frames (6 frames: pool and shallow).
    assert any(line.startswith('clip held-out ROC AUC (generator rule)') for line in lines)
    assert any(line.startswith('blip held-out presence (generator rule)') for line in lines)
    assert set(summary['clip']['heldout']['auc_by_environment']) == {'pool', 'shallow'}
    card = write_model_card(tmp_path / 'demo-clip', 'clip', summary).read_text()
    assert 'generator rule' in card and '| pool |' in card and 'at least 32' in card


def test_fine_tuning_starts_from_the_given_models_and_keeps_their_tokenizers(tmp_path):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    train_demo_models(tmp_path / 'a', _toy_config(), log=lambda line: None)
    lines = []
    tuned = _toy_config(init_from=str(tmp_path / 'a'), clip_lr=1e-6, blip_lr=1e-6, seed=1, train_frames=4)
    train_demo_models(tmp_path / 'b', tuned, log=lines.append)
    assert any(line.startswith('clip initialised from') for line in lines)
    assert any(line.startswith('blip initialised from') for line in lines)
    for name in ('clip', 'blip'):
        before, after = (tmp_path / run / f'demo-{name}' for run in ('a', 'b'))
        vocabularies = [
            AutoTokenizer.from_pretrained(d, local_files_only=True).get_vocab() for d in (before, after)
        ]
        assert vocabularies[0] == vocabularies[1], name
        # Two steps at a tiny rate: every weight stays close to where it started (not re-initialised).
        old, new = load_file(before / 'model.safetensors'), load_file(after / 'model.safetensors')
        assert old.keys() == new.keys()
        assert max(float(np.abs(old[k] - new[k]).max()) for k in old) < 1e-3, name


def test_distillation_targets_keep_each_prompts_ranking_inside_the_band():
    import torch

    from metavlm_ros.demo.batches import distill_target

    config = TrainingConfig()
    # Two prompts with very different spreads (a starting CLIP's cosines range over -0.7..0.9).
    cosine = torch.tensor([[-0.5, 0.1], [0.1, 0.2], [0.7, 0.3]])
    mean, std = cosine.mean(dim=0), cosine.std(dim=0)
    target = distill_target(cosine, mean, std, config)
    assert torch.equal(target.argsort(dim=0), cosine.argsort(dim=0))  # ranking per prompt kept
    assert target.mean(dim=0) == pytest.approx([config.clip_cosine_centre] * 2)
    # One standard deviation is a third of the band, whatever the starting spread.
    assert target.std(dim=0) == pytest.approx([config.clip_cosine_band / 3] * 2)


def test_a_distilled_fine_tune_moves_its_cosines_to_the_targets(tmp_path):
    import re

    train_demo_models(tmp_path / 'a', _toy_config(), log=lambda line: None)
    lines = []
    tuned = _toy_config(init_from=str(tmp_path / 'a'), clip_distill_weight=1.0, clip_steps=4, log_every=1)
    train_demo_models(tmp_path / 'b', tuned, log=lines.append)
    assert any(line.startswith(f'clip distils from {tmp_path / "a" / "demo-clip"}') for line in lines)
    distill = [float(m.group(1)) for line in lines if (m := re.search(r'distill ([0-9.]+)', line))]
    assert len(distill) == 4
    # The toy CLIP's cosines start far outside the band; four steps bring them close to the targets.
    assert distill[-1] < distill[0] / 10


def test_a_blip_fine_tune_can_learn_its_starting_models_answers(tmp_path):
    import re

    from metavlm_ros.demo.evaluation import blip_answers
    from metavlm_ros.demo.scenes import datasets
    from metavlm_ros.models.vlm import create_backend

    train_demo_models(tmp_path / 'a', _toy_config(), log=lambda line: None)
    lines = []
    tuned = _toy_config(init_from=str(tmp_path / 'a'), blip_teacher_answers=True, blip_consistency_weight=1.0)
    train_demo_models(tmp_path / 'b', tuned, log=lines.append)
    # The consistency loss ran on the repeated, transformed frames (a quarter of 4: one pair).
    logged = [re.search(r'blip step .* consistency (\S+)\)', line) for line in lines]
    steps = [float(m.group(1)) for m in logged if m]
    assert steps and all(value >= 0 for value in steps) and max(steps) > 0, lines
    said = [m for line in lines if (m := re.match(r'blip learns the answers of (.+) \((.+)% of them', line))]
    assert len(said) == 1 and said[0].group(1) == str(tmp_path / 'a' / 'demo-blip')
    # The targets are the starting BLIP's answers through the normal backend on the training frames.
    train, _ = datasets(tuned)
    teacher = create_backend('blip', str(tmp_path / 'a' / 'demo-blip'), device='cpu')
    answers = blip_answers(teacher, list(train.small))
    assert float(said[0].group(2)) == pytest.approx(
        100 * np.mean([a == b for a, b in zip(answers, train.captions, strict=True)]), abs=0.05
    )


def test_paired_indices_repeat_the_first_frames_at_the_end_and_mark_them():
    from metavlm_ros.demo.batches import paired_indices

    idx, always = paired_indices(np.random.default_rng(0), 100, 8, 2)
    assert len(idx) == 8 and len(set(idx[:6].tolist())) == 6
    assert idx[6:].tolist() == idx[:2].tolist()
    assert always.tolist() == [False] * 6 + [True] * 2
    idx, always = paired_indices(np.random.default_rng(0), 100, 8, 0)
    assert len(set(idx.tolist())) == 8 and always is None


def test_answer_divergence_is_the_symmetric_kl_of_the_answer_positions_only():
    import torch

    from metavlm_ros.demo.train_blip import _answer_divergence

    # Two frames, each once more transformed (rows 2 and 3 repeat rows 0 and 1); three positions,
    # two tokens. Position t predicts token t + 1: labels -100 at 0-1 (prompt) and 2 (answer) leave
    # only position 1 (which predicts label 2... -100) out; labels [-100, -100, 5] make position 1
    # the only one that counts.
    labels = torch.tensor([[-100, -100, 5]] * 4)
    p, q = torch.tensor([0.8, 0.2]), torch.tensor([0.5, 0.5])
    logits = torch.zeros(4, 3, 2)
    logits[0, 1], logits[2, 1] = p.log(), q.log()  # frame 0: its copy moved
    logits[1, 1], logits[3, 1] = p.log(), p.log()  # frame 1: its copy did not
    logits[2, 0] = torch.tensor([5.0, -5.0])  # a prompt position: ignored
    by_hand = float(((p - q) * (p.log() - q.log())).sum())  # KL(p||q) + KL(q||p)
    assert float(_answer_divergence(logits, labels, 2)) == pytest.approx(by_hand / 2)
    # Symmetric: swapping which copy is transformed gives the same value.
    swapped = logits[[2, 3, 0, 1]]
    assert float(_answer_divergence(swapped, labels, 2)) == pytest.approx(by_hand / 2)
    assert float(_answer_divergence(logits[[1, 1, 1, 1]], labels, 2)) == 0.0


class _AnswersByBrightness:
    """A count-type teacher whose answer depends only on a frame's mean brightness."""

    def predict(self, frames):
        from metavlm_ros.method.prediction import Prediction

        return [
            Prediction('count', {}, 'Animals: 2 fish' if f.mean() > 100 else 'Animals: None') for f in frames
        ]


def test_neighbourhood_answers_take_the_majority_of_the_transformed_copies():
    from metavlm_ros.demo.scenes import SceneSet
    from metavlm_ros.demo.train_blip import _neighbourhood_answers

    # Every transformed copy of a bright frame stays bright (small compositions of the relations),
    # so its copies answer '2 fish'; a frame whose own answer disagrees is outvoted by its copies,
    # and one whose own answer agrees keeps it. With one copy a disagreement is a tie: own answer.
    mid = np.full((3, 36, 64, 3), 200, np.uint8)
    mid[2] = 20
    train = SceneSet([], np.zeros((3, 8, 8, 3), np.uint8), np.zeros((3, 4), int), ['', '', ''], mid=mid)
    own = ['Animals: None', 'Animals: 2 fish', 'Animals: 1 crab']
    config = TrainingConfig(augment_magnitude=0.3, blip_teacher_votes=5)
    answers, changed = _neighbourhood_answers(_AnswersByBrightness(), train, own, config)
    assert answers == ['Animals: 2 fish', 'Animals: 2 fish', 'Animals: None']
    assert changed == pytest.approx(2 / 3)
    config = TrainingConfig(augment_magnitude=0.3, blip_teacher_votes=1)
    assert _neighbourhood_answers(_AnswersByBrightness(), train, own, config) == (own, 0.0)


def test_training_twice_with_one_seed_gives_the_same_weights(tmp_path):
    # docs/demo.md promises that a seed decides the models; the tokenizers were once the exception.
    config = _toy_config(clip_steps=3, blip_steps=3)
    for run in ('a', 'b'):
        train_demo_models(tmp_path / run, config, log=lambda line: None)
    for name in ('clip', 'blip'):
        files = [(tmp_path / run / f'demo-{name}' / 'model.safetensors').read_bytes() for run in ('a', 'b')]
        assert files[0] == files[1], name


def test_robustness_rates_by_order_and_the_median_smallest_violating_change():
    from metavlm_ros.demo.evaluation import robustness
    from metavlm_ros.method.prediction import Prediction
    from test.conftest import make_frame
    from test.fakes import BlackCountBackend

    # The stand-in counts one animal per 5 % of black pixels: the black fill of a geometric relation
    # changes its answer.
    frames = [make_frame(160, 120, seed=s) for s in (1, 2, 3)]
    figures = robustness(BlackCountBackend(), frames, evaluations=60, seed=4)
    assert set(figures['rate']) == {'count'}
    # Rand draws every order 1..6 and never the identity: all 3 x 60 evaluations are judged.
    assert sum(figures['evaluations']['count'].values()) == 180
    assert set(figures['evaluations']['count']) == set(range(1, 7))
    assert all(0 <= rate <= 1 for rate in figures['rate']['count'].values())
    smallest = figures['smallest']['count']
    assert len(smallest) == 3 and None not in smallest
    assert figures['median_smallest']['count'] == pytest.approx(sorted(smallest)[1])

    class Constant(BlackCountBackend):
        def predict(self, batch):
            return [Prediction(kind='count', values=dict.fromkeys(CLASSES, 1), text='') for _ in batch]

    # A model that never changes: no violation at any order, no smallest change, no median.
    steady = robustness(Constant(), frames[:2], evaluations=30)
    assert set(steady['rate']['count'].values()) == {0.0}
    assert steady['smallest']['count'] == [None, None] and steady['median_smallest']['count'] is None


def test_augmentations_are_small_compositions_of_the_relations():
    from metavlm_ros.demo.batches import random_augmentation
    from metavlm_ros.method.relations import RELATIONS

    rng = np.random.default_rng(0)
    orders = set()
    for _ in range(300):
        composition = random_augmentation(rng, 0.4)
        orders.add(composition.order)
        for relation, active, value in zip(RELATIONS, composition.active, composition.values, strict=True):
            deviation = abs(value - relation.nominal) / relation.max_deviation
            assert deviation <= 0.4 + 1e-9 if active else deviation == 0
            # One-sided relations deviate into their range: CLAHE up, downsampling down.
            assert relation.low <= value <= relation.high
    assert orders == set(range(1, 7))


def test_augmentations_are_the_search_s_rand_over_narrowed_ranges():
    from metavlm_ros.demo.batches import random_augmentation
    from metavlm_ros.method.algorithms import rand_genotypes
    from metavlm_ros.method.encoding import SearchSpace, decode

    # At full magnitude an augmentation is Rand's sample itself, draw for draw.
    space = SearchSpace.default()
    ours, rands = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(20):
        assert random_augmentation(ours, 1.0) == decode(rand_genotypes(space, 1, rands)[0], space)
    # Every order about as often, as Rand spends its budget.
    rng = np.random.default_rng(3)
    orders = np.bincount([random_augmentation(rng, 0.3).order for _ in range(600)], minlength=7)
    assert orders[0] == 0 and all(60 <= n <= 140 for n in orders[1:])


def test_a_transformed_training_frame_moves_its_maps_with_it():
    from metavlm_ros.demo.batches import augmented_batch
    from metavlm_ros.demo.scenes import SceneSet

    # One 64x32 frame whose second patch column (of a 4x4 grid) is a white animal; every draw
    # transforms it (augment 1.0, full magnitude), and the coverage map must follow the pixels.
    mid = np.zeros((1, 32, 64, 3), np.uint8)
    mid[:, :, 16:32] = 255
    coverage = np.zeros((1, 4, 4, len(CLASSES)), np.float32)
    coverage[0, :, 1, 0] = 1.0
    scenes = SceneSet(
        [], np.zeros((1, 8, 8, 3), np.uint8), np.ones((1, 4), np.int64), [''], coverage=coverage
    )
    scenes.mid = mid
    config = TrainingConfig(image_size=8, augment=1.0, augment_magnitude=1.0)
    rng = np.random.default_rng(1)
    moved = 0
    for _ in range(40):
        small, density, maps, flip = augmented_batch(scenes, np.array([0]), rng, config)
        assert density is None and small.shape == (1, 8, 8, 3)
        # Wherever the white band went in the frame, the animal's cells went with it.
        white = small[0, :, :, 0].reshape(4, 2, 4, 2).mean(axis=(1, 3)) > 200
        assert (maps[0, ..., 0] > 0)[white].all()
        moved += not np.array_equal(maps[0], coverage[0])
    assert moved, 'some compositions (zoom, rotation) must move the cells'


def test_demo_blip_is_steadier_under_small_changes_than_under_large_ones(blip, heldout):
    # The issue's own measure: Rand on the 20 held-out frames of the robustness figures, 300
    # evaluations each (order uniform in 1..6); here 150 each, half the time, with the same bounds.
    # The shipped BLIP was fine-tuned with a consistency
    # loss between transformed copies of its training frames (issue 15, docs/demo.md); it changes a
    # count at order 1 in 16.3 % of evaluations, rising to 45.7 % at order 6, and the median over
    # frames of its smallest violating f_trans is 0.47. The BLIP before it (run J): 30.1 %, 71.4 %
    # and 0.17; issue 15 asks for at most 45 % at order 1, a rise with order and a median >= 0.3.
    from metavlm_ros.demo.evaluation import robustness, robustness_frames

    figures = robustness(blip, robustness_frames(heldout, 20), evaluations=150)
    rates = figures['rate']['count']
    assert rates[1] <= 0.25, rates
    assert np.mean([rates[5], rates[6]]) > np.mean([rates[1], rates[2]]) + 0.1, rates
    assert figures['median_smallest']['count'] >= 0.3, figures['smallest']


def test_demo_clip_shrugs_off_small_changes_at_th_5_percent_but_not_at_1_percent(clip, heldout):
    # Rand on 4 held-out frames, 90 evaluations each. The shipped CLIP was distilled from the one
    # shipped before with the relations as augmentation and its cosines in 0.25 +- 0.1 (issue 15); on
    # these frames it violates at Th 0.05 in 2 % of order-1 evaluations and 13 % at order 6, at Th
    # 0.01 in 38 % at order 1; its smallest violating f_trans at Th 0.05 is 0.95-1.80. The CLIP
    # shipped before violated at Th 0.05 in 75 % of order-1 evaluations on 20 frames (docs/demo.md).
    from metavlm_ros.demo.evaluation import robustness, robustness_frames

    figures = robustness(clip, robustness_frames(heldout, 4), evaluations=90)
    strict, loose = figures['rate']['0.05'], figures['rate']['0.01']
    assert strict[1] <= 0.20, strict
    assert np.mean([strict[5], strict[6]]) > np.mean([strict[1], strict[2]]), strict
    assert loose[1] >= 3 * strict[1] and loose[1] >= 0.2, (loose, strict)
    assert figures['median_smallest']['0.05'] >= 0.3, figures['smallest']
