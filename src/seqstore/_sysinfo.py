"""Process memory figures for the demos (Linux ``/proc``; zeros elsewhere)."""

from __future__ import annotations

__all__ = ["rss_bytes"]


def rss_bytes() -> tuple[int, int]:
    """(private, file-backed) resident bytes of this process.

    File-backed pages are mapped files such as a store: shared through the page cache by every process
    that maps them, and dropped by the kernel under memory pressure. Private (anonymous) pages are what
    this process really owns.
    """
    anon = file = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith(("RssFile:", "RssShmem:")):
                    file += int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, file
