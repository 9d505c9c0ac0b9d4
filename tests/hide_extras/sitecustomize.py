"""NGRPO_HIDE_EXTRAS=1: the optional packages made unimportable, as on a machine where only requirements.txt is
installed (.ci/run checks the tests of optional features this way, without a second environment). tests/conftest.py
runs this file in the test process and puts its folder first on PYTHONPATH, so that every Python process a test
starts (train.py, eval.py, the reward workers) runs it too, as Python's sitecustomize."""

import os
import sys

# pyproject.toml's extras (tests/test_packaging.py keeps them in this list), then what a code path imports only
# when asked: a .parquet problem file (pyarrow) and bench.py trl (trl); and what only a test imports: PEFT, which
# loads our saved adapters (tests/test_lora.py).
HIDDEN = ("math_verify", "matplotlib", "tensorboard", "wandb", "pyarrow", "trl", "peft")

if os.environ.get("NGRPO_HIDE_EXTRAS"):
    for module in HIDDEN:
        # None in sys.modules: `import` raises ModuleNotFoundError and importlib.util.find_spec returns None,
        # as for a package that is not installed.
        sys.modules[module] = None
