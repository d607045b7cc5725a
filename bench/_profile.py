"""Where a server's CPU goes, from a py-spy collapsed-stack file (``py-spy record --format raw``).

Each sample is one stack ``frame;frame;... count`` (root first), a frame being ``function (file:line)``.
Two views: *inclusive* (share of samples with any frame of a category on the stack: logging inside a
store call counts for both) and *attributed* (each sample to the category of the frame nearest its leaf
that belongs to one, so the shares add up to 100 %). py-spy counts some blocked waits as busy (a lock
acquire with a timeout, ``epoll_wait``): samples whose leaf is one of :data:`IDLE_LEAVES` are left out
and their share is printed apart.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

__all__ = ["CATEGORIES", "summarize"]

#: category -> path fragments of its frames (py-spy prints paths relative to their ``sys.path`` entry),
#: checked in this order.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "logging": ("structlog/", "proxy/log.py", "orjson", "proxy/context.py", "runtime/context.py"),
    "metrics": ("proxy/metrics.py", "prometheus"),
    "store": ("backends/embedded/", "lmdb"),
    "mqtt codec": ("codecs/mqtt",),
    "remoting codec": ("codecs/remoting", "codecs/message_record"),
    "topic matching": ("mqtt/subscriptions.py", "model/topics"),
    "mqtt": ("mqtt/",),
    "remoting": ("remoting/", "remoting_client/"),
    "facade": ("facade/",),
    "runtime streams": ("runtime/",),
    "socket syscalls": ("trio/_socket.py", "_io_epoll.py"),
    "worker threads": ("trio/_threads.py", "trio/_core/_thread_cache.py"),
    "trio": ("trio/", "outcome/", "contextlib.py"),
}


#: Leaf frames that are waits, not work: idle trio worker threads, the log flusher's timer, epoll_wait.
IDLE_LEAVES: tuple[str, ...] = (
    "WorkerThread._work (trio/_core/_thread_cache.py:211)",
    "Condition.wait (threading.py:",
    "EpollIOManager.get_events (trio/_core/_io_epoll.py",
)


def _category(frame: str) -> str | None:
    for name, fragments in CATEGORIES.items():
        if any(fragment in frame for fragment in fragments):
            return name
    return None


def summarize(path: Path, top: int = 12) -> str:
    """A few lines: inclusive and attributed shares per category, and the top leaf functions."""
    inclusive: Counter[str] = Counter()
    attributed: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if any(frames[-1].strip().startswith(leaf) for leaf in IDLE_LEAVES):
            idle += count
            continue
        total += count
        cats = [_category(frame) for frame in frames]
        for cat in set(cats) - {None}:
            inclusive[cat] += count  # type: ignore[index]
        owner = next((cat for cat in reversed(cats) if cat is not None), "other")
        attributed[owner] += count
        leaves[frames[-1].strip()] += count
    if not total:
        return "  (no samples)"
    lines = [f"  {total} busy samples ({idle} idle ones left out)"]
    lines.append(
        "  attributed: " + ", ".join(f"{cat} {n / total:.1%}" for cat, n in attributed.most_common())
    )
    lines.append("  inclusive:  " + ", ".join(f"{cat} {n / total:.1%}" for cat, n in inclusive.most_common()))
    lines.append("  top leaf frames:")
    lines.extend(f"    {n / total:5.1%} {frame[:110]}" for frame, n in leaves.most_common(top))
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    for arg in sys.argv[1:]:
        print(f"{arg}:\n{summarize(Path(arg))}")
