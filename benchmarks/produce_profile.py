"""Where a node's CPU goes under acks=all produce load: py-spy on three real nodes, one flame
graph PNG per node and the functions with the most samples of their own.

    python -m benchmarks.produce_profile [--seconds 10] [--partitions 6] [--out DIR]

Three node processes (raftlog.testing.cluster), one RF 3 topic (min ISR 2), and the replication
benchmark's producer (confluent-kafka, acks=all, 1 KiB records) in its own process streaming
as fast as it can, while py-spy samples every node (`--nonblocking`, so the nodes are not
paused; `--gil`, so only the thread running Python is sampled: without it the worker threads
waiting for their next fsync and the event loop waiting in epoll count as busy and fill most
of the graph) for `--seconds`. Writes `<out>/node-<id>.txt` (collapsed stacks),
`<out>/node-<id>.png` (flame graph, widest frames at the bottom) and prints the top self-time
functions summed over the nodes. The last stdout line is one JSON object: {"samples",
"top_self": [[function, share], ...], "mb_s", "pngs"}.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import console, emit_result, mb_per_s
from raftlog.testing.cluster import ProcessCluster

TOPIC = "profile-rf3"
RECORD_BYTES = 1024
SAMPLE_RATE_HZ = 200
TOP_FUNCTIONS = 25
# Frames narrower than this share of the samples are not drawn (they would be a pixel wide).
MIN_DRAWN_SHARE = 0.002
LABELLED_SHARE = 0.02
WARM_UP_S = 2.0


def _producer(bootstrap: str, seconds: float, results: Any) -> None:
    from confluent_kafka import Producer

    from benchmarks.replication import PRODUCER_SETTINGS, blast

    class _Bar:
        def tick(self) -> None:
            pass

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **PRODUCER_SETTINGS})
    started = time.monotonic()
    tally = blast(producer, TOPIC, seconds, os.urandom(RECORD_BYTES), _Bar())
    results.put((tally.acked_bytes, time.monotonic() - started))


def _frame_name(frame: str) -> str:
    """py-spy's raw frame `function (path/to/module.py:line)` as `module.function`."""
    function, _, where = frame.partition(" (")
    module = Path(where.split(":", 1)[0]).stem if where else ""
    return f"{module}.{function}" if module else function


def read_collapsed(path: Path) -> collections.Counter[tuple[str, ...]]:
    """Collapsed stacks (`frame;frame;... count`, root first) as stack -> samples."""
    stacks: collections.Counter[tuple[str, ...]] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = tuple(_frame_name(f) for f in stack.split(";") if not f.startswith("process "))
        stacks[frames] += int(count)
    return stacks


def self_time(stacks: collections.Counter[tuple[str, ...]]) -> collections.Counter[str]:
    own: collections.Counter[str] = collections.Counter()
    for frames, count in stacks.items():
        if frames:
            own[frames[-1]] += count
    return own


