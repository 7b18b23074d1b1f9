"""Start the collector and the Streamlit dashboard together: `elastic-loader-dashboard`.

The collector runs in this process (a uvicorn server on a thread: starts in well under a
second, and tests can start and stop it in-process); Streamlit runs as a child process,
because it owns its own event loop and script runner. `start_dashboard` returns a handle
with both URLs and `stop()`; `run_dashboard` is the CLI: it prints the URL and waits for
Ctrl-C or SIGTERM; `main` parses its arguments (`elastic-loader dashboard` forwards here).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from dashboard.client import ENV_API, ENV_API_TOKEN
from dashboard.collector.config import ENV_DB, ENV_HOST, ENV_TOKEN, Settings, is_loopback
from dashboard.collector.main import create_app

APP = Path(__file__).with_name("app.py")


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _reachable(host: str) -> str:
    """Where a local client connects to a server bound to `host` (a wildcard means loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (bind to 0); for the Streamlit child, which must be told one."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _wait(
    ok: Callable[[], bool],
    what: str,
    deadline: float,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll `ok` until the deadline; give up at once if `proc` died (e.g. its port was taken)."""
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        if ok():
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    why = "exited" if proc is not None and proc.poll() is not None else "did not answer in time"
    raise RuntimeError(f"{what} {why}\n{tail}".rstrip())


def _http_ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=1) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


@dataclass
class DashboardHandle:
    """A running collector (and dashboard); `stop()` ends both, within a few seconds."""

    api_url: str
    ui_url: str | None
    settings: Settings
    _server: uvicorn.Server
    _thread: threading.Thread
    _ui: subprocess.Popen[bytes] | None = None
    _ui_log: Path | None = None
    _stopped: bool = field(default=False, repr=False)

    def ui_alive(self) -> bool:
        return self._ui is None or self._ui.poll() is None

    def ui_log_tail(self, chars: int = 2000) -> str:
        """The end of Streamlit's output: why it exited."""
        log = self._ui_log
        return log.read_text(errors="replace")[-chars:].strip() if log and log.exists() else ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._ui is not None and self._ui.poll() is None:
            self._ui.terminate()
            try:
                self._ui.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._ui.kill()
                self._ui.wait()
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._ui_log is not None:
            self._ui_log.unlink(missing_ok=True)

    def __enter__(self) -> DashboardHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_collector_process(
    db: str | Path, host: str = "127.0.0.1", timeout_s: float = 60.0
) -> tuple[subprocess.Popen[bytes], str]:
    """The collector alone, in its own process (uvicorn serving `create_app`).

    For benchmarks that must not share the collector's GIL and tests that SIGKILL it.
    Returns the process and its URL once `/health` answers.
    """
    port = free_port(host)
    env = {**os.environ, ENV_DB: str(db), ENV_HOST: host}
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "dashboard.collector.main:create_app"]
    cmd += ["--host", host]
    cmd += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(cmd, env=env)
    url = _url(_reachable(host), port)
    try:
        _wait(
            lambda: _http_ok(url + "/health"), "the collector", time.monotonic() + timeout_s, proc
        )
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, url


def _in_use(host: str, port: int, flag: str) -> RuntimeError:
    return RuntimeError(
        f"port {port} ({flag}) is already in use on {host}: another dashboard or program "
        f"holds it; stop it, or pass {flag} with a free port ({flag} 0 picks one)"
    )


def check_free(host: str, port: int, flag: str) -> None:
    """RuntimeError naming `flag` when `port` cannot be bound on `host` (0: any port is)."""
    if not port:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise _in_use(host, port, flag) from None


def ranks_url(host: str, port: int) -> str:
    """The collector URL to give ranks on other machines: a wildcard bind (0.0.0.0, ::) is
    reached at this machine's name, never at loopback (another host's loopback is itself)."""
    if host in ("0.0.0.0", "::", ""):
        return _url(machine_name(), port)
    return _url(host, port)


def machine_name() -> str:
    """This machine's name as other machines would use it: its fully qualified name where
    the resolver gives one, else its host name (never 'localhost')."""
    name = socket.gethostname()
    fqdn = socket.getfqdn(name)
    return fqdn if "." in fqdn and not fqdn.startswith("localhost") else name


def _serve_collector(settings: Settings, port: int) -> tuple[uvicorn.Server, threading.Thread, int]:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, port))
    except OSError:
        sock.close()
        raise _in_use(settings.host, port, "--port") from None
    config = uvicorn.Config(create_app(settings), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="collector", daemon=True
    )
    thread.start()
    return server, thread, int(sock.getsockname()[1])


