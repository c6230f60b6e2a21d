"""asyncio tasks whose await stacks change all the time, for `record --async --mode wall`.

Usage: task_churn.py SECONDS N
N tasks (automatic names, gathered by the root task "churn") loop: a little CPU work, then
`await step_a()` (sleeps 0-2 ms) or `await step_b()` (waits 0-2 ms for an Event set by a
timer), chosen at random; tasks also end and are replaced. Every wait stack that really
happens is worker (line of `await step_a()`) -> step_a -> sleep, or worker (line of
`await step_b()`) -> step_b -> Event.wait. Prints "ready", and exits after SECONDS.
"""
import asyncio
import random
import sys
import time

SECONDS = float(sys.argv[1])
N = int(sys.argv[2])


async def step_a():
    await asyncio.sleep(random.random() * 0.002)


async def step_b():
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(random.random() * 0.002, event.set)
    await event.wait()


async def worker():
    for _ in range(random.randint(5, 50)):
        x = 0
        for i in range(random.randint(10, 300)):
            x += i
        if random.random() < 0.5:
            await step_a()
        else:
            await step_b()


async def forever():
    while True:
        await asyncio.gather(*(asyncio.create_task(worker()) for _ in range(N)))


async def main():
    root = asyncio.create_task(forever(), name="churn")
    await asyncio.sleep(0.2)
    print("ready", flush=True)
    await asyncio.sleep(SECONDS)
    root.cancel()


asyncio.run(main())
