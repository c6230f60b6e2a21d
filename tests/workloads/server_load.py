"""Load for the server workloads: CONNECTIONS threads, each sending GET / over one
keep-alive HTTP/1.1 connection (http.client) as fast as the server answers.

Usage: server_load.py PORT CONNECTIONS SECONDS
Retries connecting for up to 30 s (the server may still be starting), prints "ready" after
the first answer, and stops on SIGTERM or after SECONDS, printing "done requests=N errors=E".
"""
import http.client
import signal
import sys
import threading
import time

PORT = int(sys.argv[1])
CONNECTIONS = int(sys.argv[2])
DEADLINE = time.monotonic() + float(sys.argv[3])
stop = threading.Event()
first = threading.Event()
counts = [0, 0]
lock = threading.Lock()


def client():
    conn = None
    while not stop.is_set() and time.monotonic() < DEADLINE:
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
            conn.request("GET", "/")
            resp = conn.getresponse()
            resp.read()
            ok = resp.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.05)
        with lock:
            counts[0 if ok else 1] += 1
        if ok:
            first.set()
    if conn is not None:
        conn.close()


def main():
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=client, daemon=True) for _ in range(CONNECTIONS)]
    for t in threads:
        t.start()
    if first.wait(30):
        print("ready", flush=True)
    else:
        print("no answer from port %d" % PORT, flush=True)
        stop.set()
    while not stop.is_set() and time.monotonic() < DEADLINE:
        stop.wait(0.1)
    stop.set()
    for t in threads:
        t.join(15)
    print("done requests=%d errors=%d" % tuple(counts), flush=True)


if __name__ == "__main__":
    main()
