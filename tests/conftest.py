import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tokenizer():
    from workbench.modeling.tokenizer import load_char_tokenizer

    return load_char_tokenizer()


def pytest_configure(config):
    """One torch thread per xdist worker: two workers on two cores, not four threads fighting for them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
