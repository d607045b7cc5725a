// Driver for MQTT.js (npm mqtt 5.16.0), run by tests/e2e/test_mqtt_js_clients.py.
// Prints one JSON object per line ("connected", "subscribed", "sent", "message", "error", "done");
// Buffers in properties print as {"hex": "..."}; payloads as "payload_hex".
//
//   node client.js pub  URL --id ID --protocol 4|5 [--auto-alias] --publish JSON [--publish JSON ...]
//        JSON: {"topic": "t", "payload_hex": "6869", "qos": 1, "retain": false, "properties": {...}}
//   node client.js sub  URL --id ID --protocol 4|5 [--topic FILTER:QOS ...] [--persistent EXPIRY_S]
//        [--expect N] [--linger MS] [--timeout MS]
//        Waits for N messages (then LINGER ms more, to report extras) or TIMEOUT ms; exit 1 if short.
//   node client.js will URL --id ID --protocol 4|5 --will JSON --then destroy|end
//        Connects with a will, then destroys the socket (abrupt close) or sends DISCONNECT.
//
// URL is mqtt://127.0.0.1:PORT or ws://127.0.0.1:PORT/mqtt. Automatic reconnects are off.
'use strict';
const mqtt = require('mqtt');

const toJson = (value) =>
  JSON.stringify(value, (key, v) => (v && v.type === 'Buffer' && Array.isArray(v.data)
    ? { hex: Buffer.from(v.data).toString('hex') } : v));
const emit = (event, fields) => process.stdout.write(toJson({ event, ...fields }) + '\n');
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function parseArgs(argv) {
  const [command, url, ...rest] = argv;
  const opts = { command, url, topic: [], publish: [] };
  for (let i = 0; i < rest.length; i++) {
    const name = rest[i].replace(/^--/, '').replace(/-([a-z])/g, (m, c) => c.toUpperCase());
    if (name === 'autoAlias') { opts.autoAlias = true; continue; }
    const value = rest[++i];
    if (Array.isArray(opts[name])) opts[name].push(value); else opts[name] = value;
  }
  return opts;
}

function connect(opts, extra, listen = () => {}) {
  const protocolVersion = Number(opts.protocol || 4);
  const options = {
    clientId: opts.id, protocolVersion, reconnectPeriod: 0, connectTimeout: 5000, keepalive: 30, ...extra,
  };
  return new Promise((resolve, reject) => {
    const client = mqtt.connect(opts.url, options);
    listen(client);
    const fail = (err) => reject(err);
    client.once('error', fail);
    client.once('close', () => fail(new Error('closed before CONNACK')));
    client.once('connect', (connack) => {
      client.removeListener('error', fail);
      client.on('error', (err) => emit('error', { message: err.message, code: err.code }));
      emit('connected', { session_present: connack.sessionPresent, properties: connack.properties || {} });
      resolve(client);
    });
  });
}

function publishOptions(spec) {
  const options = { qos: spec.qos || 0, retain: Boolean(spec.retain) };
  if (spec.properties) options.properties = spec.properties;
  return options;
}

async function pub(opts) {
  const client = await connect(opts, opts.autoAlias ? { autoAssignTopicAlias: true } : {});
  client.on('packetsend', (packet) => {
    if (packet.cmd !== 'publish') return;
    const alias = packet.properties && packet.properties.topicAlias;
    emit('sent', { topic: String(packet.topic), qos: packet.qos, alias: alias || null });
  });
  for (const raw of opts.publish) {
    const spec = JSON.parse(raw);
    await client.publishAsync(spec.topic, Buffer.from(spec.payload_hex || '', 'hex'), publishOptions(spec));
  }
  await client.endAsync();
  emit('done', { published: opts.publish.length });
  return 0;
}

async function sub(opts) {
  const expect = Number(opts.expect || 0);
  const extra = {};
  if (opts.persistent !== undefined) {
    extra.clean = false;
    if (Number(opts.protocol) === 5) extra.properties = { sessionExpiryInterval: Number(opts.persistent) };
  }
  let received = 0;
  let reached = null;
  const enough = new Promise((resolve) => { reached = resolve; });
  // Listen before CONNACK: a resumed session's queued messages may share its TCP segment.
  const client = await connect(opts, extra, (c) => c.on('message', (topic, payload, packet) => {
    emit('message', {
      topic, payload_hex: payload.toString('hex'), qos: packet.qos, retain: packet.retain,
      properties: packet.properties || {},
    });
    if (++received >= expect) reached();
  }));
  if (opts.topic.length > 0) {
    const filters = {};
    for (const item of opts.topic) {
      const at = item.lastIndexOf(':');
      filters[item.slice(0, at)] = { qos: Number(item.slice(at + 1)) };
    }
    const granted = await client.subscribeAsync(filters);
    emit('subscribed', { granted: granted.map((g) => ({ topic: g.topic, qos: g.qos })) });
  }
  if (expect === 0) reached();
  await Promise.race([enough, sleep(Number(opts.timeout || 10000))]);
  await sleep(Number(opts.linger || 0));
  await client.endAsync();
  emit('done', { received });
  return received >= expect ? 0 : 1;
}

async function will(opts) {
  const spec = JSON.parse(opts.will);
  const client = await connect(opts, {
    will: { topic: spec.topic, payload: Buffer.from(spec.payload_hex || '', 'hex'), ...publishOptions(spec) },
  });
  if (opts.then === 'destroy') {
    client.stream.destroy();
    await sleep(50);
    client.end(true);
  } else {
    await client.endAsync();
  }
  emit('done', { then: opts.then });
  return 0;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const commands = { pub, sub, will };
  if (!commands[opts.command]) throw new Error(`unknown command ${opts.command}`);
  return commands[opts.command](opts);
}

main().then(
  (code) => process.exit(code),
  (err) => { emit('error', { message: err.message, code: err.code }); process.exit(2); },
);
