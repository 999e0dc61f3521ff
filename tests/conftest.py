"""Shared test configuration: the ``gpu`` marker skips cleanly without CUDA.

``CHUNKSTREAM_REQUIRE_GPU=1`` turns that skip into a failure, for runs that are
meant to exercise the GPU (``benchmarks/gpu.sh``): a CPU build of torch, or a
machine whose driver torch cannot see, then fails loudly instead of reporting
every GPU test as skipped and the run as green. Tests that need more GPUs than
the machine has (``cuda:1``, two-rank NCCL) still skip, with the count.
"""

from __future__ import annotations

import os

import pytest
import torch

REQUIRE_GPU = os.environ.get("CHUNKSTREAM_REQUIRE_GPU", "") not in ("", "0")


def _why_no_cuda() -> str | None:
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)"
    return "torch.cuda.is_available() is False (no GPU or driver visible to torch)"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if "gpu" not in item.keywords:
        return
    why = _why_no_cuda()
    if why is None:
        return
    if REQUIRE_GPU:
        pytest.fail(f"CHUNKSTREAM_REQUIRE_GPU=1 but {why}", pytrace=False)
    pytest.skip(f"needs a CUDA device: {why}")
