"""Shared fixtures: the array frameworks under test (numpy always; torch when installed) and the
gpu marker (tests that need a CUDA device skip cleanly without one)."""

import importlib.util

import numpy as np
import pytest

import msa

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def cuda_usable():
    if not HAVE_TORCH or not msa.has_cuda:
        return False
    import torch

    return torch.cuda.is_available() and msa.cuda_device_count() > 0


FRAMEWORKS = ["numpy"] + (["torch"] if HAVE_TORCH else [])


@pytest.fixture(params=FRAMEWORKS)
def framework(request):
    return request.param


def pytest_collection_modifyitems(config, items):
    if cuda_usable():
        return
    why = "no CUDA device" if msa.has_cuda else "msa was built without the CUDA backend"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the test's name, printed on failure by pytest's repr."""
    seed = abs(hash(request.node.nodeid)) % (2**32)
    return np.random.default_rng(seed)
