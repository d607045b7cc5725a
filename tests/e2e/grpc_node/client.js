// Driver for the official RocketMQ 5 Node.js client (npm rocketmq-client-nodejs 1.0.8), run by
// tests/e2e/test_grpc_clients.py. Prints one JSON object per line: "sent"/"received" per message, then "done".
//
//   node client.js produce ENDPOINT TOPIC COUNT [BODY_BYTES] [GROUP] [--tls]
//   node client.js consume ENDPOINT TOPIC GROUP EXPECT TIMEOUT_S [--tls]
'use strict';
const crypto = require('crypto');
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

const emit = (event, fields) => process.stdout.write(JSON.stringify({ event, ...fields }) + '\n');
const md5 = (buf) => crypto.createHash('md5').update(buf).digest('hex');

async function produce(endpoints, topic, count, bodyBytes, group, sslEnabled) {
  const producer = new Producer({ endpoints, namespace: '', topics: [topic], sslEnabled, requestTimeout: 5000 });
  await producer.startup();
  for (let i = 0; i < count; i++) {
    let body = Buffer.from(`body-${i}`);
    if (bodyBytes > 0) body = Buffer.concat([body, Buffer.alloc(bodyBytes, 'x')]).subarray(0, bodyBytes);
    const message = { topic, tag: 'TagN', keys: [`nk${i}`], properties: new Map([['lang', 'node']]), body };
    if (group) message.messageGroup = group;
    const receipt = await producer.send(message);
    emit('sent', { index: i, message_id: receipt.messageId, md5: md5(body), size: body.length });
  }
  await producer.shutdown();
  emit('done', { sent: count });
}

async function consume(endpoints, topic, group, expect, timeoutS, sslEnabled) {
  const consumer = new SimpleConsumer({
    endpoints, namespace: '', consumerGroup: group, subscriptions: new Map().set(topic, '*'),
    awaitDuration: 3000, sslEnabled, requestTimeout: 5000,
  });
  await consumer.startup();
  let got = 0;
  const deadline = Date.now() + timeoutS * 1000;
  while (got < expect && Date.now() < deadline) {
    for (const m of await consumer.receive(16, 15000)) {
      emit('received', {
        message_id: m.messageId, tag: m.tag, keys: m.keys, properties: Object.fromEntries(m.properties),
        md5: md5(m.body), size: m.body.length, group: m.messageGroup || null, corrupted: m.corrupted,
      });
      await consumer.ack(m);
      got++;
    }
  }
  await consumer.shutdown();
  emit('done', { received: got });
  return got >= expect ? 0 : 1;
}

async function main() {
  const args = process.argv.slice(2);
  const tls = args.includes('--tls');
  const pos = args.filter((a) => a !== '--tls');
  if (pos[0] === 'produce') {
    await produce(pos[1], pos[2], Number(pos[3]), Number(pos[4] || 0), pos[5] || '', tls);
    return 0;
  }
  return consume(pos[1], pos[2], pos[3], Number(pos[4]), Number(pos[5]), tls);
}

main().then((rc) => process.exit(rc), (err) => {
  process.stderr.write(`${err && err.stack || err}\n`);
  process.exit(2);
});
