// ioredis (pinned in package.json), used unchanged, against one address.
//
//     node ioredis.mjs --addr 127.0.0.1:PORT [--proxy] [--resp 2|3]
//
// The client is `new Redis({ host, port })`: the library's defaults (6.0.0: `protocol: 3`,
// i.e. HELLO 3 on connect, falling back to RESP2 when the server answers NOPROTO; replies in
// the "legacy" RESP2 shapes either way). `{ db: 1 }` for the SELECT scenario. `--resp N`
// sets `protocol: N` explicitly. `--proxy` adds what only a sharding proxy can do
// (`tx_crossslot`). One line per scenario, exit 1 if any failed.

import Redis from "ioredis";
import { createRequire } from "node:module";
import {
  parseArgs, eq, fail, isPlainObject, plain, runScenarios, CROSS_TAGS, ES_KEYS, GET_SCRIPT,
} from "./common.mjs";

const args = parseArgs(process.argv.slice(2));
const require = createRequire(import.meta.url);
const version = require("ioredis/package.json").version;
const defaultProtocol = require("ioredis/built/redis/RedisOptions.js").DEFAULT_REDIS_OPTIONS.protocol;
const resp = args.resp ?? defaultProtocol;

const errors = [];
const opened = [];

function open(extra = {}) {
  const opts = { host: args.host, port: args.port, ...extra };
  if (args.resp !== null) opts.protocol = args.resp;
  const c = new Redis(opts);
  // Without a listener an 'error' event is printed by ioredis; the scenario says more.
  c.on("error", (e) => errors.push(e));
  opened.push(c);
  return c;
}

/** The RESP version the connection settled on (ioredis falls back to 2 on NOPROTO). */
const negotiated = (c) => c.condition?.protocol;

let r = null;
async function main() {
  console.log(`info ioredis ${version} protocol=${args.resp ?? `default(${defaultProtocol})`}`);
  r = open();
  try {
    await r.ping();
    console.log(`info negotiated RESP${negotiated(r)}`);
  } catch (e) {
    console.log(`info first connection failed: ${e?.message ?? e}`);
  }
  const code = await runScenarios([
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
  ]);
  for (const c of opened) c.disconnect();
  return code;
}

async function pipeline() {
  const keys = Array.from({ length: 200 }, (_, i) => `p:${i}`);
  await r.del(keys);
  const p = r.pipeline();
  keys.forEach((k, i) => p.set(k, `v${i}`));
  keys.forEach((k) => p.get(k));
  const res = await p.exec();
  eq(res.length, 400, "reply count");
  keys.forEach((k, i) => {
    eq(res[i], [null, "OK"], `SET ${k}`);
    eq(res[200 + i], [null, `v${i}`], `GET ${k}`);
  });
  await r.del(keys);
}

async function mgetMset() {
  const keys = Array.from({ length: 20 }, (_, i) => `m:${i}`);
  const missing = ["m:missing:1", "m:missing:2"];
  await r.del(...keys, ...missing);
  eq(await r.mset(Object.fromEntries(keys.map((k, i) => [k, `val${i}`]))), "OK", "MSET");
  const asked = [...keys.slice(0, 3), missing[0], ...keys.slice(3), missing[1]];
  const want = asked.map((k) => (missing.includes(k) ? null : `val${keys.indexOf(k)}`));
  eq(await r.mget(asked), want, "MGET");
  await r.del(keys);
}

async function txCommit() {
  await r.del("{tx}a", "{tx}b");
  const res = await r.multi().set("{tx}a", 1).incr("{tx}a").set("{tx}b", "x").exec();
  eq(res, [[null, "OK"], [null, 2], [null, "OK"]], "EXEC results");
  eq(await r.get("{tx}a"), "2", "{tx}a after EXEC");
  eq(await r.get("{tx}b"), "x", "{tx}b after EXEC");
  await r.del("{tx}a", "{tx}b");
}

async function txCrossslot() {
  const keys = CROSS_TAGS.map((t) => `{${t}}cross`);
  await r.del(keys);
  const m = r.multi();
  keys.forEach((k) => m.set(k, 1));
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
  const other = open();
  await r.set("{w}k", "orig");
  eq(await r.watch("{w}k"), "OK", "WATCH");
  eq(await other.set("{w}k", "changed"), "OK", "SET from the second client");
  eq(await r.multi().set("{w}k", "mine").exec(), null, "EXEC after a conflicting write");
  eq(await r.get("{w}k"), "changed", "{w}k after the aborted transaction");
  await r.del("{w}k");
}

