"""Peer driver: the Python `limits` package on Redis (redis-py), for tollgate-bench.

Run by the harness, not by hand:

    python limits_bench.py <port> <decisions> <concurrency> <subjects> <limit per second> <fixed|moving> <async|sync>

`async` uses limits.aio with RedisStorage(implementation="redispy") and
<concurrency> asyncio tasks (redis-py's asyncio pool opens a connection per
request in flight); `sync` makes the calls one at a time. Warms up, prints
"ready", waits for "go" on stdin, makes <decisions> hit() calls, then prints
"result decisions=N seconds=S denied=D cpu_seconds=C" (C: the process's
CPU time during the run).
"""

import asyncio
import sys
import time

from limits import RateLimitItemPerSecond


def main() -> None:
    port, decisions, concurrency, subjects, limit = (int(a) for a in sys.argv[1:6])
    strategy, mode = sys.argv[6], sys.argv[7]
    item = RateLimitItemPerSecond(limit, 1)
    uri = f"redis://127.0.0.1:{port}"
    if mode == "async":
        asyncio.run(run_async(uri, item, strategy, decisions, concurrency, subjects))
    else:
        run_sync(uri, item, strategy, decisions, subjects)


def wait_for_go() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()


def report(decisions: int, seconds: float, denied: int, cpu_seconds: float) -> None:
    sys.stdout.write(
        f"result decisions={decisions} seconds={seconds} denied={denied} cpu_seconds={cpu_seconds}\n"
    )
    sys.stdout.flush()


async def run_async(uri, item, strategy, decisions, concurrency, subjects):
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

    storage = RedisStorage(
        "async+" + uri,
        implementation="redispy",
        key_prefix=f"tgbench-limits-{strategy}",
        max_connections=concurrency + 4,
    )
    cls = FixedWindowRateLimiter if strategy == "fixed" else MovingWindowRateLimiter
    limiter = cls(storage)
    denied = 0

    async def worker(state, total):
        nonlocal denied
        while True:
            i = state[0]
            if i >= total:
                return
            state[0] = i + 1
            if not await limiter.hit(item, f"u{i % subjects}"):
                denied += 1

    async def run(total):
        state = [0]
        await asyncio.gather(*(worker(state, total) for _ in range(concurrency)))

    await run(min(decisions, 2000))
    denied = 0
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, wait_for_go)
    c0, t0 = time.process_time(), time.perf_counter()
    await run(decisions)
    report(decisions, time.perf_counter() - t0, denied, time.process_time() - c0)


def run_sync(uri, item, strategy, decisions, subjects):
    from limits.storage import RedisStorage
    from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

    storage = RedisStorage(uri, key_prefix=f"tgbench-limits-sync-{strategy}")
    cls = FixedWindowRateLimiter if strategy == "fixed" else MovingWindowRateLimiter
    limiter = cls(storage)
    for i in range(min(decisions, 2000)):
        limiter.hit(item, f"u{i % subjects}")
    wait_for_go()
    denied = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(decisions):
        if not limiter.hit(item, f"u{i % subjects}"):
            denied += 1
    report(decisions, time.perf_counter() - t0, denied, time.process_time() - c0)


if __name__ == "__main__":
    main()
