from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import trio

from raftlog.config import NodeConfig
from raftlog.net.kafka.apis import ApiRegistry
from raftlog.net.kafka.server import serve
from tests.kafka.memory_backend import MemoryBackend

# Small enough that the oversized-frame test needs no big buffer.
TEST_MAX_FRAME_BYTES = 1024 * 1024


@dataclasses.dataclass
class Broker:
    backend: MemoryBackend
    port: int
    config: NodeConfig

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_broker(
    nursery: trio.Nursery, data_dir: Path, registry: ApiRegistry | None = None
) -> Broker:
    backend = MemoryBackend(data_dir)
    config = NodeConfig(socket_request_max_bytes=TEST_MAX_FRAME_BYTES)
    listeners = await nursery.start(
        partial(serve, backend, "127.0.0.1", 0, config, registry=registry)
    )
    port = listeners[0].socket.getsockname()[1]
    backend.port = port
    return Broker(backend, port, config)


@pytest.fixture
async def broker(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Broker]:
    started = await start_broker(nursery, tmp_path)
    yield started
    started.backend.close()
