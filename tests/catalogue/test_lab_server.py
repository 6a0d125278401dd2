"""``workbench.catalogue.lab_server``: JupyterLab started on a loopback port answers with its token only, a kernel
started through its API is shut down by ``shut_down_kernels``, and the server is gone after the ``with``."""

import json
import socket
import urllib.error
import urllib.request

import pytest

from workbench.catalogue.lab_server import jupyterlab_server, shut_down_kernels


@pytest.mark.slow  # a JupyterLab server and one kernel: ~10 s
def test_a_server_with_a_kernel_shut_down_and_stopped(tmp_path):
    (tmp_path / "root").mkdir()
    with jupyterlab_server(tmp_path / "root", tmp_path, token="t0ken") as (base, token):
        headers = {"Authorization": f"token {token}"}
        with urllib.request.urlopen(urllib.request.Request(f"{base}/api/status", headers=headers), timeout=30) as reply:
            assert reply.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/kernels", timeout=30)
        assert refused.value.code == 403
        start = urllib.request.Request(f"{base}/api/kernels", data=json.dumps({"name": "python3"}).encode(), method="POST",
                                       headers={**headers, "Content-Type": "application/json"})
        urllib.request.urlopen(start, timeout=60).close()
        assert shut_down_kernels(base, token) == 1 and shut_down_kernels(base, token) == 0
        port = int(base.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert (tmp_path / "jupyterlab.log").exists()
