"""The worked examples in the modules' docstrings run and print what they say (doctest)."""

import doctest

import pytest

import eval
import ngrpo

MODULES = [ngrpo, eval]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried > 0 and failures == 0
