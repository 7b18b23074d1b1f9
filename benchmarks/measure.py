"""Run one measurement in this process and print its Result as one JSON line.

``run.py`` starts this once per (loader, case, rank, repetition), so each loader gets a
fresh process (peak memory is its own, no warm state leaks between loaders). With
``world_size`` > 1 the process joins a Gloo group first (MASTER_ADDR/MASTER_PORT from the
environment), as a DDP job would.

    benchmarks/.venv/bin/python benchmarks/measure.py '{"loader": "raw_take"}'
"""

from __future__ import annotations

import dataclasses
import json
import sys

from common import Case


def measure(case: Case) -> dict:
    """Measure ``case`` here; ranks meet in a Gloo group first when there are several."""
    from readers import READERS

    if case.loader not in READERS:
        raise ValueError(f"Unknown loader {case.loader!r}; choose from {sorted(READERS)}")
    if case.world_size > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=case.rank, world_size=case.world_size)
    result = READERS[case.loader](case)
    out = dataclasses.asdict(result)
    return out


def main() -> None:
    case = Case(**json.loads(sys.argv[1]))
    print(json.dumps(measure(case)), flush=True)


if __name__ == "__main__":
    main()