def plot_flame_graph(stacks: collections.Counter[tuple[str, ...]], title: str, png: Path) -> None:
    """An icicle-style flame graph: the root at the bottom, a frame as wide as its samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    total = sum(stacks.values())
    if total == 0:
        return
    # A tree of frames: path -> samples, children in the order first seen.
    width: dict[tuple[str, ...], int] = collections.Counter()
    children: dict[tuple[str, ...], list[tuple[str, ...]]] = collections.defaultdict(list)
    for frames, count in stacks.items():
        for depth in range(1, len(frames) + 1):
            path = frames[:depth]
            if path not in width:
                children[frames[: depth - 1]].append(path)
            width[path] += count
    boxes: list[tuple[float, int, float, str]] = []

    def place(path: tuple[str, ...], left: float) -> None:
        for child in sorted(children.get(path, []), key=lambda c: c[-1]):
            share = width[child] / total
            if share >= MIN_DRAWN_SHARE:
                boxes.append((left, len(child) - 1, share, child[-1]))
                place(child, left)
            left += share

    place((), 0.0)
    depth = 1 + max((d for _, d, _, _ in boxes), default=0)
    figure, axes = plt.subplots(figsize=(18, max(4.0, 0.28 * depth + 1)))
    palette = plt.get_cmap("YlOrRd")
    for left, level, share, name in boxes:
        colour = palette(0.25 + 0.5 * (hash(name) % 97) / 97)
        axes.barh(level, share, left=left, height=0.92, color=colour, edgecolor="white", lw=0.3)
        if share >= LABELLED_SHARE:
            label = name if len(name) * 0.0052 < share else name[: max(3, int(share / 0.0052))]
            axes.text(left + 0.002, level, label, va="center", ha="left", fontsize=6.5)
    axes.set_xlim(0, 1)
    axes.set_ylim(-0.5, depth - 0.5)
    axes.set_yticks([])
    axes.set_xlabel("share of samples")
    axes.set_title(f"{title} ({total} samples)")
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=110)
    plt.close(figure)


def run(seconds: float, partitions: int, out: Path, root: Path) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.mkdir(parents=True, exist_ok=True)
    with ProcessCluster(root / "cluster", 3, {"replica_lag_time_max_ms": 10_000}) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        topic = NewTopic(TOPIC, partitions, 3, config={"min.insync.replicas": "2"})
        admin.create_topics([topic])[TOPIC].result(30)
        cluster.wait_for(
            lambda: (
                all(p["leader_id"] > 0 for p in cluster.describe()["topics"].get(TOPIC, []))
                and len(cluster.describe()["topics"].get(TOPIC, [])) == partitions
            ),
            "leaders for the profiled topic",
        )
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        producer = context.Process(
            target=_producer, args=(cluster.bootstrap_servers, seconds + 2 * WARM_UP_S, results)
        )
        producer.start()
        # Sampling starts once the producer is streaming.
        time.sleep(WARM_UP_S)
        spies = {}
        for node_id, node in cluster.nodes.items():
            assert node.process is not None
            command = [py_spy, "record", "--pid", str(node.process.pid), "--rate",
                       str(SAMPLE_RATE_HZ), "--duration", str(int(seconds)), "--format", "raw",
                       "--nonblocking", "--gil",
                       "--output", str(out / f"node-{node_id}.txt")]  # fmt: skip
            spies[node_id] = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        console.log(f"sampling {len(spies)} nodes for {seconds:.0f} s at {SAMPLE_RATE_HZ} Hz")
        for node_id, spy in spies.items():
            _, err = spy.communicate(timeout=seconds + 60)
            if spy.returncode != 0:
                raise RuntimeError(f"py-spy on node {node_id} failed: {err.decode()[-2000:]}")
        acked, elapsed = results.get(timeout=seconds + 120)
        producer.join(30)
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    pngs = []
    for node_id in sorted(spies):
        stacks = read_collapsed(out / f"node-{node_id}.txt")
        samples += sum(stacks.values())
        total.update(self_time(stacks))
        png = out / f"node-{node_id}.png"
        plot_flame_graph(stacks, f"node {node_id}, acks=all RF 3 produce", png)
        pngs.append(str(png))
    top = [(name, round(count / samples, 4)) for name, count in total.most_common(TOP_FUNCTIONS)]
    for name, share in top:
        console.print(f"{share * 100:6.2f} %  {name}")
    return {"samples": samples, "top_self": top, "mb_s": mb_per_s(acked, elapsed), "pngs": pngs}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling time")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/produce_profile"))
    args = parser.parse_args()
    if not 1 <= args.seconds <= 600 or not 1 <= args.partitions <= 1000:
        parser.error("--seconds must be in 1..600 and --partitions in 1..1000")
    with tempfile.TemporaryDirectory(prefix="raftlog-profile-") as tmp:
        emit_result(run(args.seconds, args.partitions, args.out, Path(tmp)))


if __name__ == "__main__":
    main()
