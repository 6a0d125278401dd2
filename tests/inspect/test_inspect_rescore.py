"""The inspector with a model: P6 (rollout log-probs taken before temperature) planted and clean, text-only responses
tokenised and scored, and a checkpoint that cannot be loaded named as bad input."""

import numpy as np
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.inspect import DumpError, inspect
from workbench.inspect.rescore import Rescorer, load

pytestmark = pytest.mark.slow  # loads a checkpoint with transformers (seconds)

CHECKPOINT = REPO_ROOT / "data" / "checkpoints" / "tiny-arith-qwen2"


@pytest.fixture(scope="module")
def pair():
    return load(CHECKPOINT)


def _rows(pair, before_temperature: bool, temperature=0.5, count=8):
    scorer, rng = Rescorer(pair), np.random.default_rng(0)
    vocabulary = pair[0].config.vocab_size
    rows = []
    for index in range(count):
        prompt, response = rng.integers(3, vocabulary, 6), rng.integers(3, vocabulary, 10)
        logits = scorer._logits(prompt, response)
        at_temperature = scorer._score(logits, response, temperature)
        sampled = scorer._score(logits, response, 1.0) if before_temperature else at_temperature
        rows.append({"step": 0, "group": index // 4, "prompt_ids": prompt.tolist(), "response_ids": response.tolist(),
                     "rollout_logprobs": sampled.tolist(), "trainer_logprobs": at_temperature.tolist(),
                     "reward": float(index % 3), "temperature": temperature})
    return rows


def test_logprobs_before_temperature_are_found(pair):
    report = inspect(_rows(pair, before_temperature=True), model=pair, show_progress=False)
    (p6,) = [item for item in report.findings if item.pitfall == "P6"]
    assert p6.severity == "error" and p6.evidence["best_temperature"] == 1.0 and p6.evidence["recorded_temperature"] == 0.5
    assert p6.evidence["mean_abs_gap_at_best"] < 1e-5 < 0.1 < p6.evidence["mean_abs_gap_at_recorded"]
    (p12,) = [item for item in report.findings if item.pitfall == "P12"]  # the trainer scores at τ: the gap is τ's
    assert all(isinstance(token["text"], str) for token in p12.evidence["top_tokens"])
    clean = inspect(_rows(pair, before_temperature=False), model=pair, show_progress=False)
    assert not [item for item in clean.findings if item.pitfall == "P6"]


def test_text_only_responses_are_tokenised_and_scored(pair):
    rows = [{"step": 0, "group": 0, "prompt_text": "12+3=", "response_text": "15", "reward": 1.0}]
    report = inspect(rows, model=pair, show_progress=False)
    tokens = pair[1]("15", add_special_tokens=False)["input_ids"]
    assert report.observed["text_only"] == 1 and report.observed["response_tokens"] == len(tokens) > 0


def test_a_checkpoint_that_cannot_be_loaded_is_bad_input(tmp_path):
    with pytest.raises(DumpError, match="--model"):
        load(tmp_path / "no-such-checkpoint")
