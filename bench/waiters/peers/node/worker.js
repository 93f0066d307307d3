#!/usr/bin/env node
// A worker process of ../driver.py for the Node.js peers: `waiters` waiters on one key, each an
// async task with an ioredis client of its own. Speaks driver.py's worker protocol: prints
// {"ev":"ready"} once every waiter is connected and warmed up, reads "start <ns>" (a
// CLOCK_MONOTONIC instant) and then "stop", and prints its {"ev":"result"} line.
//
//   node worker.js --peer node-redlock|redis-semaphore --url URL --waiters N --counter FILE
//                  [--requeue after-handover|at-once]
//
// Attempts: the Redis commands an acquire() sends after its first (each try is one SET NX or
// one EVALSHA of the acquire script), counted on the waiter's own client. Both libraries sleep
// between tries, so each attempt follows a timer's wake-up: wake-ups are counted as attempts.
"use strict";

const fs = require("fs");
const readline = require("readline");
const Redis = require("ioredis");

const KEY = "waiters-bench";
const TTL_MS = 30000;
const now = () => process.hrtime.bigint(); // CLOCK_MONOTONIC on Linux, as driver.py's
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function args(argv) {
  const a = { requeue: "after-handover" };
  for (let i = 0; i < argv.length; i += 2) a[argv[i].replace(/^--/, "")] = argv[i + 1];
  a.waiters = parseInt(a.waiters, 10);
  return a;
}

function readCounter(path) {
  try {
    return parseInt(fs.readFileSync(path, "utf8"), 10) || 0;
  } catch (e) {
    return 0;
  }
}

// One waiter: its client, and acquire/release with the library's blocking defaults.
function makeWaiter(a, stats) {
  const client = new Redis(a.url, { enableAutoPipelining: false, lazyConnect: false });
  let sent = 0;
  const send = client.sendCommand.bind(client);
  client.sendCommand = (cmd, stream) => {
    sent++;
    return send(cmd, stream);
  };
  const counted = async (acquire) => {
    const before = sent;
    const r = await acquire();
    if (stats.open) stats.attempts += Math.max(0, sent - before - 1);
    return r;
  };
  if (a.peer === "node-redlock") {
    const Redlock = require("redlock").default;
    // The defaults: retry after 200 ± 100 ms; retryCount -1 blocks until the key is taken.
    const redlock = new Redlock([client], { retryCount: -1 });
    let lock = null;
    return {
      client,
      acquire: () => counted(async () => { lock = await redlock.acquire([KEY], TTL_MS); }),
      release: async () => { const l = lock; lock = null; await l.release(); },
    };
  }
  if (a.peer === "redis-semaphore") {
    const { Mutex } = require("redis-semaphore");
    // The defaults (SET NX every retryInterval = 10 ms), acquireTimeout raised so that
    // acquire() blocks for a whole run.
    const m = new Mutex(client, KEY, { lockTimeout: TTL_MS, acquireTimeout: 3600 * 1000 });
    return { client, acquire: () => counted(() => m.acquire()), release: () => m.release() };
  }
  throw new Error(`unknown peer ${a.peer}`);
}

async function main() {
  const a = args(process.argv.slice(2));
  const stats = { open: false, attempts: 0 };
  const waiters = [];
  for (let i = 0; i < a.waiters; i++) waiters.push(makeWaiter(a, stats));
  await Promise.all(waiters.map((w) => w.client.ping()));
  for (const w of waiters) {
    await w.acquire();
    await w.release();
  }
  const lines = readline.createInterface({ input: process.stdin });
  const it = lines[Symbol.asyncIterator]();
  process.stdout.write(JSON.stringify({ ev: "ready" }) + "\n");
  const start = BigInt((await it.next()).value.split(" ")[1]);
  const state = { stopped: false, inCs: 0 };
  const holds = [];
  let errors = 0;
  let firstError = null;

  const run = async (i) => {
    const w = waiters[i];
    for (;;) {
      const t0 = now();
      try {
        await w.acquire();
      } catch (e) {
        errors++;
        firstError = firstError || `acquire: ${e && e.message}`;
        await sleep(10);
        continue;
      }
      const t1 = now();
      if (state.stopped) {
        await w.release();
        return;
      }
      state.inCs++;
      const n = readCounter(a.counter) + 1;
      fs.writeFileSync(a.counter, String(n));
      if (a.requeue === "after-handover" && n > 1) {
        // Hold until the previous holder has queued again (driver.py does the same).
        const until = Date.now() + 50;
        while (!fs.existsSync(`${a.counter}.q${n - 1}`) && Date.now() < until) await sleep(0.2);
      }
      const t2 = now();
      try {
        await w.release();
      } catch (e) {
        errors++;
        firstError = firstError || `release: ${e && e.message}`;
      }
      holds.push([t0.toString(), t1.toString(), t2.toString(), i]);
      state.inCs--;
      if (a.requeue === "after-handover") {
        while (readCounter(a.counter) === n && !state.stopped) await sleep(0.5);
        fs.writeFileSync(`${a.counter}.q${n}`, "");
      }
    }
  };

  while (now() < start) await sleep(Math.max(0, Number((start - now()) / 1000000n)));
  stats.open = true;
  const cpu0 = process.cpuUsage();
  for (let i = 0; i < a.waiters; i++) run(i);
  await it.next(); // the coordinator's stop (or EOF)
  const cpu = process.cpuUsage(cpu0);
  stats.open = false;
  state.stopped = true;
  const deadline = Date.now() + 5000;
  while (state.inCs > 0 && Date.now() < deadline) await sleep(1);
  const line = JSON.stringify({
    ev: "result", holds, cpu_s: (cpu.user + cpu.system) / 1e6, attempts: stats.attempts,
    wakeups: stats.attempts, errors, first_error: firstError,
  }).replace(/"(\d{6,})"/g, "$1");
  // Waiters still in acquire() are left behind.
  process.stdout.write(line + "\n", () => process.exit(0));
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ ev: "failed", error: String(e && e.stack) }) + "\n");
  process.exit(1);
});
