"""`raftlog topics create` with the cluster's defaults prints the partition count and
replication factor the cluster chose, also when the broker it asks next has not applied the
new topic yet (issue 17: it printed "0 partitions, replication factor 0")."""

from __future__ import annotations

import json

from tests.cli.conftest import Cli


async def test_defaults_are_read_back_once_the_topic_is_visible(raftlog: Cli) -> None:
    backend = raftlog.broker.backend
    backend.default_partitions = 3
    real_topics = backend.topics
    lagging = {"left": 3}

    def topics(names):
        # The first Metadata answers after the create do not list the new topic yet.
        if names is not None and "fresh" in names and lagging["left"] > 0:
            lagging["left"] -= 1
            return [t for t in real_topics(names) if t.name != "fresh"]
        return real_topics(names)

    backend.topics = topics  # type: ignore[method-assign]
    r = await raftlog("topics", "create", "fresh")
    assert (r.exit_code, r.stdout, r.stderr) == (
        0,
        "Created topic fresh (3 partitions, replication factor 1)\n",
        "",
    )
    assert lagging["left"] == 0
    r = await raftlog("topics", "create", "other", "--json")
    assert json.loads(r.stdout)["created"] == {
        "name": "other",
        "partitions": 3,
        "replication_factor": 1,
    }
