"""Imported only by the forkserver that starts DataLoader workers (`clean_worker_context`
preloads it): that process outlives a SIGTERM sent to the whole job, as its workers do,
since a worker whose forkserver is gone reads as dead to the main process. It leaves
once the main process and its workers are gone (they hold its pipe; each worker leaves
with its main process: `preemption.leave_with`). Never import it elsewhere.

Lance warns "lance is not fork-safe" at every fork of a process that imported it. The
forkserver imports Lance (so workers start warm) but never runs it, so its forks are the
safe case that warning recommends: it is silenced here, in this process only. A plain
`fork` of a main process that read a table still warns, as it should."""

import warnings

from loader.workers.preemption import ignore_sigterm

warnings.filterwarnings("ignore", message="lance is not fork-safe", category=UserWarning)
ignore_sigterm()
