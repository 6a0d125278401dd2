"""The kernel class of a catalogue kernel forked from the zygote (``catalogue.kernel_fork``): IPython's own kernel,
with one more step at shutdown — the training workers' fork server (``core.worker_processes``) leaves first.

Why: on a shutdown request ipykernel signals every child in the kernel's process group and then sleeps 0.01, 0.03,
0.1, 0.3, 1 and 3 seconds for as long as any child is still listed — and a fork server it has terminated stays listed,
as a zombie, because nothing in the kernel reaps it. jupyter_client waits 2.5 s for the kernel to end and then kills
it: left alone, every notebook of the catalogue takes about 2.6 s from its last cell to its kernel's end (an ordinary
kernel: 0.4 s), and its kernel never runs its exit handlers. Stopping the server here (its alive pipe closed, the
process reaped) before ipykernel looks for children lets the kernel end as an ordinary one does. A failure to stop it
is logged, not raised: the shutdown reply must still go out (else jupyter_client kills the kernel after 2.5 s).

A shutdown request runs on the kernel's control thread: if a cell is still training in worker processes then (a batch
run's timeout), its workers die with the server after ``SERVER_STOP_SECONDS``, the cell fails, and the kernel ends.
"""

from __future__ import annotations

from ipykernel.ipkernel import IPythonKernel

from workbench.core import worker_processes

SERVER_STOP_SECONDS = 1.0  # a worker still running holds the server's alive pipe: it is killed with the server after this


class CatalogueKernel(IPythonKernel):
    def do_shutdown(self, restart):
        try:
            worker_processes.stop_fork_server(timeout_s=SERVER_STOP_SECONDS)
        except Exception:  # noqa: BLE001 — the reply to the shutdown request must still be sent
            self.log.exception("could not stop the fork server for training workers")
        return super().do_shutdown(restart)
