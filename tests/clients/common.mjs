// What the two Node scripts share: the command line, the assertions, the scenario driver and
// the key names. Nothing here talks to Redis.

import { isDeepStrictEqual, inspect } from "node:util";

/** `--addr HOST:PORT [--proxy] [--resp 2|3]`. */
export function parseArgs(argv) {
  const out = { addr: null, proxy: false, resp: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--addr") out.addr = argv[++i];
    else if (a === "--proxy") out.proxy = true;
    else if (a === "--resp") out.resp = Number(argv[++i]);
    else usage(`unknown argument ${a}`);
  }
  if (!out.addr || !/^[^:]+:\d+$/.test(out.addr)) usage("--addr HOST:PORT is required");
  if (out.resp !== null && out.resp !== 2 && out.resp !== 3) usage("--resp takes 2 or 3");
  const [host, port] = out.addr.split(":");
  out.host = host;
  out.port = Number(port);
  return out;
}

function usage(msg) {
  console.error(`${msg}\nusage: node SCRIPT --addr HOST:PORT [--proxy] [--resp 2|3]`);
  process.exit(2);
}

export function fail(msg) {
  throw new Error(msg);
}

const show = (v) => inspect(v, { depth: 4, breakLength: Infinity });

export function eq(got, want, what) {
  if (!isDeepStrictEqual(got, want)) fail(`${what}: got ${show(got)}, want ${show(want)}`);
}

/** A plain object (not an array, not a Map), whatever its prototype (null or Object). */
export function isPlainObject(v) {
  if (v === null || typeof v !== "object" || Array.isArray(v) || v instanceof Map) return false;
  const p = Object.getPrototypeOf(v);
  return p === null || p === Object.prototype;
}

/** Copies an object with any prototype into an ordinary one, for comparison. */
export const plain = (v) => Object.fromEntries(Object.entries(v));

// Hash tags that crc16_slots puts on three different shards of three (Redis Cluster slots
// 15495, 3300 and 7365 of the even split 0-5460 / 5461-10922 / 10923-16383);
// tests/clients.rs checks that they do before it runs a script through respway.
export const CROSS_TAGS = ["a", "b", "c"];
// Keys for EVALSHA: tags 1, 2, 3, plus a, b, c so that every shard is hit.
export const ES_KEYS = ["es:{1}", "es:{2}", "es:{3}", "es:{a}", "es:{b}", "es:{c}"];
export const GET_SCRIPT = "return redis.call('GET', KEYS[1])";

const SCENARIO_TIMEOUT_MS = 5000;

function withTimeout(p, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${SCENARIO_TIMEOUT_MS} ms`)), SCENARIO_TIMEOUT_MS);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

/**
 * Runs `[name, fn, skipReason]` in order, one line each (`ok NAME`, `FAIL NAME: reason`,
 * `skip NAME: reason`); resolves to the exit code (1 if any failed).
 */
export async function runScenarios(scenarios) {
  let failed = 0;
  for (const [name, fn, skip] of scenarios) {
    if (skip) {
      console.log(`skip ${name}: ${skip}`);
      continue;
    }
    try {
      await withTimeout(Promise.resolve().then(fn), name);
      console.log(`ok ${name}`);
    } catch (e) {
      failed++;
      const kind = e?.constructor?.name ?? "Error";
      console.log(`FAIL ${name}: ${kind}: ${String(e?.message ?? e).replace(/\n/g, " ")}`);
    }
  }
  return failed ? 1 : 0;
}
