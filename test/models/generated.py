"""The log-probability generation itself gives a chat model's greedy answer, token by token."""

import numpy as np
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
