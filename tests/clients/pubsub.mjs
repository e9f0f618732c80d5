// node-redis and ioredis (pinned in package.json) pub/sub, used unchanged.
//
//     node pubsub.mjs --lib node-redis|ioredis --addr SUB_HOST:PORT --pub-addr PUB_HOST:PORT
//
// Subscribes through --addr (10 channels and a pattern; node-redis on its default RESP, 3),
// publishes through --pub-addr, and checks every message arrives exactly once and in order
// per channel. Prints `ok NAME` / `FAIL NAME: reason`; exits 1 on a failure.

import { createClient } from "redis";
import Redis from "ioredis";

const argv = process.argv.slice(2);
const opt = (name) => {
  const i = argv.indexOf(name);
  if (i < 0 || i + 1 >= argv.length) {
    console.error(`usage: node pubsub.mjs --lib node-redis|ioredis --addr H:P --pub-addr H:P`);
    process.exit(2);
  }
  return argv[i + 1];
};
const lib = opt("--lib");
const addr = opt("--addr");
const pubAddr = opt("--pub-addr");
const chans = Array.from({ length: 10 }, (_, i) => `news:${i}`);

function bounded(p, ms, what) {
  let t;
  return Promise.race([
    p.finally(() => clearTimeout(t)),
    new Promise((_, reject) => (t = setTimeout(() => reject(new Error(`${what}: no result in ${ms} ms`)), ms))),
  ]);
}

async function connect(a) {
  if (lib === "node-redis") {
    const c = createClient({ url: `redis://${a}` });
    c.on("error", () => {});
    await bounded(c.connect(), 5000, "connect");
    return c;
  }
  const [host, port] = a.split(":");
  const c = new Redis({ host, port: Number(port), maxRetriesPerRequest: 1, lazyConnect: true });
  c.on("error", () => {});
  await bounded(c.connect(), 5000, "connect");
  return c;
}

async function channelsAndPattern() {
  const sub = await connect(addr);
  const pub = await connect(pubAddr);
  const direct = new Map();
  const byPattern = new Map();
  let count = 0;
  let done;
  const all = new Promise((r) => (done = r));
  const add = (m, ch, msg) => {
    if (!m.has(ch)) m.set(ch, []);
    m.get(ch).push(msg);
    if (++count === 400) done();
  };
  if (lib === "node-redis") {
    await bounded(sub.subscribe(chans, (msg, ch) => add(direct, ch, msg)), 5000, "subscribe");
    await bounded(sub.pSubscribe("news:*", (msg, ch) => add(byPattern, ch, msg)), 5000, "psubscribe");
  } else {
    sub.on("message", (ch, msg) => add(direct, ch, msg));
    sub.on("pmessage", (pat, ch, msg) => add(byPattern, ch, msg));
    await bounded(sub.subscribe(...chans), 5000, "subscribe");
    await bounded(sub.psubscribe("news:*"), 5000, "psubscribe");
  }
  for (let n = 0; n < 20; n++) {
    for (const c of chans) {
      const r = await pub.publish(c, `${c}#${n}`);
      if (Number(r) !== 2) throw new Error(`PUBLISH ${c}: ${r} receivers, want 2`);
    }
  }
  await bounded(all, 10000, `400 messages (got ${count})`);
  for (const c of chans) {
    const want = Array.from({ length: 20 }, (_, n) => `${c}#${n}`);
    for (const [what, m] of [["direct", direct], ["pattern", byPattern]]) {
      if (JSON.stringify(m.get(c)) !== JSON.stringify(want)) {
        throw new Error(`${c} ${what}: ${JSON.stringify(m.get(c))}`);
      }
    }
  }
  await new Promise((r) => setTimeout(r, 300));
  if (count !== 400) throw new Error(`${count} messages, want 400`);
  if (lib === "node-redis") {
    await sub.unsubscribe();
    await sub.pUnsubscribe();
    await sub.quit();
    await pub.quit();
  } else {
    // (ioredis's unsubscribe() without names does not settle, even against Redis itself.)
    await bounded(sub.unsubscribe(...chans), 5000, "unsubscribe");
    await bounded(sub.punsubscribe("news:*"), 5000, "punsubscribe");
    sub.disconnect();
    pub.disconnect();
  }
}

let failed = false;
for (const [name, f] of [["channels_and_pattern", channelsAndPattern]]) {
  try {
    await f();
    console.log(`ok ${name}`);
  } catch (e) {
    failed = true;
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
  }
}
process.exit(failed ? 1 : 0);
