// Drives node-nats-streaming (a STAN client we did not write) through one scenario against our server.
// Usage: node driver.js <scenario> <port> <channel>. Prints one JSON line: {"ok": true, ...} or {"ok": false, "error": ...}.
'use strict';
const stan = require('node-nats-streaming');

const [scenario, port, channel] = process.argv.slice(2);
const url = `nats://127.0.0.1:${port}`;
const done = (result) => { console.log(JSON.stringify(Object.assign({ ok: true }, result))); process.exit(0); };
const fail = (error) => { console.log(JSON.stringify({ ok: false, error: String(error) })); process.exit(1); };
setTimeout(() => fail(`scenario ${scenario} timed out`), 20000);

function connect(clientID) {
  return new Promise((resolve, reject) => {
    // Credentials and TLS, when the test gives them, as a user of a secured server passes them.
    const auth = {};
    if (process.env.NATS_USER) Object.assign(auth, { user: process.env.NATS_USER, pass: process.env.NATS_PASS });
    if (process.env.NATS_TOKEN) auth.token = process.env.NATS_TOKEN;
    if (process.env.NATS_CA) {
      const fs = require('fs');
      auth.tls = { ca: [fs.readFileSync(process.env.NATS_CA)] };
      if (process.env.NATS_CERT) {
        Object.assign(auth.tls, { cert: fs.readFileSync(process.env.NATS_CERT), key: fs.readFileSync(process.env.NATS_KEY) });
      }
    }
    // NATS_SERVERS: several nodes of a cluster (comma-separated URLs), to fail over between them.
    const where = process.env.NATS_SERVERS ? { servers: process.env.NATS_SERVERS.split(',') } : { url };
    const timeouts = { connectTimeout: 5000, ackTimeout: scenario === 'failover' ? 1000 : 30000 };
    const sc = stan.connect('test-cluster', clientID, Object.assign(where, timeouts, auth));
    sc.on('connect', () => resolve(sc));
    sc.on('error', reject);
  });
}
function publish(sc, subject, data) {
  return new Promise((resolve, reject) => sc.publish(subject, data, (err, guid) => (err ? reject(err) : resolve(guid))));
}
function closed(sc) {
  return new Promise((resolve) => { sc.on('close', resolve); sc.close(); });
}
function ready(sub) {
  return new Promise((resolve, reject) => { sub.on('ready', resolve); sub.on('error', reject); });
}
function collect(sub, n, onMsg) {
  return new Promise((resolve) => {
    const got = [];
    sub.on('message', (m) => {
      got.push({ seq: m.getSequence(), redelivered: m.isRedelivered(), data: m.getData().toString() });
      if (onMsg) onMsg(m, got);
      if (got.length === n) resolve(got);
    });
  });
}

