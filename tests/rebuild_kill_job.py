"""A rank that rebuilds its mixture mid-run, as examples/pretrain_mixture.py anneals it, then
is SIGKILLed: `python -m tests.rebuild_kill_job API RUN`. The test
(tests/test_example_runs.py) checks it reads crashed, not closed at the rebuild's step.

One process of a world of one: 4 steps at web:code 3:1, the state taken, the loader dropped
without `close()` and rebuilt at 1:1, 3 more steps once the new loader has reported, SIGKILL.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from loader import StreamingDataLoader
from tests.kinds_feed import mixture_build
from tests.net import wait_until


def main(api: str, run: str) -> None:
    def loader(weights: list[int]) -> StreamingDataLoader:
        ds = mixture_build(0, 1, False, weights)
        return StreamingDataLoader(ds, global_batch_size=8, telemetry=api, run_id=run)

    dl = loader([3, 1])
    it = iter(dl)
    for _ in range(4):
        next(it)
    state = dl.state_dict()
    del it
    dl = loader([1, 1])  # the old loader is dropped here, as the example does
    gc.collect()
    dl.load_state_dict(state)
    client = dl._telemetry.client  # type: ignore[attr-defined]
    wait_until(lambda: client.sent > 0, 120, "the rebuilt loader's first report")
    it = iter(dl)
    for _ in range(3):
        next(it)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(*sys.argv[1:3])
