#!/usr/bin/env node
// Drive npm ali-ons@3.12.0 (pure-JS RocketMQ 4.x remoting client) from the command line.
//
//   node alions.js produce --namesrv HOST:PORT --topic T [--count N] [--start I] [--tag TagA]
//                          [--key key] [--body body] [--prop K=V]... [--group PG]
//   node alions.js consume --namesrv HOST:PORT --topic T --group G --expect N [--timeout S]
//                          [--linger S] [--expression *] [--prop-key K]...
//
//   node alions.js consume-fail --namesrv HOST:PORT --topic T --group G [--duration S]
//                          [--max-reconsume N]
//
// Same contract as cpp_client.py: one JSON object per line on stdout ("sent" / "started" /
// "received" / "done"); consume exits 0 when --expect messages arrived, 1 on timeout. The consumer
// closes cleanly (close() persists offsets and unregisters the client).
'use strict';

const { Producer, Consumer, Message } = require('ali-ons');

// ali-ons asserts an httpclient option; it is only used to resolve onsAddr, never with nameSrv.
const httpclient = { request: async () => { throw new Error('httpclient unused with nameSrv'); } };

function emit(obj) {
  const sorted = {};
  for (const key of Object.keys(obj).sort()) sorted[key] = obj[key];
  process.stdout.write(JSON.stringify(sorted) + '\n');
}

function parseArgs(argv) {
  const repeatable = new Set([ 'prop', 'prop-key' ]);
  const args = { prop: [], 'prop-key': [] };
  const command = argv[0];
  for (let i = 1; i < argv.length; i++) {
    const flag = argv[i];
    if (!flag.startsWith('--') || i + 1 >= argv.length) throw new Error(`bad argument ${flag}`);
    const name = flag.slice(2);
    const value = argv[++i];
    if (repeatable.has(name)) args[name].push(value);
    else args[name] = value;
  }
  for (const required of [ 'namesrv', 'topic' ]) {
    if (!args[required]) throw new Error(`--${required} is required`);
  }
  return { command, args };
}

async function produce(args) {
  const props = {};
  for (const item of args.prop) {
    const eq = item.indexOf('=');
    if (eq <= 0) throw new Error(`--prop expects KEY=VALUE, got ${item}`);
    props[item.slice(0, eq)] = item.slice(eq + 1);
  }
  const count = Number(args.count || 1);
  const start = Number(args.start || 0);
  const producer = new Producer({ httpclient, nameSrv: args.namesrv, producerGroup: args.group || 'PG' });
  producer.on('error', err => console.error('producer error:', err.message));
  await producer.ready();
  let sent = 0;
  for (let index = start; index < start + count; index++) {
    const msg = new Message(args.topic, args.tag || 'TagA', `${args.body || 'body'}-${index}`);
    msg.keys = [ `${args.key || 'key'}-${index}` ];
    for (const [ key, value ] of Object.entries(props)) msg.properties[key] = value;
    msg.properties.seq = String(index);
    const result = await producer.send(msg);
    emit({ event: 'sent', index, msg_id: result.msgId, status: result.sendStatus, offset: result.queueOffset });
    sent++;
  }
  emit({ event: 'done', sent });
  await producer.close();
  return 0;
}

async function consume(args) {
  const expect = Number(args.expect);
  const timeoutMs = Number(args.timeout || 30) * 1000;
  const lingerMs = Number(args.linger || 0) * 1000;
  const propKeys = [ ...args['prop-key'], 'seq' ];
  if (!args.group || !(expect > 0)) throw new Error('--group and --expect are required');

  let received = 0;
  let reached;
  const enough = new Promise(resolve => { reached = resolve; });
  const consumer = new Consumer({ httpclient, nameSrv: args.namesrv, consumerGroup: args.group });
  consumer.on('error', err => console.error('consumer error:', err.message));
  consumer.subscribe(args.topic, args.expression || '*', async msg => {
    const properties = {};
    for (const key of propKeys) {
      if (msg.properties[key]) properties[key] = msg.properties[key];
    }
    emit({
      event: 'received',
      topic: msg.topic,
      tags: msg.tags || null,
      keys: msg.keys || null,
      body: msg.body.toString('utf8'),
      properties,
      msg_id: msg.msgId,
      queue_id: msg.queueId,
      queue_offset: Number(msg.queueOffset),
      reconsume_times: msg.reconsumeTimes,
    });
    received++;
    if (received >= expect) reached(true);
  });
  await consumer.ready();
  emit({ event: 'started' });
  const ok = await Promise.race([ enough, new Promise(resolve => setTimeout(resolve, timeoutMs, false)) ]);
  await new Promise(resolve => setTimeout(resolve, lingerMs));
  const final = received;
  await consumer.close();
  emit({ event: 'done', received: final, expected: expect, timed_out: !ok });
  return ok ? 0 : 1;
}

// Fail every message (the listener throws) for --duration seconds; the client sends it back with
// maxReconsumeTimes = --max-reconsume (default 16) and drops it locally beyond that count. Throwing, not
// returning ACTION_RETRY: ali-ons's own %RETRY% listener drops the user listener's return value.
async function consumeFail(args) {
  if (!args.group) throw new Error('--group is required');
  const durationMs = Number(args.duration || 20) * 1000;
  const options = { httpclient, nameSrv: args.namesrv, consumerGroup: args.group };
  if (args['max-reconsume'] !== undefined) options.maxReconsumeTimes = Number(args['max-reconsume']);
  const consumer = new Consumer(options);
  consumer.on('error', err => {
    if (!/failing on purpose/.test(err.message)) console.error('consumer error:', err.message);
  });
  consumer.subscribe(args.topic, args.expression || '*', async msg => {
    emit({
      event: 'received',
      t: Date.now() / 1000,
      topic: msg.topic,
      body: msg.body.toString('utf8'),
      msg_id: msg.msgId,
      queue_id: msg.queueId,
      reconsume_times: msg.reconsumeTimes,
    });
    throw new Error('failing on purpose');
  });
  await consumer.ready();
  emit({ event: 'started' });
  await new Promise(resolve => setTimeout(resolve, durationMs));
  await consumer.close();
  emit({ event: 'done' });
  return 0;
}

async function main() {
  const { command, args } = parseArgs(process.argv.slice(2));
  if (command === 'produce') return produce(args);
  if (command === 'consume') return consume(args);
  if (command === 'consume-fail') return consumeFail(args);
  throw new Error(`unknown command ${command}; expected produce, consume or consume-fail`);
}

main().then(code => process.exit(code), err => {
  console.error(err && err.stack || err);
  process.exit(2);
});
