"""The log-probability generation itself gives a chat model's greedy answer, token by token, and the check
that a chat model's pixel scores are its answers."""

import numpy as np
import pytest
import torch


def generated_log_probability(backend, frame: np.ndarray, max_new_tokens: int) -> float:
    """The sum of the log-probabilities `generate` gave the tokens of the `vlm` backend's count answer
    about `frame`, its end token included where it ended (generate pads after it)."""
    chat = backend.chat
    with torch.no_grad():
        inputs = chat.prompt_inputs([frame], [backend.asked.question])
        output = chat.model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, output_logits=True,
            return_dict_in_generate=True, pad_token_id=chat.tokenizer.pad_token_id,
        )  # fmt: skip
    ends, total = set(np.atleast_1d(chat.model.generation_config.eos_token_id).tolist()), 0.0
    for step, token in enumerate(output.sequences[0, inputs['input_ids'].shape[1] :].tolist()):
        total += float(torch.log_softmax(output.logits[step][0].float(), -1)[token])
        if token in ends:
            break
    return total


def assert_pixel_scores_are_the_answers(confidence, count, frame: np.ndarray, max_new_tokens: int) -> None:
    """Through a chat model's differentiable pixel path, gradients reach the pixels, a yes/no model's
    pixel scores are predict's confidences (stated tolerance 1e-4) and a count model's the
    log-probability generation gave its answer (relative 1e-4)."""
    pixels = torch.from_numpy(frame).permute(2, 0, 1)[None].float().requires_grad_()
    scores = confidence.pixel_scores(pixels)
    scores.sum().backward()
    assert torch.isfinite(pixels.grad).all() and pixels.grad.abs().max() > 0
    expected = list(confidence.predict([frame])[0].values.values())
    np.testing.assert_allclose(scores.detach().numpy()[0], expected, atol=1e-4)
    answer = count.pixel_scores(pixels.detach())[0, 0].item()
    assert answer == pytest.approx(generated_log_probability(count, frame, max_new_tokens), rel=1e-4)
