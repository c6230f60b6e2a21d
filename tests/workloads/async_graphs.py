"""asyncio task graphs of every shape, for `record --async` (tests/tests/async_graphs.rs).

Usage: async_graphs.py MODE SECONDS

Each MODE is one scenario of CPython's own tests (Lib/test/test_external_inspection.py and
Lib/test/test_profiling/test_sampling_profiler/test_async.py), written anew. Where CPython's
scenario blocks its innermost task in time.sleep, here that task runs CPU-bound Python
(leaf_work, or worker_leaf/main_leaf) so that a sampler sees it on the CPU:

  taskgroup        test_async_remote_stack_trace: a TaskGroup in taskgroup_main creates
                   c2_root (c2 > c3 > c4 > leaf_work) and sub_main_1, sub_main_2 (c1, each
                   awaiting c2_root): c2_root is awaited by three tasks.
  taskgroup_eager  the same with the eager task factory (its second variant).
  asyncgen         test_asyncgen_remote_stack_trace: asyncgen_main iterates the async
                   generator gen, which awaits gen_nested_call > leaf_work.
  gather           test_async_gather_remote_stack_trace: gather_main gathers gather_c1
                   (> deep > leaf_work) and gather_c2 (done at once).
  staggered        test_async_staggered_race_remote_stack_trace: staggered_race([stag_c1,
                   stag_c2]) in staggered_main; stag_c1 > deep > leaf_work in the race's task.
  server           test_async_global_awaited_by: a TaskGroup holding an echo server's
                   serve_forever ("server task") and "echo client spam", whose own TaskGroup
                   holds 100 echo_client tasks; once all 100 got their echo, each runs
                   leaf_work in 20 ms slices, yielding between them.
  tombstone        test_async_awaited_by_skips_set_tombstones: the main task ("victim") is
                   marked awaited by tasks "removed" (hash 0) and "remaining" (hash 1), then
                   "removed" is discarded: its awaiters' set holds a deleted entry before the
                   only live one. Then victim runs leaf_work.
  thread_loop      test_async_remote_stack_trace_from_non_main_thread (and ..._global_
                   awaited_by_from_non_main_thread): a thread "async-worker" runs its own
                   loop, worker_main awaiting "worker task" (worker_task > worker_leaf);
                   the main thread's loop runs thread_loop_main awaiting "main side"
                   (main_side > main_leaf) at the same time.
  eager_step       the issue's aiohttp pattern: task "conn" (serve_conn) sets the eager task
                   factory and awaits loop.create_task(handle(i)) in a loop; handle runs
                   leaf_work 20 ms inside conn's step (eager), yields, then 20 ms in its own
                   step.
  ordering         test_frame_ordering: tasks Root (root_bottom > root_top), Middle
                   (mid_bottom > mid_top) and Leaf (leaf_bottom > leaf_top > leaf_work), each
                   awaiting the next.
  diamond          test_diamond_pattern_multiple_parents and test_complex_multi_parent_
                   convergence: tasks A (a_await) and B (b_await) both gather tasks X and Y
                   (converge, leaf_work in 20 ms slices): X and Y are each awaited by two.
  cycle            test_cycle_detection: the main task "victim" and task "other" are marked
                   as awaiting each other (no root); victim runs leaf_work.
  forged           deliverable 7 of issue #27: a chain of 256 tasks link_0 ... link_255
                   (link_i awaits link_{i-1}; the root task forged_main awaits link_255);
                   link_0 runs leaf_work. Each link's awaiters are made a set of 1,201
                   entries: the real awaiter plus 1,200 real idle tasks added with
                   asyncio.future_add_to_awaited_by (the same 1,200 for every link, so the
                   process holds ~1,500 tasks instead of ~300,000). Then every entry of a
                   set that names an idle task is overwritten, with ctypes, by the real
                   awaiter (key and hash; its reference count raised to match): whichever
                   entry a reader picks, the chain goes on for all 256 levels, and each level
                   still says 1,201 awaiters. Only a reader reads these sets; nothing in the
                   process touches them again (nothing completes, and the process ends by
                   SIGTERM or os._exit, without tearing down).

Prints "ready <pid>" once the CPU-bound leaf runs (both leaves in thread_loop); stops on
SIGTERM or after SECONDS. CPython 3.14+ (future_add_to_awaited_by).
"""
import asyncio
import ctypes
import gc
import os
import sys
import threading
import time
from asyncio.staggered import staggered_race

MODE = sys.argv[1]
SECONDS = float(sys.argv[2])
DEADLINE = time.monotonic() + SECONDS
READY_NEEDED = 2 if MODE == "thread_loop" else 1
_ready = []
_ready_lock = threading.Lock()


def say_ready():
    with _ready_lock:
        _ready.append(1)
        if len(_ready) == READY_NEEDED:
            print("ready %d" % os.getpid(), flush=True)


