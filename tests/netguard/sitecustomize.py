"""Loopback only: every Python process the tests start imports this (``PYTHONPATH``), and a
connection to any other address is refused and written to ``$PRX_NETGUARD_LOG``, which the test
session checks at its end (``tests/conftest.py``). Cloud SDKs probe the instance-metadata address
169.254.169.254 when they find no credentials; nothing here may reach beyond this machine."""

import ipaddress
import os
import socket

_LOG = os.environ.get("PRX_NETGUARD_LOG")


def _loopback(address: object) -> bool:
    host = address[0] if isinstance(address, tuple) and address else address
    if not isinstance(host, str):
        return True  # AF_UNIX paths and the like
    if host in ("localhost", ""):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False  # a name other than localhost would be resolved: refuse it
    return ip.is_loopback or ip.is_unspecified


def _guard(original):
    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
            if _LOG:
                with open(_LOG, "a") as f:
                    f.write(f"{os.getpid()} {address!r}\n")
            raise ConnectionRefusedError(f"prx tests: connection to {address!r} refused (loopback only)")
        return original(self, address)
    return connect


if os.environ.get("PRX_NETGUARD") == "1":
    socket.socket.connect = _guard(socket.socket.connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = _guard(socket.socket.connect_ex)  # type: ignore[method-assign]
