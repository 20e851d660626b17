"""The tests' network guard: loopback only, in this process and in the processes it starts."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def test_connections_beyond_loopback_are_refused_and_recorded(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import sitecustomize

    log = tmp_path / "guard.log"
    monkeypatch.setattr(sitecustomize, "_LOG", str(log))  # not the session's log: that one must stay empty
    with socket.socket() as s, pytest.raises(ConnectionRefusedError, match="loopback only"):
        s.connect(("169.254.169.254", 80))  # the instance-metadata address cloud SDKs probe
    assert "169.254.169.254" in log.read_text()
    with socket.socket() as s:  # loopback is fine (nothing listens on port 9: refused by the kernel)
        assert s.connect_ex(("127.0.0.1", 9)) != 0

    child = tmp_path / "child.log"
    code = ("import socket\ntry:\n    socket.create_connection(('10.255.255.1', 80), timeout=1)\n"
            "except ConnectionRefusedError as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PRX_NETGUARD_LOG": str(child)}, check=True)
    assert "loopback only" in out.stdout and "10.255.255.1" in child.read_text()
