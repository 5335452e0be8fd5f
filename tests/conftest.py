"""Options shared by every test package."""

from __future__ import annotations

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
