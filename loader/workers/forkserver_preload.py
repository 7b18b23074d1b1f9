"""Imported only by the forkserver that starts DataLoader workers (`clean_worker_context`
preloads it): that process outlives a SIGTERM sent to the whole job, as its workers do,
since a worker whose forkserver is gone reads as dead to the main process. It still
leaves when the main process does (it watches its parent). Never import it elsewhere."""

from loader.workers.preemption import ignore_sigterm

ignore_sigterm()
