// ioredis's Cluster (pinned in package.json), used unchanged, through respway's cluster
// emulation.
//
//     node ioredis_cluster.mjs --addr HOST:PORT [--addr HOST:PORT ...] [--resp 2|3]
//
// The client is `new Cluster(startupNodes)` on the library's defaults (`--resp N` sets
// `redisOptions.protocol`); it must see exactly the given addresses as the cluster's
// primaries. One line per scenario, exit 1 if any failed.

import { Cluster } from "ioredis";
import { createRequire } from "node:module";
import { eq, runScenarios } from "./common.mjs";

function parse(argv) {
  const out = { addrs: [], resp: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--addr") out.addrs.push(argv[++i]);
    else if (a === "--resp") out.resp = Number(argv[++i]);
    else usage(`unknown argument ${a}`);
  }
  if (out.addrs.length === 0 || !out.addrs.every((a) => /^[^:]+:\d+$/.test(a))) {
    usage("--addr HOST:PORT is required");
  }
  if (out.resp !== null && out.resp !== 2 && out.resp !== 3) usage("--resp takes 2 or 3");
  return out;
}

function usage(msg) {
  console.error(`${msg}\nusage: node ioredis_cluster.mjs --addr HOST:PORT [--addr ...] [--resp 2|3]`);
  process.exit(2);
}

const args = parse(process.argv.slice(2));
const require = createRequire(import.meta.url);
const version = require("ioredis/package.json").version;
const KEYS = 1000;

const opened = [];
function open() {
  const nodes = args.addrs.map((a) => {
    const [host, port] = a.split(":");
    return { host, port: Number(port) };
  });
  const opts = { redisOptions: {} };
  if (args.resp !== null) opts.redisOptions.protocol = args.resp;
  const c = new Cluster(nodes, opts);
  c.on("error", () => {});
  opened.push(c);
  return c;
}

let c = null;

async function topology() {
  const masters = c.nodes("master").map((n) => `${n.options.host}:${n.options.port}`).sort();
  eq(masters, [...args.addrs].sort(), "primaries");
  eq(c.nodes("slave").length, 0, "replicas");
}

async function setGet() {
  for (let i = 0; i < 50; i++) eq(await c.set(`sg:${i}`, `v${i}`), "OK", `SET sg:${i}`);
  for (let i = 0; i < 50; i++) eq(await c.get(`sg:${i}`), `v${i}`, `GET sg:${i}`);
}

async function pipeline() {
  // A pipeline goes to one node: its keys share a hashtag.
  const keys = Array.from({ length: 200 }, (_, i) => `{p}:${i}`);
  const p = c.pipeline();
  keys.forEach((k, i) => p.set(k, `v${i}`));
  keys.forEach((k) => p.get(k));
  const res = await p.exec();
  eq(res.length, 400, "reply count");
  keys.forEach((k, i) => {
    eq(res[i], [null, "OK"], `SET ${k}`);
    eq(res[200 + i], [null, `v${i}`], `GET ${k}`);
  });
}

async function mgetManySlots() {
  // ioredis sends a multi-key command to the node of its first key; respway splits it per
  // shard, whatever slots the keys are in.
  const keys = Array.from({ length: 300 }, (_, i) => `m:${i}`);
  await Promise.all(keys.map((k) => c.set(k, k.toUpperCase())));
  eq(await c.mget(keys), keys.map((k) => k.toUpperCase()), "MGET over many slots");
}

async function transaction() {
  await c.del("{tx}:a", "{tx}:n");
  const res = await c.multi().set("{tx}:a", 1).incr("{tx}:n").incr("{tx}:n").get("{tx}:a").exec();
  eq(res, [[null, "OK"], [null, 1], [null, 2], [null, "1"]], "MULTI/EXEC on one hashtag");
  eq(await c.get("{tx}:n"), "2", "after EXEC");
}

async function pubsub() {
  const sub = open();
  const got = new Promise((resolve) => sub.on("message", (ch, msg) => resolve([ch, msg])));
  await sub.subscribe("news");
  eq(await c.publish("news", "hello"), 1, "PUBLISH receivers");
  eq(await got, ["news", "hello"], "message");
}

async function keyspace() {
  const keys = Array.from({ length: KEYS }, (_, i) => `ks:${i}`);
  await Promise.all(keys.map((k) => c.set(k, `=${k}`)));
  const values = await Promise.all(keys.map((k) => c.get(k)));
  eq(values, keys.map((k) => `=${k}`), "every key read back");
  eq(await c.mget(keys), keys.map((k) => `=${k}`), "every key in one MGET");
}

async function main() {
  console.log(`info ioredis ${version} Cluster protocol=${args.resp ?? "default"}`);
  c = open();
  try {
    await new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error("not ready in 5 s")), 5000);
      c.once("ready", () => { clearTimeout(t); resolve(); });
    });
  } catch (e) {
    console.log(`FAIL start: ${e?.message ?? e}`);
    for (const x of opened) x.disconnect();
    return 1;
  }
  const code = await runScenarios([
    ["topology", topology],
    ["set_get", setGet],
    ["pipeline", pipeline],
    ["mget_many_slots", mgetManySlots],
    ["transaction", transaction],
    ["pubsub", pubsub],
    ["keyspace", keyspace],
  ]);
  for (const x of opened) x.disconnect();
  return code;
}

main().then((code) => process.exit(code), (e) => {
  console.log(`FAIL ${e?.stack ?? e}`);
  process.exit(1);
});