def leaf_work(seconds=None):
    until = DEADLINE if seconds is None else min(DEADLINE, time.monotonic() + seconds)
    x = 0
    while time.monotonic() < until:
        x += 1
    return x


def worker_leaf():
    x = 0
    while time.monotonic() < DEADLINE:
        x += 1
    return x


def main_leaf():
    x = 0
    while time.monotonic() < DEADLINE:
        x += 1
    return x


def once_ready(flag=[]):
    if not flag:
        flag.append(1)
        say_ready()


async def slices():
    """leaf_work in 20 ms slices, yielding to the loop between them, until the deadline."""
    once_ready()
    while time.monotonic() < DEADLINE:
        leaf_work(0.02)
        await asyncio.sleep(0)


# --- taskgroup, taskgroup_eager ---------------------------------------------------------

async def c4():
    await asyncio.sleep(0)
    say_ready()
    leaf_work()


async def c3():
    await c4()


async def c2():
    await c3()


async def c1(task):
    await task


async def taskgroup_main():
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(c2(), name="c2_root")
        tg.create_task(c1(task), name="sub_main_1")
        tg.create_task(c1(task), name="sub_main_2")


def new_eager_loop():
    loop = asyncio.new_event_loop()
    loop.set_task_factory(asyncio.create_eager_task_factory(asyncio.Task))
    return loop


# --- asyncgen ---------------------------------------------------------------------------

async def gen_nested_call():
    say_ready()
    leaf_work()


async def gen():
    for num in range(2):
        yield num
        if num == 1:
            await gen_nested_call()


async def asyncgen_main():
    async for _ in gen():
        pass


# --- gather, staggered ------------------------------------------------------------------

async def deep():
    await asyncio.sleep(0)
    say_ready()
    leaf_work()


async def gather_c1():
    await asyncio.sleep(0)
    await deep()


async def gather_c2():
    await asyncio.sleep(0)


async def gather_main():
    await asyncio.gather(gather_c1(), gather_c2())


async def stag_c1():
    await asyncio.sleep(0)
    await deep()


async def stag_c2():
    await asyncio.sleep(10_000)


async def staggered_main():
    await staggered_race([stag_c1, stag_c2], delay=None)


# --- server -----------------------------------------------------------------------------

N_CLIENTS = 100


class EchoServerProtocol(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)
        self.transport.close()


async def echo_client(port, message, echoed, all_echoed):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(message)
    await writer.drain()
    data = await reader.read(100)
    assert data == message, (data, message)
    writer.close()
    await writer.wait_closed()
    echoed.append(1)
    if len(echoed) == N_CLIENTS:
        all_echoed.set()
    await all_echoed.wait()
    once_ready()
    while time.monotonic() < DEADLINE:
        leaf_work(0.02)
        await asyncio.sleep(0)


async def echo_client_spam(port):
    echoed = []
    all_echoed = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        for i in range(N_CLIENTS):
            tg.create_task(echo_client(port, b"message %d" % i, echoed, all_echoed))
            await asyncio.sleep(0)


