"""The worker processes' start method: forkserver, preloaded (why: `clean_worker_context`)."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext


def clean_worker_context() -> BaseContext:
    """Forkserver, preloaded with the reader's imports and warm kernels: workers start fast
    and clean.

    A plain fork copies a parent whose Lance runtime has live threads (it opened and read
    the table); that child can crash or deadlock. Forkserver children fork from a process
    that imported Lance but never ran it, and that has the plan kernels loaded already.
    It ignores SIGTERM, as the workers do (preemption.py). Pass
    multiprocessing_context="fork" to opt out.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["loader.workers.forkserver_preload", "loader.read.reader", "lance", "loader.kernels.warm"]
    )
    return context
