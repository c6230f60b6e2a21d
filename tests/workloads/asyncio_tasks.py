"""asyncio task graphs for `record --async`.

Usage: asyncio_tasks.py MODE SECONDS
  chain:  task A awaits task B, which awaits task C; C runs CPU-bound code (c_work) all along.
  gather: task P gathers three tasks child_0..child_2; each runs child_work in 20 ms slices
          and yields to the loop between them, so all three run in turn.
  chain-thread: chain, with the event loop on a second thread (on a free-threaded build that
          thread runs its own copy of the coroutines' bytecode).
Prints "ready" once the CPU-bound tasks run, and exits after SECONDS.
"""
import asyncio
import sys
import time

SECONDS = float(sys.argv[2])
DEADLINE = time.monotonic() + SECONDS


def c_work(until):
    x = 0
    while time.monotonic() < until:
        x += 1
    return x


async def c_coro():
    print("ready", flush=True)
    return c_work(DEADLINE)


async def b_coro():
    return await asyncio.create_task(c_coro(), name="C")


async def a_coro():
    return await asyncio.create_task(b_coro(), name="B")


def child_work(until):
    x = 0
    while time.monotonic() < until:
        x += 1
    return x


async def child(index, started):
    started.append(index)
    if len(started) == 3:
        print("ready", flush=True)
    while time.monotonic() < DEADLINE:
        child_work(time.monotonic() + 0.02)
        await asyncio.sleep(0)


async def parent():
    started = []
    children = [asyncio.create_task(child(i, started), name="child_%d" % i) for i in range(3)]
    await asyncio.gather(*children)


async def main():
    if sys.argv[1].startswith("chain"):
        await asyncio.create_task(a_coro(), name="A")
    else:
        await asyncio.create_task(parent(), name="P")


if sys.argv[1] == "chain-thread":
    import threading

    loop_thread = threading.Thread(target=asyncio.run, args=(main(),), name="loop")
    loop_thread.start()
    loop_thread.join()
else:
    asyncio.run(main())