def _spawn_ui(
    host: str, ui_port: int, api_url: str, token: str | None
) -> tuple[subprocess.Popen[bytes], Path]:
    env = {**os.environ, ENV_API: api_url}
    if token:
        env[ENV_API_TOKEN] = token
    fd, name = tempfile.mkstemp(prefix="elastic-dashboard-", suffix=".log")
    os.close(fd)  # reopened below for the child; keeping this one would leak it
    log = Path(name)
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true"]
    cmd += ["--server.address", host, "--server.port", str(ui_port)]
    cmd += ["--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    cmd += ["--global.developmentMode", "false", "--client.toolbarMode", "viewer"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def start_dashboard(
    host: str = "127.0.0.1",
    port: int = 8765,
    ui_port: int = 8501,
    token: str | None = None,
    db: str = "dashboard.db",
    *,
    ui: bool = True,
    ready_timeout_s: float = 60.0,
    **options: Any,
) -> DashboardHandle:
    """Start the collector (and, with `ui`, Streamlit) and return once both answer.

    `port=0` / `ui_port=0` pick free ports; `options` are further `Settings` fields
    (`allowed_hosts`, `keep_runs`, `keep_days`, ...). Raises `ValueError` for a non-loopback
    host without a token, `RuntimeError` if a part does not come up within `ready_timeout_s`.
    """
    settings = Settings(db=str(db), token=token, host=host, **options)
    settings.check_bind()
    deadline = time.monotonic() + ready_timeout_s
    server, thread, port = _serve_collector(settings, port)
    api_url = _url(_reachable(host), port)
    handle = DashboardHandle(api_url, None, settings, server, thread)
    try:
        _wait(lambda: server.started, "the collector", deadline)
        if ui:
            check_free(host, ui_port, "--ui-port")  # else the other's Streamlit would answer
            ui_port = ui_port or free_port(host)
            handle._ui, handle._ui_log = _spawn_ui(host, ui_port, api_url, token)
            handle.ui_url = _url(_reachable(host), ui_port)
            health = handle.ui_url + "/_stcore/health"
            ui_proc, log = handle._ui, handle._ui_log
            _wait(lambda: _http_ok(health), "the Streamlit dashboard", deadline, ui_proc, log)
    except BaseException:
        handle.stop()
        raise
    return handle


def run_dashboard(
    host: str = "127.0.0.1",
    port: int = 8765,
    ui_port: int = 8501,
    token: str | None = None,
    db: str = "dashboard.db",
    **options: Any,
) -> int:
    """The `elastic-loader-dashboard` command: start, print the URLs, run until a signal.

    Without `--token`, the token is read from the environment, which keeps it out of `ps`.
    """
    token = token or os.environ.get(ENV_TOKEN) or None
    try:
        handle = start_dashboard(host, port, ui_port, token, db, **options)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"elastic-loader dashboard: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while starting: what started was stopped
        return 130
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, _on_signal)
    where = "" if is_loopback(host) else f" (bound to {host}; ranks need the token)"
    ui_port = int(str(handle.ui_url).rsplit(":", 1)[1])
    print(f"Dashboard:  {ranks_url(host, ui_port)}{where}")  # a wildcard: this machine's name
    print(f"Collector:  {handle.api_url}  (API docs at {handle.api_url}/docs)")
    port = int(handle.api_url.rsplit(":", 1)[1])
    print(f"Ranks:      export ELASTIC_LOADER_TELEMETRY={ranks_url(host, port)}")
    print("Ctrl-C to stop.", flush=True)
    code = 0
    try:
        while not stop.wait(0.5):
            if not handle.ui_alive():
                why = handle.ui_log_tail() or "no output"
                print(f"elastic-loader dashboard: Streamlit exited:\n{why}", file=sys.stderr)
                code = 1
                break
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
        signal.signal(signal.SIGTERM, previous)
    return code


def _seconds(text: str) -> float:
    """A positive number of seconds (argparse names the option in its message)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds (e.g. 300)")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-loader-dashboard",
        description="Start the collector and the Streamlit dashboard; run until Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="collector port")
    parser.add_argument("--ui-port", type=int, default=8501, help="Streamlit port")
    parser.add_argument("--token", default=None, help="required to bind beyond loopback")
    parser.add_argument("--db", default="dashboard.db", help="SQLite file for events")
    parser.add_argument(
        "--allowed-hosts",
        default="",
        help="extra names clients may use in the Host header, comma-separated "
        "(loopback names and --host are always allowed)",
    )
    parser.add_argument("--keep-runs", type=int, default=100, help="retention: newest runs kept")
    parser.add_argument(
        "--keep-days", type=float, default=30.0, help="retention: drop runs silent this long"
    )
    parser.add_argument(
        "--stall-after",
        type=_seconds,
        default=Settings().stall_after_s,
        metavar="SECONDS",
        help="a rank that reports but has not stepped this long reads 'stalled'",
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """The `elastic-loader-dashboard` console script (and `elastic-loader dashboard`)."""
    parser = _build_parser()
    if prog:
        parser.prog = prog
    args = parser.parse_args(argv)
    return run_dashboard(
        host=args.host,
        port=args.port,
        ui_port=args.ui_port,
        token=args.token,
        db=args.db,
        allowed_hosts=tuple(h.strip().lower() for h in args.allowed_hosts.split(",") if h.strip()),
        keep_runs=args.keep_runs,
        keep_days=args.keep_days,
        stall_after_s=args.stall_after,
    )


if __name__ == "__main__":
    sys.exit(main())
