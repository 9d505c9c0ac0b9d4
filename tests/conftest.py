"""Shared test fixtures: the repo root on sys.path, the ../shared/data location, deterministic CPU threads."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED_DATA = ROOT.parent / "shared" / "data"

torch.set_num_threads(2)


@pytest.fixture
def shared_data() -> Path:
    """../shared/data beside the repo; tests that need it skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA
