"""``core.folder_lock``: one writer per output folder — a second process is refused naming the holder and the fix
(however often it asks), holds of one thread nest while another thread of the same process is refused, the lock goes
with its holder however the holder ends (SIGKILL included), and the holder's line goes with the hold."""

import os
import re
import signal
import threading
import time

import pytest

from workbench.core.errors import InputError, RunFolderInUse
from workbench.core.folder_lock import LOCK, held

WORDS = {"writer": "run", "collision": "collide", "fix": "pick another folder"}


def test_another_process_is_refused_naming_the_holder_and_the_fix_every_time(tmp_path, hold_elsewhere):
    with hold_elsewhere(tmp_path, "run") as pid:
        for _ in range(2):  # a refused writer leaves the holder's line in place
            with pytest.raises(RunFolderInUse, match=re.escape(f"{tmp_path} is being written by another run (pid {pid} on ")
                               + r".+, since .+\); two runs in one folder would collide\. .*pick another folder\."):
                with held(tmp_path, **WORDS):
                    pass
        assert (tmp_path / LOCK).read_text().startswith(f"pid {pid} on ")
    assert issubclass(RunFolderInUse, InputError)  # exit code 2 on the command line


def test_holds_of_one_process_nest_and_the_line_goes_with_the_outer_one(tmp_path):
    with held(tmp_path / "a" / "b", **WORDS):  # a missing folder is created
        with held(tmp_path / "a" / "b", **WORDS):
            assert (tmp_path / "a" / "b" / LOCK).read_text().startswith(f"pid {os.getpid()} on ")
        assert (tmp_path / "a" / "b" / LOCK).read_text().startswith(f"pid {os.getpid()} on ")
    assert (tmp_path / "a" / "b" / LOCK).read_text() == ""


def test_the_lock_goes_with_a_killed_holder(tmp_path, hold_elsewhere):
    with hold_elsewhere(tmp_path, "run") as pid:
        with pytest.raises(RunFolderInUse, match=rf"\(pid {pid} on "):
            with held(tmp_path, **WORDS):
                pass
        os.kill(pid, signal.SIGKILL)  # its files are closed as it dies (a zombie holds none): polled, not assumed
        deadline = time.monotonic() + 10
        while True:
            try:
                with held(tmp_path, **WORDS):
                    break
            except RunFolderInUse:
                assert time.monotonic() < deadline, "the lock outlived its SIGKILLed holder"
                time.sleep(0.05)


def test_another_thread_of_the_holding_process_is_refused(tmp_path):
    outcome = {}

    def second_writer():
        try:
            with held(tmp_path, **WORDS):
                outcome["held"] = True
        except RunFolderInUse as error:
            outcome["refused"] = str(error)

    with held(tmp_path, **WORDS):
        thread = threading.Thread(target=second_writer)
        thread.start()
        thread.join(timeout=30)
        assert "held" not in outcome, "a second thread wrote into a held folder"
        assert f"(pid {os.getpid()} on " in outcome["refused"] and ": another thread of this process)" in outcome["refused"]
        with held(tmp_path, **WORDS):  # the holding thread still nests
            pass
        assert (tmp_path / LOCK).read_text().startswith(f"pid {os.getpid()} on ")  # the refusal left the line in place
    thread = threading.Thread(target=second_writer)
    thread.start()
    thread.join(timeout=30)
    assert outcome.get("held") is True  # released: the other thread may write now


def test_a_folder_that_cannot_be_made_is_an_input_error_with_the_fix(tmp_path):
    """Not the bare OSError ('[Errno 20] Not a directory'), which `workbench run --out` would show as a traceback, exit 1."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for folder in (blocker, blocker / "sub"):
        with pytest.raises(InputError, match=rf"cannot make the output folder {re.escape(str(folder))}: .*; name another one"):
            with held(folder, writer="test", collision="collide", fix="name another one"):
                pass
