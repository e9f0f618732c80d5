// ioredis (pinned in package.json), used unchanged: SCAN through one address.
//
//     node ioredis_scan.mjs --addr 127.0.0.1:PORT [--resp 2|3]
//
// Writes 3,000 string keys and 100 hashes, then checks that `scanStream` (with `match` and
// `count`, with `type`, and with nothing) returns every one of them, and that KEYS agrees.
// One line per scenario, exit 1 if any failed.

import Redis from "ioredis";
import { parseArgs, eq, fail, runScenarios } from "./common.mjs";

const args = parseArgs(process.argv.slice(2));
const N = 3000;
const H = 100;
const strings = Array.from({ length: N }, (_, i) => `scan:${i}`);
const hashes = Array.from({ length: H }, (_, i) => `scanh:${i}`);

const opts = { host: args.host, port: args.port };
if (args.resp !== null) opts.protocol = args.resp;
const r = new Redis(opts);
const errors = [];
r.on("error", (e) => errors.push(e));

/** Every key a scanStream with `options` yields, in order (repeats kept). */
function scanAll(options) {
  return new Promise((resolve, reject) => {
    const out = [];
    const s = r.scanStream(options);
    s.on("data", (keys) => out.push(...keys));
    s.on("end", () => resolve(out));
    s.on("error", reject);
  });
}

const sorted = (a) => [...a].sort();

async function setup() {
  const p = r.pipeline();
  for (const k of strings) p.set(k, "v");
  for (const k of hashes) p.hset(k, "f", "v");
  const res = await p.exec();
  const bad = res.filter(([e]) => e);
  if (bad.length) fail(`${bad.length} writes failed: ${bad[0][0]}`);
}

async function scanMatch() {
  const got = await scanAll({ match: "scan:*", count: 100 });
  eq(got.length, N, "scanStream({match: 'scan:*'}) length");
  eq(sorted(new Set(got)), sorted(strings), "scanStream({match: 'scan:*'})");
}

async function scanEverything() {
  const got = new Set(await scanAll({}));
  const missing = [...strings, ...hashes].filter((k) => !got.has(k));
  eq(missing.slice(0, 5), [], "keys scanStream() missed");
}

async function scanType() {
  const got = await scanAll({ type: "hash", count: 500 });
  eq(sorted(new Set(got)), sorted(hashes), "scanStream({type: 'hash'})");
}

async function keys() {
  eq(sorted(await r.keys("scanh:*")), sorted(hashes), "KEYS scanh:*");
}

const code = await runScenarios([
  ["setup", setup],
  ["scan_stream_match", scanMatch],
  ["scan_stream_all", scanEverything],
  ["scan_stream_type", scanType],
  ["keys", keys],
]);
r.disconnect();
process.exit(code);
