// Resumes imported subscriptions with node-nats-streaming (a STAN client we did not write), as their
// owners would after moving from nats-streaming-server: each durable (or durable queue group, with
// every member it had) subscribes again under the same client IDs and names, and everything it gets
// is recorded (sequence, redelivered flag) and acknowledged until `want` messages came or nothing
// more comes for a while. pytest says what must have come.
// Usage: node resume.js <port> <cluster id> '<plan JSON>'; plan: [{channel, durable, group, clients: [id...],
// want, max_inflight}], or {channel, replay: true, want} to read a whole channel from its start (each message's
// sequence, data's SHA-256 and timestamp in ns as a JS number). Prints one JSON line:
// {"ok": true, "results": [[{seq, redelivered, client} or {seq, sha256, timestamp}...]...]}.
'use strict';
const crypto = require('crypto');
const stan = require('node-nats-streaming');

const [port, cluster, planText] = process.argv.slice(2);
const plan = JSON.parse(planText);
const url = `nats://127.0.0.1:${port}`;
// Written out before the exit: a large result would be cut at the pipe's buffer otherwise.
const print = (result, code) => process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(code));
const fail = (error) => print({ ok: false, error: String(error) }, 1);
setTimeout(() => fail('resume timed out'), 50000);

function connect(clientID) {
  return new Promise((resolve, reject) => {
    const sc = stan.connect(cluster, clientID, { url, connectTimeout: 5000, ackTimeout: 10000 });
    sc.on('connect', () => resolve(sc));
    sc.on('error', reject);
  });
}
function closed(sc) {
  return new Promise((resolve) => { sc.on('close', resolve); sc.close(); });
}

async function replay(entry) {
  const sc = await connect(`replay-${process.pid}`);
  const got = [];
  const sub = sc.subscribe(entry.channel, sc.subscriptionOptions().setDeliverAllAvailable().setMaxInFlight(1024));
  await new Promise((resolve) => {
    sub.on('message', (m) => {
      const digest = crypto.createHash('sha256').update(m.getRawData()).digest('hex');
      got.push({ seq: m.getSequence(), sha256: digest, timestamp: m.getTimestampRaw() });
      if (got.length === entry.want) resolve();
    });
    if (entry.want === 0) resolve();
  });
  await new Promise((r) => { sub.on('closed', r); sub.close(); });
  await closed(sc);
  return got;
}

async function resume(entry) {
  const conns = [];
  for (const id of entry.clients) conns.push(await connect(id));
  const got = [];
  let last = Date.now();
  const subs = conns.map((sc, i) => {
    const opts = sc.subscriptionOptions().setManualAckMode(true).setAckWait(30000)
      .setMaxInFlight(entry.max_inflight).setDurableName(entry.durable);
    const sub = entry.group ? sc.subscribe(entry.channel, entry.group, opts) : sc.subscribe(entry.channel, opts);
    sub.on('message', (m) => {
      got.push({ seq: m.getSequence(), redelivered: m.isRedelivered(), client: entry.clients[i] });
      last = Date.now();
      m.ack();
    });
    return sub;
  });
  // Until everything wanted came, and no more for a moment (an extra one would be a fault).
  while (got.length < entry.want || Date.now() - last < 400) {
    if (Date.now() - last > 8000) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  for (const sub of subs) await new Promise((r) => { sub.on('closed', r); sub.close(); });
  for (const sc of conns) await closed(sc);
  return got;
}

(async () => {
  const results = [];
  for (const entry of plan) results.push(await (entry.replay ? replay(entry) : resume(entry)));
  print({ ok: true, results }, 0);
})().catch(fail);
