"""Imported only by the forkserver that starts DataLoader workers (`clean_worker_context`
preloads it): that process outlives a SIGTERM sent to the whole job, as its workers do,
since a worker whose forkserver is gone reads as dead to the main process. It leaves
once the main process and its workers are gone (they hold its pipe; each worker leaves
with its main process: `preemption.leave_with`). Never import it elsewhere."""

from loader.workers.preemption import ignore_sigterm

ignore_sigterm()
