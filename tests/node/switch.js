// A node-nats-streaming client (one we did not write) that stays connected while its server is
// switched from nats-streaming-server to ours (pytest stops the one, imports its store and starts ours
// on the same port). Before: a durable and a plain subscription get 10 messages each and ack the first
// 5. After: both get the other 5 again, flagged redelivered, on the same subscriptions, and ack them;
// a publish goes through and reaches both. Usage: node switch.js <port> <channel>.
// Prints {"phase": "switch now"} when pytest may switch (then waits for a line on stdin), and at the
// end one JSON line {"ok": true, "durable": [...], "plain": [...]}.
'use strict';
const stan = require('node-nats-streaming');

const [port, channel] = process.argv.slice(2);
const print = (result, code) => process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(code));
const fail = (error) => print({ ok: false, error: String(error) }, 1);
setTimeout(() => fail('switch timed out'), 55000);

(async () => {
  const sc = stan.connect('test-cluster', 'switcher', {
    url: `nats://127.0.0.1:${port}`, reconnect: true, maxReconnectAttempts: -1, reconnectTimeWait: 200,
    stanPingInterval: 60000, ackTimeout: 10000,
  });
  await new Promise((resolve, reject) => { sc.on('connect', resolve); sc.on('error', reject); });
  sc.on('error', () => {}); // the switch drops the connection for a moment
  const got = { durable: [], plain: [] };
  const listen = (name, opts) => {
    const sub = sc.subscribe(channel, opts.setManualAckMode(true).setAckWait(60000).setDeliverAllAvailable());
    sub.on('message', (m) => {
      got[name].push({ seq: m.getSequence(), redelivered: m.isRedelivered() });
      // Before the switch the first 5 are acked and the rest left pending; after it, everything.
      if (m.getSequence() <= 5 || m.isRedelivered() || m.getSequence() > 10) m.ack();
    });
    return new Promise((resolve, reject) => { sub.on('ready', resolve); sub.on('error', reject); });
  };
  await listen('durable', sc.subscriptionOptions().setDurableName('keeper'));
  await listen('plain', sc.subscriptionOptions());
  const publish = (data) => new Promise((resolve, reject) => sc.publish(channel, data, (e) => (e ? reject(e) : resolve())));
  for (let i = 1; i <= 10; i++) await publish(`m${i}`);
  const until = async (test) => { while (!test()) await new Promise((r) => setTimeout(r, 20)); };
  await until(() => got.durable.length >= 10 && got.plain.length >= 10);
  await new Promise((r) => setTimeout(r, 500)); // the acks reach the server before it stops
  console.log(JSON.stringify({ phase: 'switch now' }));
  await new Promise((resolve) => process.stdin.once('data', resolve));
  await until(() => got.durable.length >= 15 && got.plain.length >= 15);
  for (;;) {
    try { await publish('after'); break; } catch (e) { await new Promise((r) => setTimeout(r, 200)); }
  }
  await until(() => got.durable.length >= 16 && got.plain.length >= 16);
  await new Promise((r) => setTimeout(r, 500)); // nothing more may come, and the acks are in
  print(Object.assign({ ok: true }, got), 0);
})().catch(fail);
