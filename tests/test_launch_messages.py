"""The dashboard command's messages (issue 25 point 6): a port in use is named with its
flag and the way out (it used to print the other instance's URL as its own, then "Streamlit
exited" with no reason); a wildcard `--host` gives ranks this machine's name, not loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import launch


@pytest.fixture
def taken() -> Iterator[int]:
    """A port held (listening) on 127.0.0.1, as another dashboard would hold it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("flag", ["--port", "--ui-port"])
def test_a_port_in_use_is_named_with_its_flag(
    flag: str, taken: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = {"--port": "0", "--ui-port": "0"} | {flag: str(taken)}
    argv = [a for kv in ports.items() for a in kv] + ["--db", str(tmp_path / "d.db")]
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert f"port {taken} ({flag}) is already in use on 127.0.0.1" in err, err
    assert f"{flag} 0 picks one" in err
    assert "Dashboard:" not in capsys.readouterr().out  # no URL of the other instance


def test_a_wildcard_host_gives_ranks_this_machines_name() -> None:
    url = launch.ranks_url("0.0.0.0", 8765)
    assert url == f"http://{launch.machine_name()}:8765"
    assert launch.machine_name() in (socket.gethostname(), socket.getfqdn())
    assert "127.0.0.1" not in url and "localhost" not in url
    assert launch.ranks_url("10.0.0.5", 8765) == "http://10.0.0.5:8765"
    assert launch.ranks_url("::", 8765).startswith("http://") and "::" not in launch.ranks_url(
        "::", 1
    )
