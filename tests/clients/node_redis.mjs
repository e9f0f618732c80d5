// node-redis (the `redis` package pinned in package.json), used unchanged, against one address.
//
//     node node_redis.mjs --addr 127.0.0.1:PORT [--proxy] [--resp 2|3]
//
// The client is `createClient({ url })`: the library's defaults (its default RESP version,
// which for 6.3.1 is 3: it says HELLO 3 on connect). `--resp N` sets `RESP: N` explicitly.
// `--proxy` adds what only a sharding proxy can do (`tx_crossslot`). One line per scenario,
// exit 1 if any failed.

import { createClient, WatchError } from "redis";
import { createRequire } from "node:module";
import {
  parseArgs, eq, fail, isPlainObject, plain, runScenarios, CROSS_TAGS, ES_KEYS, GET_SCRIPT,
} from "./common.mjs";

const args = parseArgs(process.argv.slice(2));
const require = createRequire(import.meta.url);
const version = require("redis/package.json").version;
const { DEFAULT_RESP } = require("@redis/client/dist/lib/RESP/types");
const resp = args.resp ?? DEFAULT_RESP;

const CONNECT_TIMEOUT_MS = 4000;

async function client(db = 0) {
  const url = `redis://${args.addr}` + (db ? `/${db}` : "");
  const opts = { url };
  if (args.resp !== null) opts.RESP = args.resp;
  const c = createClient(opts);
  // Without a listener an 'error' event ends the process. A handshake that fails (HELLO
  // refused, say) is one such event per try: node-redis reconnects for ever and connect()
  // does not settle, so it is bounded here and fails with the last error seen.
  let last = null;
  c.on("error", (e) => (last = e));
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => {
      c.destroy();
      reject(new Error(`no ready connection in ${CONNECT_TIMEOUT_MS} ms; last error: ${last?.message ?? "none"}`));
    }, CONNECT_TIMEOUT_MS);
  });
  try {
    await Promise.race([c.connect(), deadline]);
  } finally {
    clearTimeout(timer);
  }
  return c;
}

const opened = [];
async function open(db = 0) {
  const c = await client(db);
  opened.push(c);
  return c;
}

let r = null;
async function main() {
  console.log(`info node-redis ${version} RESP=${args.resp ?? `default(${DEFAULT_RESP})`}`);
  const scenarios = [
    ["pipeline", pipeline],
    ["mget_mset", mgetMset],
    ["tx_commit", txCommit],
    ["tx_crossslot", txCrossslot, args.proxy ? null : "needs --proxy (a sharded cluster)"],
    ["watch_conflict", watchConflict],
    ["lock", lock],
    ["evalsha", evalsha],
    ["select_db1", selectDb1],
    ["resp3_types", resp3Types, resp === 3 ? null : "the client asked for RESP2"],
    ["connection", connection],
  ];
  // The first connection: when it cannot be made, every scenario fails with that reason.
  const first = open().then((c) => (r = c));
  first.catch((e) => console.log(`info first connection failed: ${e?.message ?? e}`));
  const code = await runScenarios(
    scenarios.map(([name, fn, skip]) => [name, async () => { await first; await fn(); }, skip]),
  );
  await Promise.allSettled(opened.map((c) => c.destroy()));
  return code;
}

async function pipeline() {
  const keys = Array.from({ length: 200 }, (_, i) => `p:${i}`);
  await r.del(keys);
  const m = r.multi();
  keys.forEach((k, i) => m.set(k, `v${i}`));
  keys.forEach((k) => m.get(k));
  const res = await m.execAsPipeline();
  eq(res.length, 400, "reply count");
  keys.forEach((k, i) => {
    eq(res[i], "OK", `SET ${k}`);
    eq(res[200 + i], `v${i}`, `GET ${k}`);
  });
  await r.del(keys);
}

async function mgetMset() {
  const keys = Array.from({ length: 20 }, (_, i) => `m:${i}`);
  const missing = ["m:missing:1", "m:missing:2"];
  await r.del([...keys, ...missing]);
  eq(await r.mSet(keys.map((k, i) => [k, `val${i}`])), "OK", "MSET");
  const asked = [...keys.slice(0, 3), missing[0], ...keys.slice(3), missing[1]];
  const want = asked.map((k) => (missing.includes(k) ? null : `val${keys.indexOf(k)}`));
  eq(await r.mGet(asked), want, "MGET");
  await r.del(keys);
}

async function txCommit() {
  await r.del(["{tx}a", "{tx}b"]);
  const res = await r.multi().set("{tx}a", "1").incr("{tx}a").set("{tx}b", "x").exec();
  eq(res, ["OK", 2, "OK"], "EXEC results");
  eq(await r.get("{tx}a"), "2", "{tx}a after EXEC");
  eq(await r.get("{tx}b"), "x", "{tx}b after EXEC");
  await r.del(["{tx}a", "{tx}b"]);
}

async function txCrossslot() {
  const keys = CROSS_TAGS.map((t) => `{${t}}cross`);
  await r.del(keys);
  const m = r.multi();
  keys.forEach((k) => m.set(k, "1"));
  let err = null;
  try {
    const res = await m.exec();
    fail(`EXEC over ${keys} resolved: ${JSON.stringify(res)}`);
  } catch (e) {
    if (String(e.message).startsWith("EXEC over")) throw e;
    err = e;
  }
  for (const k of keys) eq(await r.get(k), null, `${k} after the refused transaction (error was: ${err.message})`);
}

