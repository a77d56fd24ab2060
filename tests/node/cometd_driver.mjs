// Drives the real CometD JavaScript client (cometd 9 under Node, cometd-nodejs-client) for pytest.
// Usage: node cometd_driver.mjs <url> <options JSON>
//   options: {ack: bool, websocket: bool, backoff: ms, maxNetworkDelay: ms, subscribe: [channels],
//             nak: {data, delay}: the message listener gives back, once, each message whose data is `data`}
// Reads commands from stdin, one JSON object per line:
//   {"op": "publish", "channel": "/a", "data": ...}   {"op": "subscribe", "channel": "/a"}
//   {"op": "unsubscribe", "channel": "/a"}             {"op": "disconnect"}
//   {"op": "nak", "id": "<delivery id>", "delay": s}   give a message back with the next connect (our ext.nak)
// Writes events to stdout, one JSON object per line:
//   {"ev": "out", "message": {...}}      every message the client sends (after its extensions)
//   {"ev": "in", "message": {...}}       every message it receives (before its extensions)
//   {"ev": "handshake" | "connect" | "disconnect", "message": {...}}   meta replies, as listeners see them
//   {"ev": "subscribed" | "unsubscribed" | "disconnected", "message": {...}}   replies to our commands
//   {"ev": "message", "channel", "data", "id"}   what the application sees
//   {"ev": "published", "channel", "successful", "error"}
// The subscriptions in `subscribe` are made again on every successful handshake (the client drops
// its subscriptions when it handshakes again and does not restore them itself).
import { adapt } from "cometd-nodejs-client";
import { CometD, AckExtension } from "cometd";
import readline from "node:readline";

const [url, optionsText] = process.argv.slice(2);
const options = JSON.parse(optionsText || "{}");
const emit = (event) => process.stdout.write(JSON.stringify(event) + "\n");

adapt();
const cometd = new CometD();
cometd.websocketEnabled = Boolean(options.websocket);
// Sees what goes on the wire. Outgoing extensions run in the reverse order of registration, so this
// one, registered first, sees outgoing messages last (with the ack extension's fields) and incoming first.
cometd.registerExtension("wire", {
  outgoing: (message) => { emit({ ev: "out", message }); return message; },
  incoming: (message) => { emit({ ev: "in", message }); return message; },
});
// Our negative-ack extension, as docs/bayeux.md shows it: naks ride on the next /meta/connect. Registered
// before the ack extension, so it runs after it on the way out and adds to the ext that one wrote.
const naks = [];
cometd.registerExtension("nak", {
  outgoing: (message) => {
    if (message.channel === "/meta/connect" && naks.length) {
      message.ext = message.ext || {};
      message.ext.nak = naks.splice(0);
    }
    return message;
  },
});
cometd.registerExtension("ack", new AckExtension());
cometd.ackEnabled = options.ack !== false; // false: the extension asks the server for no acks
cometd.configure({
  url,
  backoffIncrement: options.backoff ?? 100,
  maxBackoff: options.maxBackoff ?? 500,
  maxNetworkDelay: options.maxNetworkDelay ?? 5000,
});

const channels = new Set(options.subscribe || []);
const handles = new Map(); // channel -> the client's subscription handle, for unsubscribe
const nakedOnce = new Set();
const onMessage = (m) => {
  emit({ ev: "message", channel: m.channel, data: m.data, id: m.id });
  // In the listener, as a page's handler would: the nak rides on the connect that acknowledges m's batch.
  if (options.nak && m.data === options.nak.data && !nakedOnce.has(m.id)) {
    nakedOnce.add(m.id);
    naks.push({ id: m.id, delay: options.nak.delay });
  }
};
const subscribe = (channel) =>
  handles.set(channel, cometd.subscribe(channel, onMessage, (reply) => emit({ ev: "subscribed", message: reply })));

for (const meta of ["/meta/connect", "/meta/disconnect"]) {
  cometd.addListener(meta, (message) => emit({ ev: meta.slice(6), message }));
}
cometd.addListener("/meta/handshake", (message) => {
  emit({ ev: "handshake", message });
  if (message.successful) for (const channel of channels) subscribe(channel);
});

const commands = {
  publish: ({ channel, data }) =>
    cometd.publish(channel, data, (reply) =>
      emit({ ev: "published", channel, successful: reply.successful, error: reply.error })),
  subscribe: ({ channel }) => { channels.add(channel); subscribe(channel); },
  unsubscribe: ({ channel }) => {
    channels.delete(channel);
    cometd.unsubscribe(handles.get(channel), (reply) => emit({ ev: "unsubscribed", message: reply }));
    handles.delete(channel);
  },
  disconnect: () => cometd.disconnect((reply) => emit({ ev: "disconnected", message: reply })),
  nak: ({ id, delay }) => naks.push({ id, delay }),
};

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  if (!line.trim()) return;
  const command = JSON.parse(line);
  const run = commands[command.op];
  if (!run) emit({ ev: "error", error: `unknown op ${command.op}` });
  else run(command);
});
process.stdin.on("end", () => process.exit(0));
cometd.handshake();
