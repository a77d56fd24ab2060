// Continuous load through node-nats-streaming (a STAN client we did not write) while pytest breaks the
// servers of an FT group: a pipelined publisher, a durable, a queue group of two and a plain subscriber,
// every one acking what it gets. Each event is one JSON line on stdout, for the checker:
//   {"a": i}                      message p-i was PubAck'd          {"f": i, "e": why}   it was not
//   {"s": sub, "q": seq, "d": data, "r": redelivered, "t": ms}      a delivery (acked at once)
//   {"lost": why}                 the client lost its connection to the STAN cluster
// Usage: NATS_SERVERS=url,url node ft_load.js <channel> <rate per second>; "stop" on stdin ends it.
'use strict';
const stan = require('node-nats-streaming');

const [channel, rateArg] = process.argv.slice(2);
const rate = Number(rateArg || 200);
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const sc = stan.connect('test-cluster', `ft-load-${process.pid}`, {
  servers: process.env.NATS_SERVERS.split(','),
  connectTimeout: 10000,
  ackTimeout: 3000,
  maxPubAcksInflight: 16384, // an outage fails publishes by their ack timeout, not by this limit
  maxReconnectAttempts: -1,
  reconnectTimeWait: 100,
  // Pings the STAN cluster may leave unanswered before the client gives up (5 s apart); a test of an
  // outage longer than the default 15 s allows more, as a user who expects one would.
  stanMaxPingOut: Number(process.env.STAN_MAX_PING_OUT || 3),
});
let stopping = false;

sc.on('connection_lost', (e) => out({ lost: String(e) }));
sc.on('error', (e) => out({ error: String(e) }));
sc.on('connect', () => {
  const listen = (name, sub) => {
    sub.on('message', (m) => {
      out({ s: name, q: m.getSequence(), d: m.getData().toString(), r: m.isRedelivered(), t: Date.now() });
      m.ack();
    });
    sub.on('error', (e) => out({ error: `${name}: ${e}` }));
    sub.on('ready', () => out({ ready: name }));
  };
  const manual = () => sc.subscriptionOptions().setManualAckMode(true).setAckWait(5000).setMaxInFlight(256);
  listen('dur', sc.subscribe(channel, manual().setDurableName('dur').setDeliverAllAvailable()));
  listen('qa', sc.subscribe(channel, 'workers', manual().setDurableName('qdur').setDeliverAllAvailable()));
  listen('qb', sc.subscribe(channel, 'workers', manual().setDurableName('qdur').setDeliverAllAvailable()));
  listen('plain', sc.subscribe(channel, manual().setDeliverAllAvailable()));

  let i = 0;
  const started = Date.now();
  const tick = () => {
    if (stopping) return;
    // As many as the rate allows by now: a steady stream, pipelined (acks come back asynchronously).
    const due = Math.floor(((Date.now() - started) / 1000) * rate);
    while (i < due) {
      const n = i++;
      try {
        sc.publish(channel, `p-${n}`, (err) => (err ? out({ f: n, e: String(err) }) : out({ a: n, t: Date.now() })));
      } catch (e) {
        out({ f: n, e: String(e) });
      }
    }
    setTimeout(tick, 10);
  };
  tick();
});

process.stdin.on('data', (chunk) => {
  if (!String(chunk).includes('stop') || stopping) return;
  stopping = true;
  // Let what is in flight be acknowledged and delivered, then leave (the durables stay).
  setTimeout(() => {
    out({ done: true });
    process.exit(0);
  }, 4000);
});
