// Fast clients for the benchmarks: the same workload driven from Node on both sides.
// Usage: node clients.js <system> <workload> <port> <messages> [subscribers] [queue]
//   system: ours, stan or floor (node-nats-streaming; stan: nats-streaming-server; floor: bench/stan_floor.py)
//           | jetstream (nats.js 2.x, a file stream)
//   workload: publish (pipelined, every PubAck awaited at the end) | sequential (one at a time, each
//             PubAck awaited before the next publish; 300 untimed first) | consume (pre-published,
//             then push delivery with an ack per message, MaxInflight / max_ack_pending 1024)
// Prints `start` when the timed part starts, then one JSON line: {"ok": true, "msgs_per_s": N,
// "seconds": S, "reads": R, "read_p50_bytes": B} (the timed part only; R: reads of the client's
// sockets, B: their median size), or {"ok": false, "error": ...}.
'use strict';

const [system, workload, portText, messagesText, subsText = '1', queueText = ''] = process.argv.slice(2);
const port = Number(portText);
const total = Number(messagesText);
const subscribers = Number(subsText);
const queue = queueText === 'queue';
const payload = Buffer.alloc(128, 120);
const WINDOW = 16384;

// How a server's writes reach the client: the reads of its sockets over the timed part, by size
// (each read is a pass of the client's parser and of its acks' writes: fewer, fuller reads cost it
// less per message).
const readSizes = [];
let counting = false;
const net = require('net');
const emit = net.Socket.prototype.emit;
net.Socket.prototype.emit = function (event, ...args) {
  if (counting && event === 'data') readSizes.push(args[0].length);
  return emit.call(this, event, ...args);
};

const done = (result) => { console.log(JSON.stringify(Object.assign({ ok: true }, result))); process.exit(0); };
const fail = (error) => { console.log(JSON.stringify({ ok: false, error: String(error && error.stack || error) })); process.exit(1); };
setTimeout(() => fail(`${system} ${workload} timed out`), 120000);

// -- ours: node-nats-streaming ----------------------------------------------------------------

function stanConnect(clientID) {
  const stan = require('node-nats-streaming');
  return new Promise((resolve, reject) => {
    const sc = stan.connect('test-cluster', clientID, { url: `nats://127.0.0.1:${port}`, maxPubAcksInflight: WINDOW });
    sc.on('connect', () => resolve(sc));
    sc.on('error', reject);
  });
}

function stanPublishAll(sc, channel, n) {
  return new Promise((resolve, reject) => {
    let acked = 0;
    let sent = 0;
    const onAck = (err) => {
      if (err) return reject(err);
      acked += 1;
      if (acked === n) resolve();
      else if (sent < n) pump();
    };
    // node-nats-streaming blocks past maxPubAcksInflight by throwing; keep a window open instead.
    const pump = () => {
      while (sent < n && sent - acked < WINDOW) {
        sent += 1;
        sc.publish(channel, payload, onAck);
      }
    };
    pump();
  });
}

async function ours() {
  const channel = 'bench';
  const pub = await stanConnect('node-pub');
  if (workload === 'publish') {
    const started = begin();
    await stanPublishAll(pub, channel, total);
    return finish(started, total);
  }
  if (workload === 'sequential') {
    return oneAtATime(() => new Promise((resolve, reject) => pub.publish(channel, payload, (err) => (err ? reject(err) : resolve()))));
  }
  await stanPublishAll(pub, channel, total);
  const expected = queue ? total : total * subscribers;
  let received = 0;
  let started;
  await new Promise(async (resolve) => {
    const conns = [];
    for (let i = 0; i < subscribers; i++) conns.push(await stanConnect(`node-sub-${i}`));
    started = begin();
    for (const sc of conns) {
      const opts = sc.subscriptionOptions().setManualAckMode(true).setMaxInFlight(1024).setDeliverAllAvailable();
      const sub = queue ? sc.subscribe(channel, 'workers', opts) : sc.subscribe(channel, opts);
      sub.on('message', (m) => {
        m.ack();
        received += 1;
        if (received === expected) resolve();
      });
    }
  });
  return finish(started, expected);
}

// -- JetStream: nats.js 2.x --------------------------------------------------------------------

async function jetstream() {
  const { connect, AckPolicy, DeliverPolicy } = require('nats');
  const nc = await connect({ port });
  const jsm = await nc.jetstreamManager();
  // JS_REPLICAS: copies of the stream on a JetStream cluster (bench/ha.py: 3).
  await jsm.streams.add({ name: 'BENCH', subjects: ['bench'], storage: 'file', num_replicas: Number(process.env.JS_REPLICAS || 1) });
  const js = nc.jetstream();
  const publishAll = async (n) => {
    let pending = [];
    for (let i = 0; i < n; i++) {
      pending.push(js.publish('bench', payload));
      if (pending.length >= WINDOW) { await Promise.all(pending); pending = []; }
    }
    await Promise.all(pending);
  };
  if (workload === 'publish') {
    const started = begin();
    await publishAll(total);
    return finish(started, total);
  }
  if (workload === 'sequential') return oneAtATime(() => js.publish('bench', payload));
  await publishAll(total);
  const consumers = queue ? 1 : subscribers;
  for (let i = 0; i < consumers; i++) {
    await jsm.consumers.add('BENCH', {
      durable_name: `c${i}`, ack_policy: AckPolicy.Explicit, deliver_policy: DeliverPolicy.All, max_ack_pending: 1024,
    });
  }
  const expected = queue ? total : total * subscribers;
  let received = 0;
  const started = begin();
  await new Promise(async (resolve) => {
    for (let i = 0; i < subscribers; i++) {
      const conn = await connect({ port });
      const consumer = await conn.jetstream().consumers.get('BENCH', queue ? 'c0' : `c${i}`);
      const messages = await consumer.consume({ max_messages: 1024 });
      (async () => {
        for await (const m of messages) {
          m.ack();
          received += 1;
          if (received === expected) resolve();
        }
      })();
    }
  });
  return finish(started, expected);
}

// Publish one at a time, each confirmation awaited before the next: 300 untimed, then `total` timed.
async function oneAtATime(publishOne) {
  for (let i = 0; i < 300; i++) await publishOne();
  const started = begin();
  for (let i = 0; i < total; i++) await publishOne();
  return finish(started, total);
}

// The timed part starts: say so, so that the benchmark samples the server's CPU from here.
let cpuAtStart;
function begin() {
  process.stdout.write('start\n');
  cpuAtStart = process.cpuUsage();
  counting = true;
  return process.hrtime.bigint();
}

function finish(started, count) {
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const cpu = process.cpuUsage(cpuAtStart);
  counting = false;
  readSizes.sort((a, b) => a - b);
  const reads = readSizes.length;
  const median = reads ? readSizes[Math.floor((reads - 1) / 2)] : 0;
  done({ msgs_per_s: count / seconds, seconds, client_us_per_msg: (cpu.user + cpu.system) / count, reads, read_p50_bytes: median });
}

(['ours', 'stan', 'floor'].includes(system) ? ours() : jetstream()).catch(fail);
