"""A Starlette app served by uvicorn as users run it (`uvicorn.run`), for `record --async`
on real servers.

Usage: server_uvicorn.py SECONDS
Every request's endpoint awaits three coroutines in turn, handle -> step_a -> step_b ->
step_c, and step_c does about 3 ms of CPU work in pure Python (cpu_work). It serves on a
free loopback port, prints "ready port=PORT" when the app starts (uvicorn listens right
after), and exits on SIGTERM/SIGINT (uvicorn's own handlers) or after SECONDS.
"""
import asyncio
import contextlib
import os
import signal
import socket
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

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
    return PlainTextResponse("%d\n" % n)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = free_port()


@contextlib.asynccontextmanager
async def lifespan(app):
    asyncio.get_running_loop().call_later(SECONDS, os.kill, os.getpid(), signal.SIGINT)
    print("ready port=%d" % PORT, flush=True)
    yield


app = Starlette(routes=[Route("/", handle)], lifespan=lifespan)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", access_log=False)