// A lock as ioredis users write one: SET NX PX to take it, a compare-and-delete defined with
// defineCommand to release it. ioredis sends a script's first call on a connection as EVAL
// and the next ones as EVALSHA (falling back on NOSCRIPT).
const RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

async function lock() {
  const key = "lk:{1}";
  r.defineCommand("releaseLock", { numberOfKeys: 1, lua: RELEASE });
  await r.del(key);
  eq(await r.set(key, "token-1", "PX", 5000, "NX"), "OK", "acquire");
  eq(await r.set(key, "token-2", "PX", 5000, "NX"), null, "second acquire");
  eq(await r.releaseLock(key, "token-2"), 0, "release with the wrong token (EVAL)");
  eq(await r.get(key), "token-1", "still held");
  eq(await r.releaseLock(key, "token-1"), 1, "release (EVALSHA)");
  eq(await r.get(key), null, "lock key after release");
}

async function evalsha() {
  const sha = await r.script("LOAD", GET_SCRIPT);
  eq(typeof sha === "string" && sha.length, 40, `SCRIPT LOAD sha ${sha}`);
  await r.del(ES_KEYS);
  for (const k of ES_KEYS) await r.set(k, `v-${k}`);
  for (const k of ES_KEYS) eq(await r.evalsha(sha, 1, k), `v-${k}`, `EVALSHA for ${k}`);
  await r.del(ES_KEYS);
}

async function selectDb1() {
  const r1 = open({ db: 1 });
  await r.del("sel:k");
  await r1.del("sel:k");
  eq(await r1.set("sel:k", "one"), "OK", "SET in db 1");
  eq(await r.get("sel:k"), null, "GET in db 0");
  eq(await r1.get("sel:k"), "one", "GET in db 1");
  eq(await r1.del("sel:k"), 1, "DEL in db 1");
}

async function resp3Types() {
  // The client asked for RESP3; a silent fall back to RESP2 is a failure here.
  eq(negotiated(r), 3, "negotiated RESP version");
  await r.del("h:{t}", "s:{t}", "z:{t}");
  await r.hset("h:{t}", "f", "v");
  await r.sadd("s:{t}", "a", "b");
  await r.zadd("z:{t}", 1.5, "m");
  // ioredis's default "legacy" reply mapping gives the RESP2 shapes on a RESP3 connection:
  // HGETALL an object (its own transform), SMEMBERS an array, a double a string, and a raw
  // map (through `call`, no transform) a flat array.
  const h = await r.hgetall("h:{t}");
  if (!isPlainObject(h)) fail(`HGETALL is not an object: ${JSON.stringify(h)}`);
  eq(plain(h), { f: "v" }, "HGETALL");
  const s = await r.smembers("s:{t}");
  if (!Array.isArray(s)) fail(`SMEMBERS is not an array: ${JSON.stringify(s)}`);
  eq([...s].sort(), ["a", "b"], "SMEMBERS");
  eq(await r.zscore("z:{t}", "m"), "1.5", "ZSCORE");
  eq(await r.call("HGETALL", "h:{t}"), ["f", "v"], "raw HGETALL (map as flat array)");
  await r.del("h:{t}", "s:{t}", "z:{t}");
}

async function connection() {
  eq(await r.ping(), "PONG", "PING");
  eq(await r.echo("hello"), "hello", "ECHO");
  eq(await r.client("SETNAME", "respway-ioredis"), "OK", "CLIENT SETNAME");
  eq(await r.client("GETNAME"), "respway-ioredis", "CLIENT GETNAME");
  const id = await r.client("ID");
  if (!Number.isInteger(id)) fail(`CLIENT ID is not an integer: ${JSON.stringify(id)}`);
  const t = await r.time();
  eq(Array.isArray(t) ? t.length : t, 2, `TIME ${JSON.stringify(t)} length`);
  const info = await r.info("server");
  if (!/^redis_version:/m.test(info)) fail(`INFO server has no redis_version: ${info.slice(0, 200)}`);
}

process.exitCode = await main();
process.exit(process.exitCode);
