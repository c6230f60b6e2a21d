"""A WSGI app served by waitress (PyPI, pure Python) as users run it (`waitress.serve`): a
threaded server, for wall-mode recordings under `--max-cpu`.

Usage: server_waitress.py THREADS SECONDS
waitress's main thread runs its socket loop and hands each request to one of THREADS worker
threads (its task dispatcher, idle in `Condition.wait`). Every request runs `handle`, which
calls `cpu_work` (about 0.3 ms of CPU in pure Python) on even request numbers and `io_wait`
(a 1 ms `time.sleep`) on odd ones. It serves on a free loopback port, prints
"ready port=PORT" just before serving, and exits on SIGTERM/SIGINT or after SECONDS.
"""
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time

import waitress

THREADS = int(sys.argv[1])
SECONDS = float(sys.argv[2])
WORK = 0.0003
WAIT = 0.001
counter = itertools.count()


def cpu_work(seconds):
    until = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < until:
        x += 1
    return x


def io_wait(seconds):
    time.sleep(seconds)
    return 0


def handle(n):
    return cpu_work(WORK) if n % 2 == 0 else io_wait(WAIT)


def app(environ, start_response):
    body = b"%d\n" % handle(next(counter))
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    port = free_port()
    # Its queue-depth warnings on a busy moment are noise here.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    # waitress installs no signal handlers: end as a service manager would.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    threading.Timer(SECONDS, lambda: os._exit(0)).start()
    print("ready port=%d" % port, flush=True)
    waitress.serve(app, host="127.0.0.1", port=port, threads=THREADS, connection_limit=1000, _quiet=True)


if __name__ == "__main__":
    main()