async function watchConflict() {
  const other = await open();
  await r.set("{w}k", "orig");
  await r.watch("{w}k");
  eq(await other.set("{w}k", "changed"), "OK", "SET from the second client");
  try {
    const res = await r.multi().set("{w}k", "mine").exec();
    fail(`EXEC after a conflicting write resolved: ${JSON.stringify(res)}`);
  } catch (e) {
    if (!(e instanceof WatchError)) throw e;
  }
  eq(await r.get("{w}k"), "changed", "{w}k after the aborted transaction");
  await r.del("{w}k");
}

// A lock as node-redis users write one: SET NX PX to take it, a Lua compare-and-delete loaded
// with SCRIPT LOAD and run with EVALSHA to release it.
const RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

async function lock() {
  const key = "lk:{1}";
  await r.del(key);
  const sha = await r.sendCommand(["SCRIPT", "LOAD", RELEASE]);
  eq(typeof sha === "string" && sha.length, 40, `SCRIPT LOAD sha ${sha}`);
  eq(await r.set(key, "token-1", { condition: "NX", expiration: { type: "PX", value: 5000 } }), "OK", "acquire");
  eq(await r.set(key, "token-2", { condition: "NX", expiration: { type: "PX", value: 5000 } }), null, "second acquire");
  eq(await r.sendCommand(["EVALSHA", sha, "1", key, "token-2"]), 0, "release with the wrong token");
  eq(await r.get(key), "token-1", "still held");
  eq(await r.sendCommand(["EVALSHA", sha, "1", key, "token-1"]), 1, "release");
  eq(await r.get(key), null, "lock key after release");
}

async function evalsha() {
  const sha = await r.scriptLoad(GET_SCRIPT);
  eq(typeof sha === "string" && sha.length, 40, `SCRIPT LOAD sha ${sha}`);
  await r.del(ES_KEYS);
  for (const k of ES_KEYS) await r.set(k, `v-${k}`);
  for (const k of ES_KEYS) eq(await r.evalSha(sha, { keys: [k] }), `v-${k}`, `EVALSHA for ${k}`);
  await r.del(ES_KEYS);
}

async function selectDb1() {
  const r1 = await open(1);
  await r.del("sel:k");
  await r1.del("sel:k");
  eq(await r1.set("sel:k", "one"), "OK", "SET in db 1");
  eq(await r.get("sel:k"), null, "GET in db 0");
  eq(await r1.get("sel:k"), "one", "GET in db 1");
  eq(await r1.del("sel:k"), 1, "DEL in db 1");
}

async function resp3Types() {
  await r.del(["h:{t}", "s:{t}", "z:{t}"]);
  await r.hSet("h:{t}", "f", "v");
  await r.sAdd("s:{t}", ["a", "b"]);
  await r.zAdd("z:{t}", { score: 1.5, value: "m" });
  // What the application sees through the command API.
  const h = await r.hGetAll("h:{t}");
  if (!isPlainObject(h)) fail(`HGETALL is not an object: ${JSON.stringify(h)}`);
  eq(plain(h), { f: "v" }, "HGETALL");
  const s = await r.sMembers("s:{t}");
  // node-redis maps a RESP3 set to an Array unless a type mapping says otherwise.
  if (!Array.isArray(s)) fail(`SMEMBERS is not an array: ${JSON.stringify(s)}`);
  eq([...s].sort(), ["a", "b"], "SMEMBERS");
  eq(await r.zScore("z:{t}", "m"), 1.5, "ZSCORE");
  // What came on the wire, with no command transform: a map is an object (on RESP2 the same
  // call gives the array ["f", "v"]); the double is a number (as it is on RESP2 too).
  const rawH = await r.sendCommand(["HGETALL", "h:{t}"]);
  if (!isPlainObject(rawH)) fail(`raw HGETALL is not a map: ${JSON.stringify(rawH)}`);
  eq(plain(rawH), { f: "v" }, "raw HGETALL (map)");
  const rawS = await r.sendCommand(["SMEMBERS", "s:{t}"]);
  if (!Array.isArray(rawS)) fail(`raw SMEMBERS is not an array: ${JSON.stringify(rawS)}`);
  eq([...rawS].sort(), ["a", "b"], "raw SMEMBERS (set as array)");
  eq(await r.sendCommand(["ZSCORE", "z:{t}", "m"]), 1.5, "raw ZSCORE (double)");
  await r.del(["h:{t}", "s:{t}", "z:{t}"]);
}

async function connection() {
  eq(await r.ping(), "PONG", "PING");
  eq(await r.echo("hello"), "hello", "ECHO");
  eq(await r.clientSetName("respway-node-redis"), "OK", "CLIENT SETNAME");
  eq(await r.clientGetName(), "respway-node-redis", "CLIENT GETNAME");
  const id = await r.clientId();
  if (!Number.isInteger(id)) fail(`CLIENT ID is not an integer: ${JSON.stringify(id)}`);
  const t = await r.time();
  eq(Array.isArray(t) ? t.length : t, 2, `TIME ${JSON.stringify(t)} length`);
  const info = await r.info("server");
  if (!/^redis_version:/m.test(info)) fail(`INFO server has no redis_version: ${info.slice(0, 200)}`);
}

process.exitCode = await main();
// Nothing may keep the process alive (reconnect timers of a client that never connected).
process.exit(process.exitCode);
