// The live page's logic: one pull consumer, a long-poll loop that follows the server's `next` links,
// one row per message (updated when it comes back after AckWait), and an Ack button per delivery that
// acknowledges with the delivery's ETag (If-Match), as any HTTP client of the pull API does.

const $ = (id) => document.getElementById(id);
const rows = new Map(); // seq -> <tr>
let session = 0; // bumped by each Open: an older loop stops

// `Link: <url>; rel="next", <url>; rel="acknowledgement"; etag="..."` -> {rel: {url, etag}}
function parseLinks(header) {
  const links = {};
  for (const part of (header || "").split(/,(?=\s*<)/)) {
    const url = /<([^>]*)>/.exec(part);
    const rel = /;\s*rel="?([^";]+)"?/.exec(part);
    if (!url || !rel) continue;
    const etag = /;\s*etag="([^"]*)"/.exec(part);
    links[rel[1]] = { url: url[1], etag: etag ? etag[1] : null };
  }
  return links;
}

function status(text, error = false) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

function show(response, body) {
  const seq = Number(response.headers.get("Msg-Sequence"));
  const redelivered = response.headers.get("Msg-Redelivered") === "true";
  const count = response.headers.get("Msg-Delivery-Count");
  const ack = parseLinks(response.headers.get("Link")).acknowledgement;
  let tr = rows.get(seq);
  if (!tr) {
    tr = document.createElement("tr");
    tr.innerHTML = '<td class="seq"></td><td class="flag"></td><td class="time"></td><td class="data"></td><td><button>Ack</button></td>';
    rows.set(seq, tr);
    $("rows").prepend(tr);
  }
  tr.dataset.seq = seq;
  tr.classList.toggle("redelivered", redelivered);
  tr.classList.remove("acked");
  tr.querySelector(".seq").textContent = seq;
  tr.querySelector(".flag").textContent = redelivered ? `redelivered (#${count})` : "first";
  tr.querySelector(".time").textContent = new Date(response.headers.get("Msg-Timestamp")).toLocaleTimeString();
  tr.querySelector(".data").textContent = body;
  const button = tr.querySelector("button");
  button.disabled = !ack;
  button.onclick = async () => {
    button.disabled = true;
    const r = await fetch(ack.url, {
      method: "POST",
      headers: { "If-Match": `"${ack.etag}"` },
      body: new URLSearchParams({ acknowledge: "true" }),
    });
    if (r.status === 204) tr.classList.add("acked");
    else if (r.status === 412) status(`seq ${seq}: that delivery is no longer current (it came back after AckWait)`, true);
    else status(`seq ${seq}: ack answered ${r.status}`, true);
  };
}

async function run(mine, api, channel) {
  const made = await fetch(`${api}/channels/${encodeURIComponent(channel)}/pull-consumers`, {
    method: "POST",
    body: new URLSearchParams({
      ack_wait: $("ackwait").value,
      max_inflight: $("inflight").value,
      start: $("start").value,
    }),
  });
  if (made.status !== 201) throw new Error(`creating the consumer answered ${made.status}: ${await made.text()}`);
  let next = parseLinks(made.headers.get("Link")).next.url;
  status(`Open on ${channel}: ${made.headers.get("Location")}`);
  while (mine === session) {
    const r = await fetch(next, { method: "POST", headers: { "Accept-Wait": "20" } });
    const links = parseLinks(r.headers.get("Link"));
    if (links.next) next = links.next.url;
    if (r.status === 200) show(r, await r.text());
    else if (r.status === 503 || r.status === 409) await r.text(); // nothing yet, or MaxInflight reached: pull again
    else throw new Error(`pull answered ${r.status}: ${await r.text()}`);
    if (r.status === 409) await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

$("open").onsubmit = (event) => {
  event.preventDefault();
  const mine = ++session;
  rows.clear();
  $("rows").replaceChildren();
  const api = $("api").value.replace(/\/+$/, "");
  run(mine, api, $("channel").value).catch((e) => {
    if (mine === session) status(`${e} (is ${location.origin} in --http_api_allow_origins?)`, true);
  });
};

$("publish").onsubmit = async (event) => {
  event.preventDefault();
  const api = $("api").value.replace(/\/+$/, "");
  try {
    const r = await fetch(`${api}/channels/${encodeURIComponent($("channel").value)}/messages`, {
      method: "POST",
      headers: { "Content-Type": "text/plain" },
      body: $("text").value,
    });
    if (r.status !== 201) status(`publish answered ${r.status}`, true);
    else $("text").value = "";
  } catch (e) {
    status(`publish failed: ${e}`, true);
  }
};
