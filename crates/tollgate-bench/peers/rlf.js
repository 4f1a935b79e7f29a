// Peer driver: rate-limiter-flexible's RateLimiterRedis (with ioredis), for
// tollgate-bench. Run by the harness, not by hand:
//
//   NODE_PATH=<dir with node_modules> node rlf.js <port> <decisions> <concurrency> <subjects> <limit per second>
//
// Warms up, prints "ready", waits for "go" on stdin, makes <decisions>
// consume() calls with <concurrency> in flight over one ioredis connection
// (ioredis pipelines them, like tollgate's multiplexed connection), then prints
// "result decisions=N seconds=S denied=D cpu_seconds=C" (C: this process's
// CPU time during the run) and exits.
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [port, decisions, concurrency, subjects, limit] = process.argv.slice(2).map(Number);

async function main() {
  const redis = new Redis({ host: '127.0.0.1', port, enableOfflineQueue: true, lazyConnect: false });
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: 'tgbench-rlf',
    points: limit,
    duration: 1,
  });
  let denied = 0;
  async function worker(next, total) {
    for (;;) {
      const i = next.i++;
      if (i >= total) return;
      try {
        await limiter.consume(`u${i % subjects}`, 1);
      } catch (e) {
        if (e instanceof Error) throw e;
        denied++; // a RateLimiterRes: denied
      }
    }
  }
  async function run(total) {
    const next = { i: 0 };
    await Promise.all(Array.from({ length: concurrency }, () => worker(next, total)));
  }
  await run(Math.min(decisions, 5000)); // warm-up: JIT, script load, keys
  denied = 0;
  process.stdout.write('ready\n');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  await run(decisions);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  process.stdout.write(`result decisions=${decisions} seconds=${seconds} denied=${denied} cpu_seconds=${cpuSeconds}\n`);
  redis.disconnect();
  process.stdin.destroy();
}

main().catch((e) => {
  process.stderr.write(`rlf.js: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
