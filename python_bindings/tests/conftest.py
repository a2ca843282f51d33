"""Fresh random inputs per test: one seed per session from $EXPANSE_TEST_SEED (to rerun a failure) or
the system, and per test a generator seeded from it and the test's name. A failing test prints the
seed and how to rerun it."""

import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # naive.py

SESSION_SEED = int(os.environ.get("EXPANSE_TEST_SEED", np.random.SeedSequence().entropy % 2**31))


@pytest.fixture
def rng(request):
    seed = [SESSION_SEED, zlib.crc32(request.node.nodeid.encode())]
    print(f"seed: EXPANSE_TEST_SEED={SESSION_SEED} (test stream {seed[1]})")
    return np.random.default_rng(seed)


def pytest_report_header(config):
    return f"expanse tests: EXPANSE_TEST_SEED={SESSION_SEED}"
