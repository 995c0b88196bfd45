"""What the Python harnesses (api_fuzz.py, client_roundtrip.py, console_test.py) share: a
free loopback port, waiting for something to listen on one, and a throwaway redis-server.

One copy instead of three, for the same reason the Rust side has `sluice::redis_server`: a
launcher fixed in one place is fixed everywhere. The command line is the one
`redis_server::command` builds without persistence (loopback only, nothing written to disk).
"""

import socket
import subprocess
import time


def free_port():
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, deadline_s=30):
    """Returns once something accepts connections on `port`; raises after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {deadline_s} s")


def start_redis(data_dir, stdout=subprocess.DEVNULL, stderr=None):
    """Starts a redis-server on a free loopback port with its files in `data_dir`, and waits
    until it accepts connections. Returns the process and its URL; the caller stops it."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", data_dir,
         "--save", "", "--daemonize", "no", "--appendonly", "no"],
        stdout=stdout, stderr=stderr)
    try:
        wait_port(port)
    except RuntimeError:
        proc.kill()
        raise
    return proc, f"redis://127.0.0.1:{port}"
