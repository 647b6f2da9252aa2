"""The head tests run on one thread: their tensors are tiny, and on a shared machine OpenMP's
waiting threads cost more than they give."""

import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    import torch  # each head test module imports it first, or skips for want of it (tests/requirements.py)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
