"""Options shared by every test package."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="write actual outputs back into transcript files (tests/**/testdata/*.txt)",
    )


@pytest.fixture
def rewrite(request: pytest.FixtureRequest) -> bool:
    """True when transcripts should be rewritten instead of compared."""
    return bool(request.config.getoption("--rewrite"))


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic GC off for one test: a timing test then measures the code under test, not
    a full collection of the test process's heap (the garbage of every test before it, which
    took 0.1-0.5 s late in a `make test` run)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