const scenarios = {
  async publish_range(sc) {
    // JSON messages {"n": FROM} .. {"n": TO - 1}, each once stored (the browser tests read them back).
    const from = Number(process.env.FROM || 0);
    const to = Number(process.env.TO || 10);
    for (let n = from; n < to; n++) await publish(sc, channel, JSON.stringify({ n }));
    return { published: to - from };
  },
  async collect_json(sc) {
    // Subscribe first, print "subscribed", then collect COUNT messages (JSON), acking each.
    const sub = sc.subscribe(channel, sc.subscriptionOptions().setManualAckMode(true));
    await ready(sub);
    console.log(JSON.stringify({ phase: 'subscribed' }));
    const got = await collect(sub, Number(process.env.COUNT || 1), (m) => m.ack());
    return { got: got.map((m) => JSON.parse(m.data)) };
  },
  async publish(sc) {
    const guids = [];
    for (let i = 0; i < 20; i++) guids.push(await publish(sc, channel, `msg-${i}`));
    return { published: guids.length, unique: new Set(guids).size };
  },
  async exchange(sc) {
    // Beside a CometD client on the same channel (pytest drives both): publish 10, then read the
    // whole channel from its start.
    for (let i = 0; i < 10; i++) await publish(sc, channel, `stan-${i}`);
    const sub = sc.subscribe(channel, sc.subscriptionOptions().setDeliverAllAvailable());
    const got = collect(sub, 20); // listening before the subscription is ready: messages follow at once
    await ready(sub);
    done({ got: await got });
  },
  async redelivery(sc) {
    await publish(sc, channel, 'first');
    const opts = sc.subscriptionOptions().setManualAckMode(true).setAckWait(1000).setDeliverAllAvailable();
    const sub = sc.subscribe(channel, opts);
    // Do not ack the first delivery; ack the redelivery.
    const got = await collect(sub, 2, (m, seen) => { if (seen.length === 2) m.ack(); });
    sub.unsubscribe();
    return { got };
  },
  async durable(sc) {
    for (let i = 1; i <= 3; i++) await publish(sc, channel, `m${i}`);
    const opts = () => sc.subscriptionOptions().setManualAckMode(true).setDurableName('dur').setDeliverAllAvailable();
    let sub = sc.subscribe(channel, opts());
    const first = await collect(sub, 3, (m) => m.ack());
    await new Promise((r) => { sub.on('closed', r); sub.close(); });
    for (let i = 4; i <= 5; i++) await publish(sc, channel, `m${i}`);
    sub = sc.subscribe(channel, opts());
    const second = await collect(sub, 2, (m) => m.ack());
    sub.unsubscribe();
    return { first, second };
  },
  async wildcard(sc) {
    // A durable subscription to `<channel>.*`, unmodified client: deliveries name their channel, acks
    // name it back (the client copies the message's subject into its Ack); one message left unacked
    // comes back on its channel after AckWait; closed and resumed, it gets what came meanwhile, on a
    // channel made meanwhile too; `<channel>.x.deep` is not one token below, so never.
    const seen = [];
    const take = (sub, n, ackIf) => new Promise((resolve) => {
      const got = [];
      sub.on('message', (m) => {
        const entry = { subject: m.getSubject(), seq: m.getSequence(), redelivered: m.isRedelivered(), data: m.getData().toString() };
        got.push(entry);
        seen.push(entry);
        if (ackIf(entry)) m.ack();
        if (got.length === n) resolve(got);
      });
    });
    await publish(sc, `${channel}.a`, 'a1');
    const opts = () => sc.subscriptionOptions().setManualAckMode(true).setAckWait(1000)
      .setDurableName('wild').setDeliverAllAvailable();
    let sub = sc.subscribe(`${channel}.*`, opts());
    const first = take(sub, 4, (m) => m.data !== 'b1' || m.redelivered);
    await ready(sub);
    await publish(sc, `${channel}.b`, 'b1');
    await publish(sc, `${channel}.a`, 'a2');
    await publish(sc, `${channel}.x.deep`, 'never');
    const one = await first;
    await new Promise((r) => { sub.on('closed', r); sub.close(); });
    await publish(sc, `${channel}.a`, 'a3');
    await publish(sc, `${channel}.c`, 'c1');
    sub = sc.subscribe(`${channel}.*`, opts());
    const two = await take(sub, 2, () => true);
    await new Promise((r) => setTimeout(r, 1500)); // past AckWait: nothing more may arrive
    sub.unsubscribe();
    return { first: one, second: two, total: seen.length };
  },
  async wildcard_queue(sc) {
    // Two members of a queue group on `<channel>.*`: each message of every channel once over the
    // group, each acked by the member it went to (its Ack naming the message's channel).
    const opts = () => sc.subscriptionOptions().setManualAckMode(true).setAckWait(2000);
    const a = sc.subscribe(`${channel}.*`, 'workers', opts());
    const b = sc.subscribe(`${channel}.*`, 'workers', opts());
    await Promise.all([ready(a), ready(b)]);
    const seen = { a: [], b: [] };
    const all = new Promise((resolve) => {
      const on = (name) => (m) => {
        m.ack();
        seen[name].push(`${m.getSubject()}#${m.getSequence()}`);
        if (seen.a.length + seen.b.length === 10) resolve();
      };
      a.on('message', on('a'));
      b.on('message', on('b'));
    });
    for (let i = 0; i < 10; i++) await publish(sc, `${channel}.${i % 2 ? 'odd' : 'even'}`, `q${i}`);
    await all;
    await new Promise((r) => setTimeout(r, 2500)); // past AckWait: nothing may come again
    return seen;
  },
  async failover(sc) {
    // Across the loss of the NATS node it is on: pytest kills that node after "kill now".
    const sub = sc.subscribe(channel, sc.subscriptionOptions().setManualAckMode(true).setDeliverAllAvailable());
    await ready(sub);
    const got = [];
    sub.on('message', (m) => { m.ack(); if (!got.includes(m.getData().toString())) got.push(m.getData().toString()); });
    const until = async (test) => { while (!test()) await new Promise((r) => setTimeout(r, 20)); };
    await publish(sc, channel, 'before');
    await until(() => got.includes('before'));
    console.log(JSON.stringify({ phase: 'kill now' }));
    await new Promise((resolve) => process.stdin.once('data', resolve));
    // While the cluster reroutes, a publish may go unanswered: publish again until one is stored.
    for (;;) {
      try { await publish(sc, channel, 'after'); break; } catch (e) { if (!/timeout/i.test(String(e))) throw e; }
    }
    await until(() => got.includes('after'));
    return { got };
  },
  async queue(sc) {
    const opts = () => sc.subscriptionOptions().setManualAckMode(true);
    const a = sc.subscribe(channel, 'workers', opts());
    const b = sc.subscribe(channel, 'workers', opts());
    await Promise.all([ready(a), ready(b)]);
    const seen = { a: [], b: [] };
    const all = new Promise((resolve) => {
      const on = (name) => (m) => { m.ack(); seen[name].push(m.getSequence()); if (seen.a.length + seen.b.length === 10) resolve(); };
      a.on('message', on('a'));
      b.on('message', on('b'));
    });
    for (let i = 0; i < 10; i++) await publish(sc, channel, `q${i}`);
    await all;
    await new Promise((r) => setTimeout(r, 300)); // nothing more may arrive
    return seen;
  },
};

(async () => {
  const fn = scenarios[scenario];
  if (!fn) fail(`unknown scenario ${scenario}`);
  try {
    const sc = await connect(`node-${scenario}-${process.pid}`);
    const result = await fn(sc);
    await closed(sc);
    done(result);
  } catch (e) {
    fail(e && e.stack ? e.stack : e);
  }
})();
