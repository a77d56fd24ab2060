// The real CometD client (cometd 9 + cometd-nodejs-client, AckExtension registered) for bench/bayeux.py:
// one subscriber, one publisher, both over <transport> (long-polling or websocket).
// Usage: node bayeux_clients.mjs <url> throughput <count> <batch> [transport] [warmup] [autobatch]   (batches of <batch>)
//        node bayeux_clients.mjs <url> latency <count> <rate> [transport] [warmup] [autobatch]      (one every 1/rate s)
// First <warmup> messages go through untimed (both sides' code warm), then the timed run.
// "autobatch": both clients configured with CometD's `autoBatch` (requests queued behind the one in
// flight go as one), not its default.
// Prints "ready" once subscribed and warmed up, then one JSON line: {"ok": true, ...}.
import { adapt } from "cometd-nodejs-client";
import { CometD, AckExtension } from "cometd";

const [url, mode, countText, knobText, transportText, warmupText, autoBatchText] = process.argv.slice(2);
const count = Number(countText);
const knob = Number(knobText);
const websocket = transportText === "websocket";
const warmup = Number(warmupText || 0);
const autoBatch = autoBatchText === "autobatch";
const CHANNEL = "/bench/a";
const FILLER = "x".repeat(100);

adapt();
function client() {
  const cometd = new CometD();
  cometd.websocketEnabled = websocket;
  cometd.registerExtension("ack", new AckExtension());
  cometd.configure({ url, maxNetworkDelay: 30000, appendMessageTypeToURL: false, autoBatch });
  return cometd;
}
const fail = (error) => { console.log(JSON.stringify({ ok: false, error: String(error) })); process.exit(1); };
setTimeout(() => fail("timed out"), 120000);

function handshake(cometd) {
  return new Promise((resolve, reject) =>
    cometd.handshake((reply) => (reply.successful ? resolve() : reject(new Error(JSON.stringify(reply))))));
}

const sub = client();
const pub = client();
const latencies = [];
let received = 0;
let warm = 0;
let first = 0;
let done;
let warmed;
const finished = new Promise((resolve) => { done = resolve; });
const warmedUp = new Promise((resolve) => { warmed = resolve; });
await handshake(sub);
await new Promise((resolve, reject) =>
  sub.subscribe(CHANNEL, (m) => {
    const now = performance.now();
    if (m.data.warmup) {
      warm += 1;
      if (warm === warmup) warmed();
      return;
    }
    if (received === 0) first = now;
    received += 1;
    if (mode === "latency") latencies.push(now - m.data.t);
    if (received === count) done(now);
  }, (reply) => (reply.successful ? resolve() : reject(new Error(JSON.stringify(reply))))));
await handshake(pub);
if (warmup > 0) {
  for (let i = 0; i < warmup; i += 100) {
    const replies = [];
    pub.batch(() => {
      for (let k = 0; k < Math.min(100, warmup - i); k++) {
        replies.push(new Promise((resolve) => pub.publish(CHANNEL, { warmup: true, f: FILLER }, resolve)));
      }
    });
    await Promise.all(replies);
  }
  await warmedUp;
}
const transports = [sub.getTransport().type, pub.getTransport().type];
if (transports.some((t) => t !== (websocket ? "websocket" : "long-polling"))) fail(`transports: ${transports}`);
console.log("ready");

const started = performance.now();
if (mode === "throughput") {
  for (let i = 0; i < count; i += knob) {
    const n = Math.min(knob, count - i);
    const replies = [];
    pub.batch(() => {
      for (let k = 0; k < n; k++) {
        replies.push(new Promise((resolve) => pub.publish(CHANNEL, { i: i + k, f: FILLER }, resolve)));
      }
    });
    await Promise.all(replies); // the next batch once this one is answered (stored, for ours)
  }
} else {
  const interval = 1000 / knob;
  for (let i = 0; i < count; i++) {
    const due = started + i * interval;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    pub.publish(CHANNEL, { i, t: performance.now(), f: FILLER });
  }
}
const end = await finished;
const out = { ok: true, received, seconds: (end - started) / 1000, msgs_per_s: count / ((end - started) / 1000) };
if (mode === "latency") {
  latencies.sort((a, b) => a - b);
  const q = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
  Object.assign(out, { p50_ms: q(0.5), p99_ms: q(0.99), max_ms: latencies[latencies.length - 1] });
}
console.log(JSON.stringify(out));
sub.disconnect();
pub.disconnect();
setTimeout(() => process.exit(0), 200);
