"""An aiohttp server as users run it (`web.run_app`), for `record --async` on real servers.

Usage: server_aiohttp.py SECONDS
Every request's handler awaits three coroutines in turn, handle -> step_a -> step_b ->
step_c, and step_c does about 3 ms of CPU work in pure Python (cpu_work). It serves on a
loopback port chosen by the kernel, prints "ready port=PORT" once it listens, and exits on
SIGTERM/SIGINT (run_app's own handlers) or after SECONDS.
"""
import asyncio
import os
import signal
import socket
import sys
import time

from aiohttp import web

SECONDS = float(sys.argv[1])
WORK = 0.003


def cpu_work(seconds):
    until = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < until:
        x += 1
    return x


async def step_c():
    return cpu_work(WORK)


async def step_b():
    return await step_c()


async def step_a():
    return await step_b()


async def handle(request):
    n = await step_a()
    return web.Response(text="%d\n" % n)


async def stop_later(app):
    # run_app turns SIGINT into its graceful exit.
    asyncio.get_running_loop().call_later(SECONDS, os.kill, os.getpid(), signal.SIGINT)


def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    app = web.Application()
    app.router.add_get("/", handle)
    app.on_startup.append(stop_later)
    print("ready port=%d" % sock.getsockname()[1], flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None, handle_signals=True)


if __name__ == "__main__":
    main()
