"""A one-line progress bar on stderr, for rank 0 of a training run.

The bar is plain text and the standard library only: the loader adds no dependency (no tqdm) for
something a carriage return does. On a terminal the line redraws at most five times a
second; when stderr is a file or a pipe (CI logs) only the final line is written, so logs
do not fill with redraws. ``train_ddp.py`` draws one for rank 0; run this file to see it:

    python examples/progress.py
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

import pyarrow as pa

from loader import StreamingDataLoader, StreamingDataset

WIDTH = 24
REDRAW_S = 0.2


class ProgressBar:
    """Steps done out of a known total, with elapsed time and a free-form status text."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total = max(1, total)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.start = time.perf_counter()
        self.last_draw = 0.0
        self.done = 0

    def update(self, done: int, status: str = "") -> None:
        """Record that ``done`` steps are finished; redraw when a terminal is watching."""
        self.done = done
        now = time.perf_counter()
        if self.live and (now - self.last_draw >= REDRAW_S or done >= self.total):
            self.last_draw = now
            self.stream.write("\r" + self._line(status))
            self.stream.flush()

    def close(self, status: str = "") -> None:
        """Finish the line (always written, terminal or not)."""
        prefix = "\r" if self.live else ""
        self.stream.write(prefix + self._line(status) + "\n")
        self.stream.flush()

    def _line(self, status: str) -> str:
        filled = WIDTH * min(self.done, self.total) // self.total
        bar = "#" * filled + "." * (WIDTH - filled)
        seconds = time.perf_counter() - self.start
        return f"  {self.label} [{bar}] {self.done}/{self.total} steps {seconds:5.1f}s {status}"


def main() -> None:
    """The bar over one epoch of a small in-memory table, drawn on stdout."""
    print(__doc__.split("\n\n")[0])
    ds = StreamingDataset(pa.table({"id": range(96)}), num_splits=4, shuffle_seed=0)
    dl = StreamingDataLoader(ds, batch_size=8)
    bar = ProgressBar(len(dl), "demo", stream=sys.stdout)
    rows = 0
    for step, batch in enumerate(dl, start=1):
        rows += len(batch["id"])
        bar.update(step, f"{rows} rows")
    bar.close(f"{rows} rows read")


if __name__ == "__main__":
    main()
