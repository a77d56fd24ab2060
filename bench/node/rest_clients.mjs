// HTTP clients for bench/rest.py (Node's http with keep-alive: a fast client, one request at a time per loop).
// Usage: node rest_clients.mjs bare <url> <count>
//        node rest_clients.mjs publish <base> <channel> <count>
//        node rest_clients.mjs pull <base> <channel> <count> <consumers>   (pull + ack each message; a queue group when > 1)
// Prints "start" when the timed part begins, then one JSON line: {"ok": true, "seconds", "requests", ...}.
import http from "node:http";

const [mode, base, ...rest] = process.argv.slice(2);
const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
const fail = (error) => { console.log(JSON.stringify({ ok: false, error: String(error) })); process.exit(1); };
setTimeout(() => fail("timed out"), 300000);

function request(url, { method = "POST", headers = {}, body = "" } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, agent, headers }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on("error", reject);
    req.end(body);
  });
}
function links(res) {
  const out = {};
  for (const m of String(res.headers.link || "").matchAll(/<([^>]+)>; rel="([a-z-]+)"(?:; etag="([^"]+)")?/g)) {
    out[m[2]] = { url: m[1], etag: m[3] };
  }
  return out;
}

let result;
if (mode === "bare") {
  const count = Number(rest[0]);
  for (let i = 0; i < 200; i++) await request(base, { body: "x" });
  console.log("start");
  const t = performance.now();
  for (let i = 0; i < count; i++) await request(base, { body: "x" });
  result = { seconds: (performance.now() - t) / 1000, requests: count };
} else if (mode === "publish") {
  const [channel, countText] = rest;
  const count = Number(countText);
  console.log("start");
  const t = performance.now();
  for (let i = 0; i < count; i++) {
    const res = await request(`${base}/channels/${channel}/messages`, { body: `message ${i} `.padEnd(128, "x") });
    if (res.status !== 201) fail(`publish: ${res.status}`);
  }
  result = { seconds: (performance.now() - t) / 1000, requests: count, messages: count };
} else if (mode === "pull") {
  const [channel, countText, consumersText] = rest;
  const count = Number(countText);
  const consumers = Number(consumersText);
  const form = consumers > 1 ? "start=first&group=workers" : "start=first";
  const nexts = [];
  for (let i = 0; i < consumers; i++) {
    const made = await request(`${base}/channels/${channel}/pull-consumers`, {
      body: form, headers: { "content-type": "application/x-www-form-urlencoded" } });
    if (made.status !== 201) fail(`create: ${made.status} ${made.body}`);
    nexts.push(links(made).next.url);
  }
  let done = 0;
  let requests = 0;
  console.log("start");
  const t = performance.now();
  await Promise.all(nexts.map(async (first) => {
    let next = first;
    while (done < count) {
      const pulled = await request(next, { headers: { "accept-wait": "1" } });
      requests += 1;
      if (pulled.status === 503) continue;
      if (pulled.status !== 200) fail(`pull: ${pulled.status} ${pulled.body}`);
      const l = links(pulled);
      const acked = await request(l.acknowledgement.url, { headers: { "if-match": `"${l.acknowledgement.etag}"` } });
      requests += 1;
      if (acked.status !== 204) fail(`ack: ${acked.status} ${acked.body}`);
      done += 1;
      next = l.next.url;
    }
  }));
  result = { seconds: (performance.now() - t) / 1000, requests, messages: done };
} else {
  fail(`unknown mode ${mode}`);
}
console.log(JSON.stringify({ ok: true, ...result }));
agent.destroy();
process.exit(0);
