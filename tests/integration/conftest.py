import pytest

from raftlog.testing.cluster import ProcessCluster


@pytest.fixture
def cluster(tmp_path):
    """Three real node processes on loopback, ready (every broker unfenced)."""
    with ProcessCluster(tmp_path / "cluster", 3) as running:
        yield running
