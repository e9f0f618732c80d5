// node-redis (the `redis` package pinned in package.json) client-side caching through
// respway, used unchanged.
//
//     node node_csc.mjs --addr RESPWAY_HOST:PORT --shard SHARD_HOST:PORT
//
// Reads through `--addr` with `createClient({ RESP: 3, clientSideCache: {} })` (node-redis
// sends `CLIENT TRACKING ON` and keeps replies until an `invalidate` push names their keys),
// writes directly on the shard behind it (`--shard`), through another client of respway, and
// through the caching client itself, and checks that repeated reads are answered by the
// client's cache (the shard sees no more GETs) and that every write is seen. One line per
// scenario, exit 1 if any failed.

import { createClient } from "redis";
import { eq, fail, runScenarios } from "./common.mjs";

const argv = process.argv.slice(2);
const arg = (name) => {
  const i = argv.indexOf(name);
  if (i < 0 || !argv[i + 1]) {
    console.error(`usage: node node_csc.mjs --addr HOST:PORT --shard HOST:PORT (${name} missing)`);
    process.exit(2);
  }
  return argv[i + 1];
};
const addr = arg("--addr");
const shardAddr = arg("--shard");

async function connect(url, opts = {}) {
  const c = createClient({ url, socket: { connectTimeout: 4000, reconnectStrategy: false }, ...opts });
  c.on("error", () => {});
  await c.connect();
  return c;
}

const r = await connect(`redis://${addr}`, { RESP: 3, clientSideCache: { ttl: 0, maxEntries: 0 } });
const other = await connect(`redis://${addr}`);
const shard = await connect(`redis://${shardAddr}`);
const key = "ncsc:key";

async function gets() {
  const text = await shard.info("commandstats");
  const m = /cmdstat_get:calls=(\d+)/.exec(text);
  return m ? Number(m[1]) : 0;
}

// True once `r.get(key)` answers `want` (polled every 10 ms for at most 2 s).
async function seen(want) {
  const deadline = Date.now() + 2000;
  while (Date.now() < deadline) {
    if ((await r.get(key)) === want) return true;
    await new Promise((res) => setTimeout(res, 10));
  }
  return false;
}

const code = await runScenarios([
  ["served_by_the_cache", async () => {
    await shard.set(key, "v1");
    eq(await r.get(key), "v1", "first read");
    const before = await gets();
    for (let i = 0; i < 20; i++) eq(await r.get(key), "v1", `read ${i}`);
    const after = await gets();
    if (after !== before) fail(`the shard saw ${after - before} GETs for 20 cached reads`);
    if (r.clientSideCache.stats().hitCount < 20) fail(`hits: ${r.clientSideCache.stats().hitCount}`);
  }],
  ["a_direct_write_is_seen", async () => {
    eq(await r.get(key), "v1", "before");
    await shard.set(key, "v2");
    if (!(await seen("v2"))) fail("the shard's write was never seen");
  }],
  ["a_write_through_another_client_is_seen", async () => {
    eq(await r.get(key), "v2", "before");
    await other.set(key, "v3");
    if (!(await seen("v3"))) fail("the other client's write was never seen");
  }],
  ["the_clients_own_write_is_seen_at_once", async () => {
    eq(await r.get(key), "v3", "before");
    await r.set(key, "v4");
    eq(await r.get(key), "v4", "read after the client's own write");
  }],
  ["a_flush_empties_the_cache", async () => {
    eq(await r.get(key), "v4", "before");
    await other.flushDb();
    if (!(await seen(null))) fail("FLUSHDB was never seen");
  }],
]);

await Promise.allSettled([r.quit(), other.quit(), shard.quit()]);
process.exit(code);
