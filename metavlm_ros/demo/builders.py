"""Tokenizers learned on the demo corpus and the tiny architectures of the demo models."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metavlm_ros.demo.config import CLASS_PHRASES, CLIP_TEMPLATES, SECTION_TOKENS, TrainingConfig
from metavlm_ros.method.prediction import CLASSES

__all__ = [
    'clip_vision_into_blip',
    'demo_blip_tokenizer',
    'demo_clip_tokenizer',
    'demo_corpus',
    'demo_vision_config',
]


def demo_clip_tokenizer(corpus: Sequence[str], max_length: int) -> Any:
    """A CLIP byte-level BPE tokenizer learned on the corpus (the same corpus gives the same ids)."""
    from tokenizers import pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    # The empty CLIPTokenizer carries CLIP's own normaliser and pre-tokeniser; training its backend
    # and rebuilding from the learned vocabulary keeps loading identical to a released CLIP.
    backend = CLIPTokenizer().backend_tokenizer
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    # The trainer creates the end-of-word symbols ('a</w>') as it meets them in a hash map, so their
    # ids, and through merge tie-breaking even the merges, change from run to run (tokenizers issue
    # 1794). Listing them up front, in a fixed order, fixes their ids and makes training repeatable.
    word_ends = [f'{c}</w>' for c in alphabet]
    trainer = trainers.BpeTrainer(
        vocab_size=600 + len(word_ends),
        special_tokens=['<|startoftext|>', '<|endoftext|>', *word_ends],
        end_of_word_suffix='</w>',
        initial_alphabet=alphabet,
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    learned = json.loads(backend.to_str())['model']
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(' ')) for m in learned['merges']]
    return CLIPTokenizer(vocab=learned['vocab'], merges=merges, model_max_length=max_length)


def demo_blip_tokenizer(corpus: Sequence[str]) -> Any:
    """A BERT WordPiece tokenizer learned on the corpus, with [DEC] as BLIP's decoder start token."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    from metavlm_ros.models.vlm import TABLE1_PROMPT

    specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', '[DEC]']
    learner = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    learner.normalizer = normalizers.BertNormalizer(lowercase=False)
    learner.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # As for the CLIP tokenizer: the word-continuation symbols ('##a') are listed up front so that
    # their ids, and the pieces learned, do not depend on hash-map order.
    pieces = sorted(
        {f'##{c}' for text in corpus for c in learner.normalizer.normalize_str(text) if not c.isspace()}
    )
    trainer = trainers.WordPieceTrainer(vocab_size=400 + len(pieces), special_tokens=[*specials, *pieces])
    learner.train_from_iterator(corpus, trainer)
    tokenizer = BertTokenizer(
        vocab=learner.get_vocab(), do_lower_case=False, bos_token='[DEC]', model_max_length=160
    )
    tokenizer.add_tokens(list(SECTION_TOKENS.values()))
    # The whole Table 1 prompt is one token of this vocabulary: the decoder then reads a 1-token prompt
    # instead of about 90, which makes training four times cheaper on a CPU. Other prompts still
    # tokenize word by word (the model was not trained on them).
    tokenizer.add_tokens([AddedToken(TABLE1_PROMPT, normalized=False)])
    return tokenizer


def demo_corpus(captions: Sequence[str]) -> list[str]:
    from metavlm_ros.models.counts import DEFAULT_VOCABULARIES
    from metavlm_ros.models.vlm import DEFAULT_CLASS_PROMPTS, TABLE1_PROMPT

    corpus = sorted(set(captions))
    corpus += [TABLE1_PROMPT, *DEFAULT_CLASS_PROMPTS.values()]
    corpus += [t.format(p) for t in CLIP_TEMPLATES for ps in CLASS_PHRASES.values() for p in ps]
    corpus += [' '.join(DEFAULT_VOCABULARIES[c]) for c in CLASSES]
    corpus.append(' '.join(str(n) for n in range(21)))
    return corpus * 2


def demo_vision_config(config: TrainingConfig) -> dict[str, Any]:
    return {
        'image_size': config.image_size,
        'patch_size': config.patch_size,
        'hidden_size': config.vision_hidden,
        'intermediate_size': 2 * config.vision_hidden,
        'num_hidden_layers': config.vision_layers,
        'num_attention_heads': 4,
        # CLIP's activation for both, so that the BLIP vision tower can start from the CLIP one.
        'hidden_act': 'quick_gelu',
    }


def clip_vision_into_blip(clip_dir: Path, blip: Any) -> None:
    """Start the BLIP vision tower from a trained demo CLIP's (same shape; BLIP fuses q, k, v).

    CLIP's extra pre-encoder LayerNorm has no BLIP counterpart and is dropped; fine-tuning adapts.
    """
    import torch
    from transformers import CLIPModel

    clip = CLIPModel.from_pretrained(clip_dir, local_files_only=True, use_safetensors=True).vision_model
    vision = blip.vision_model
    with torch.no_grad():
        vision.embeddings.class_embedding.copy_(clip.embeddings.class_embedding.view(1, 1, -1))
        vision.embeddings.patch_embedding.weight.copy_(clip.embeddings.patch_embedding.weight)
        vision.embeddings.patch_embedding.bias.zero_()
        vision.embeddings.position_embedding.copy_(clip.embeddings.position_embedding.weight.unsqueeze(0))
        for theirs, ours in zip(clip.encoder.layers, vision.encoder.layers, strict=True):
            attention = theirs.self_attn
            ours.self_attn.qkv.weight.copy_(
                torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
            )
            ours.self_attn.qkv.bias.copy_(
                torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias])
            )
            ours.self_attn.projection.load_state_dict(attention.out_proj.state_dict())
            for name in ('layer_norm1', 'layer_norm2'):
                getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())
            ours.mlp.fc1.load_state_dict(theirs.mlp.fc1.state_dict())
            ours.mlp.fc2.load_state_dict(theirs.mlp.fc2.state_dict())
        vision.post_layernorm.load_state_dict(clip.post_layernorm.state_dict())
