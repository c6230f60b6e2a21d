"""Suspended asyncio tasks in known await stacks, for `record --async --mode wall`.

Usage: task_waits.py SECONDS N_SLEEP N_LOCK N_QUEUE
Three root tasks with explicit names each gather tasks with automatic names:
  "sleepers": N_SLEEP tasks sleeper -> nap -> asyncio.sleep
  "lockers":  N_LOCK tasks locked -> Lock.acquire (the lock is held all along)
  "getters":  N_QUEUE tasks queued -> Queue.get (nothing is ever put)
Prints "ready" once every task is suspended, and exits after SECONDS.
"""
import asyncio
import sys

SECONDS = float(sys.argv[1])
N_SLEEP, N_LOCK, N_QUEUE = (int(a) for a in sys.argv[2:5])


async def nap():
    await asyncio.sleep(3600)


async def sleeper():
    await nap()


async def locked(lock):
    async with lock:
        pass


async def queued(queue):
    await queue.get()


async def group(n, make):
    await asyncio.gather(*(asyncio.create_task(make()) for _ in range(n)))


async def main():
    lock = asyncio.Lock()
    await lock.acquire()
    queue = asyncio.Queue()
    roots = [
        asyncio.create_task(group(N_SLEEP, sleeper), name="sleepers"),
        asyncio.create_task(group(N_LOCK, lambda: locked(lock)), name="lockers"),
        asyncio.create_task(group(N_QUEUE, lambda: queued(queue)), name="getters"),
    ]
    # Two turns of the loop: every task has started and is suspended.
    await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    print("ready", flush=True)
    await asyncio.sleep(SECONDS)
    for r in roots:
        r.cancel()


asyncio.run(main())
