import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER = os.path.dirname(HERE)
REPO = os.path.dirname(ADAPTER)
for path in (ADAPTER, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

# Tiny cases: one intra-op thread is much faster than a thread pool (backends.py: configure_torch).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo():
    return REPO
