"""Fixtures the pitfall test files share: the tiny trained checkpoint their catalogue checks run on."""

import pytest

from workbench.experiments.checkpoints import load


@pytest.fixture(scope="module")
def qwen():
    """tiny-arith-qwen2 (model, tokenizer), loaded once per test module."""
    return load("tiny-arith-qwen2")
