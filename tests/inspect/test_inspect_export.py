"""export.verl_batch_records on a batch in verl's layout (a stand-in with DataProto's three attributes; the peer test
runs it on verl's own DataProto): left padding dropped, responses cut at their length, finish from the EOS."""

from types import SimpleNamespace

import numpy as np
import torch

from workbench.inspect import inspect
from workbench.inspect.export import verl_batch_records


def test_verl_layout_becomes_generic_records():
    prompts = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    responses = torch.tensor([[11, 2, 0], [12, 13, 14]])
    attention = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    batch = SimpleNamespace(
        batch={"prompts": prompts, "responses": responses, "attention_mask": attention,
               "response_mask": torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
               "rollout_log_probs": torch.tensor([[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]),
               "old_log_probs": torch.tensor([[-0.5, -0.5, 0.0], [-1.0, -2.0, -3.0]]),
               "token_level_scores": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.5]])},
        non_tensor_batch={"uid": np.array(["u", "u"], dtype=object)}, meta_info={"temperature": 0.7})
    first, second = verl_batch_records(batch, step=4, eos_token_id=2, policy_version=3)
    assert first["prompt_ids"] == [5, 6] and first["response_ids"] == [11, 2] and first["loss_mask"] == [1, 1]
    assert first["rollout_logprobs"] == [-0.5, -0.25] and first["trainer_logprobs"] == [-0.5, -0.5]
    assert (first["finish"], second["finish"]) == ("stop", "length") and second["reward"] == 0.5
    assert first["temperature"] == 0.7 and first["group"] == "u" and first["policy_version"] == 3
    report = inspect([first, second], show_progress=False)
    assert report.observed["response_tokens"] == 5 and report.metrics["rollout_corr/kl"] == 0.25 / 5  # mean(rollout − trainer)