async def server_main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(EchoServerProtocol, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(server.serve_forever(), name="server task")
            tg.create_task(echo_client_spam(port), name="echo client spam")


# --- tombstone, cycle -------------------------------------------------------------------

class RemovedTask(asyncio.Task):
    def __hash__(self):
        return 0


class RemainingTask(asyncio.Task):
    def __hash__(self):
        return 1


async def tombstone_main():
    victim = asyncio.current_task()
    victim.set_name("victim")
    removed = RemovedTask(asyncio.sleep(10_000), name="removed")
    remaining = RemainingTask(asyncio.sleep(10_000), name="remaining")
    asyncio.future_add_to_awaited_by(victim, removed)
    asyncio.future_add_to_awaited_by(victim, remaining)
    # Hash 0 goes to slot 0, hash 1 to slot 1: discarding "removed" leaves a deleted entry
    # (a dummy) before the only live one.
    asyncio.future_discard_from_awaited_by(victim, removed)
    await asyncio.sleep(0)  # both start, and wait in asyncio.sleep
    say_ready()
    leaf_work()


async def cycle_main():
    victim = asyncio.current_task()
    victim.set_name("victim")
    other = asyncio.create_task(asyncio.sleep(10_000), name="other")
    await asyncio.sleep(0)
    asyncio.future_add_to_awaited_by(victim, other)
    asyncio.future_add_to_awaited_by(other, victim)
    say_ready()
    leaf_work()


# --- thread_loop ------------------------------------------------------------------------

async def worker_task():
    await asyncio.sleep(0)
    say_ready()
    worker_leaf()


async def worker_main():
    task = asyncio.create_task(worker_task(), name="worker task")
    await task


async def main_side():
    await asyncio.sleep(0)
    say_ready()
    main_leaf()


async def thread_loop_main():
    threading.Thread(target=asyncio.run, args=(worker_main(),), name="async-worker", daemon=True).start()
    await asyncio.create_task(main_side(), name="main side")


# --- eager_step -------------------------------------------------------------------------

async def handle(i):
    leaf_work(0.02)  # marker: eager half
    await asyncio.sleep(0)
    leaf_work(0.02)  # marker: own step
    return i


async def serve_conn():
    loop = asyncio.get_running_loop()
    loop.set_task_factory(asyncio.eager_task_factory)
    once_ready()
    i = 0
    while time.monotonic() < DEADLINE:
        await loop.create_task(handle(i))
        i += 1


async def eager_main():
    await asyncio.create_task(serve_conn(), name="conn")


# --- ordering ---------------------------------------------------------------------------

async def leaf_top():
    await asyncio.sleep(0)
    say_ready()
    leaf_work()


async def leaf_bottom():
    await leaf_top()


async def mid_top():
    await asyncio.create_task(leaf_bottom(), name="Leaf")


async def mid_bottom():
    await mid_top()


async def root_top():
    await asyncio.create_task(mid_bottom(), name="Middle")


async def root_bottom():
    await root_top()


async def ordering_main():
    await asyncio.create_task(root_bottom(), name="Root")


# --- diamond ----------------------------------------------------------------------------

async def converge():
    await asyncio.sleep(0)
    await slices()


async def a_await(x, y):
    await asyncio.gather(x, y)


async def b_await(x, y):
    await asyncio.gather(x, y)


async def diamond_main():
    x = asyncio.create_task(converge(), name="X")
    y = asyncio.create_task(converge(), name="Y")
    a = asyncio.create_task(a_await(x, y), name="A")
    b = asyncio.create_task(b_await(x, y), name="B")
    await asyncio.gather(a, b)


# --- forged -----------------------------------------------------------------------------

CHAIN = 256
FILLERS = 1200

# PySetObject of a default (GIL) build, 3.14 and 3.15: ob_refcnt, ob_type, fill, used,
# mask, table; a table entry is {PyObject *key; Py_hash_t hash}. Checked below against
# len() before anything is written.
SET_USED, SET_MASK, SET_TABLE, ENTRY = 24, 32, 40, 16


def word(address):
    return ctypes.c_ssize_t.from_address(address)


def forge_awaiters(task, awaiter, fillers):
    """Overwrites every entry of task's awaiters' set that names a filler with awaiter."""
    sets = [r for r in gc.get_referents(task) if type(r) is set]
    assert len(sets) == 1 and len(sets[0]) == FILLERS + 1, "no awaiters' set of %d" % (FILLERS + 1)
    s = sets[0]
    base = id(s)
    assert word(base + SET_USED).value == len(s), "unexpected set layout"
    mask = word(base + SET_MASK).value
    assert mask + 1 >= len(s) and (mask + 1) & mask == 0, "unexpected set layout"
    table = word(base + SET_TABLE).value
    filler_ids = {id(f) for f in fillers}
    written = 0
    for slot in range(mask + 1):
        key = word(table + slot * ENTRY)
        if key.value in filler_ids:
            key.value = id(awaiter)
            word(table + slot * ENTRY + 8).value = hash(awaiter)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(awaiter))
            written += 1
    assert written == FILLERS, written
    return s


async def idle(future):
    await future


async def link(previous):
    await previous


async def bottom(go):
    await go
    say_ready()
    leaf_work()
    os._exit(0)


async def forge_all(chain, root, go, fillers, keep):
    await asyncio.sleep(0)  # every link and the root task wait by now
    for i, task in enumerate(chain):
        awaiter = chain[i + 1] if i + 1 < len(chain) else root
        for f in fillers:
            asyncio.future_add_to_awaited_by(task, f)
        keep.append(forge_awaiters(task, awaiter, fillers))
    go.set_result(None)


async def forged_main():
    loop = asyncio.get_running_loop()
    never = loop.create_future()
    go = loop.create_future()
    fillers = [asyncio.create_task(idle(never), name="idle_%d" % i) for i in range(FILLERS)]
    chain = [asyncio.create_task(bottom(go), name="link_0")]
    for i in range(1, CHAIN):
        chain.append(asyncio.create_task(link(chain[-1]), name="link_%d" % i))
    keep = []
    asyncio.create_task(forge_all(chain, asyncio.current_task(), go, fillers, keep), name="forger")
    await chain[-1]


MODES = {
    "taskgroup": taskgroup_main,
    "taskgroup_eager": taskgroup_main,
    "asyncgen": asyncgen_main,
    "gather": gather_main,
    "staggered": staggered_main,
    "server": server_main,
    "tombstone": tombstone_main,
    "cycle": cycle_main,
    "thread_loop": thread_loop_main,
    "eager_step": eager_main,
    "ordering": ordering_main,
    "diamond": diamond_main,
    "forged": forged_main,
}

# A watchdog: the process ends SECONDS after it started, whatever its loops do.
threading.Timer(SECONDS + 2, os._exit, (0,)).start()
asyncio.run(MODES[MODE](), loop_factory=new_eager_loop if MODE == "taskgroup_eager" else None)
os._exit(0)
