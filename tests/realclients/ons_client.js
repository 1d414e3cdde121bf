'use strict';
/*
 * Drives ali-ons 3.12.0 (Alibaba's pure-JS RocketMQ 4.x client) for Sluice's acceptance tests.
 *
 *   node ons_client.js send --namesrv H:P --topic T --group G --messages JSON|@file [--timeout S]
 *   node ons_client.js push --namesrv H:P --topic T --group G (--expression 'TagA || TagB' | --sql EXPR)
 *                           [--expect N] [--linger S] [--settle S] [--timeout S]
 *
 * Messages are [{"tags", "keys": [...], "props": {...}, "body_b64"}]. Output is one JSON object per
 * line (one per message sent or received, {"event": "ready"} once a consumer is started), then
 * {"event": "summary", "ok": ...}. Exit status: 0 done, 1 the job failed, 2 bad usage or nothing
 * listening at --namesrv, 3 the watchdog fired.
 *
 * ali-ons re-checks tags on the client but not SQL92, so only --sql shows server-side filtering.
 * Push consumers start from the first offset, so a new group sees what was sent before it started.
 */

const net = require('net');
const { Producer, Consumer, Message } = require('ali-ons');

let finished = false;

// The summary is the last line: whatever the client reports while shutting down is dropped.
function emit(obj) {
  if (!finished) process.stdout.write(JSON.stringify(obj) + '\n');
}

function finish(code, summary) {
  if (finished) return;
  emit(Object.assign({ event: 'summary', ok: code === 0 }, summary));
  finished = true;
  // Exit only once stdout has drained: a pipe write can still be pending here.
  process.stdout.write('', () => process.exit(code));
}

function parseArgs(argv) {
  const [command, ...rest] = argv;
  const opts = { command };
  for (let i = 0; i < rest.length; i += 2) {
    if (!rest[i].startsWith('--') || i + 1 >= rest.length) {
      throw new Error(`bad argument near ${JSON.stringify(rest[i])}: expected --name value pairs`);
    }
    opts[rest[i].slice(2)] = rest[i + 1];
  }
  if (!['send', 'push'].includes(command)) throw new Error(`unknown command ${JSON.stringify(command)}: use send or push`);
  for (const name of ['namesrv', 'topic', 'group']) {
    if (!opts[name]) throw new Error(`--${name} is required`);
  }
  if (command === 'send' && !opts.messages) throw new Error('--messages is required');
  if (command === 'push' && (opts.expression === undefined) === (opts.sql === undefined)) {
    throw new Error('push needs exactly one of --expression and --sql');
  }
  opts.timeout = Number(opts.timeout || 30);
  opts.expect = Number(opts.expect || 0);
  opts.linger = Number(opts.linger === undefined ? 2 : opts.linger);
  opts.settle = Number(opts.settle === undefined ? 1 : opts.settle);
  return opts;
}

function loadMessages(text) {
  if (text.startsWith('@')) text = require('fs').readFileSync(text.slice(1), 'utf8');
  const specs = JSON.parse(text);
  if (!Array.isArray(specs) || !specs.every(s => s && typeof s === 'object')) {
    throw new Error('--messages must be a JSON list of objects');
  }
  return specs;
}

// Fail fast and clearly when nothing listens, instead of waiting out the client's retries.
function checkNamesrv(addr) {
  const idx = addr.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: addr.slice(0, idx), port: Number(addr.slice(idx + 1)) });
    sock.setTimeout(3000, () => { sock.destroy(); reject(new Error('connect timed out')); });
    sock.on('connect', () => { sock.end(); resolve(); });
    sock.on('error', reject);
  });
}

function clientOptions(opts, extra) {
  return Object.assign({
    nameSrv: opts.namesrv,
    // Required by ali-ons but never called when nameSrv is given (no HTTP address lookup).
    httpclient: { request: async () => { throw new Error('httpclient must not be used'); } },
    // The client signs every request; any non-empty pair does, a server without ACL ignores it.
    accessKeyId: opts['access-key'] || 'sluice',
    accessKeySecret: opts['secret-key'] || 'sluice',
    logger: { info() {}, debug() {}, warn: (...a) => console.error('[ali-ons warn]', ...a),
      error: (...a) => console.error('[ali-ons error]', ...a) },
  }, extra);
}

function describe(msg) {
  const props = Object.assign({}, msg.properties || {});
  delete props['']; // ali-ons' property parser turns the trailing separator into an empty key
  return {
    topic: msg.topic,
    tags: msg.tags || null,
    keys: (msg.keys || '').split(' ').filter(Boolean),
    properties: props,
    uniq_key: props.UNIQ_KEY || null,
    body_b64: (msg.body || Buffer.alloc(0)).toString('base64'),
    msg_id: msg.msgId,
    queue_id: msg.queueId,
    queue_offset: msg.queueOffset,
    commit_log_offset: msg.commitLogOffset,
    reconsume_times: msg.reconsumeTimes,
  };
}

async function runSend(opts, specs) {
  const producer = new Producer(clientOptions(opts, { producerGroup: opts.group }));
  producer.on('error', err => emit({ event: 'client_error', error: String(err && err.message || err) }));
  await producer.ready();
  let sent = 0;
  let error = null;
  for (const [index, spec] of specs.entries()) {
    const msg = new Message(opts.topic, spec.tags || null, Buffer.from(spec.body_b64 || '', 'base64'));
    // The constructor stores a null tag as the string "null": an untagged message has no TAGS at all.
    if (!spec.tags) delete msg.properties.TAGS;
    if (spec.keys && spec.keys.length) msg.keys = spec.keys;
    for (const [k, v] of Object.entries(spec.props || {})) msg.properties[k] = String(v);
    try {
      const r = await producer.send(msg);
      emit({ event: 'sent', index, status: r.sendStatus, msg_id: r.msgId,
        queue_id: r.messageQueue && r.messageQueue.queueId, offset: r.queueOffset });
      sent++;
      if (r.sendStatus !== 'SEND_OK') { error = `send ${index} returned ${r.sendStatus}`; break; }
    } catch (err) {
      error = `send ${index} failed: ${err.name}: ${err.message}`;
      break;
    }
  }
  await producer.close();
  finish(error ? 1 : 0, { sent, wanted: specs.length, error });
}

async function runPush(opts) {
  const consumer = new Consumer(clientOptions(opts, {
    consumerGroup: opts.group,
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    // Rebalance often so a fresh consumer owns its queues quickly.
    rebalanceInterval: 2000,
    persistConsumerOffsetInterval: 1000,
  }));
  // Reported, not fatal: e.g. a new group's QUERY_NOT_FOUND offset shows up here and is normal.
  consumer.on('error', err => emit({ event: 'client_error', error: String(err && err.message || err) }));
  let received = 0;
  let reachedResolve;
  const reached = new Promise(resolve => { reachedResolve = resolve; });
  const expression = opts.sql !== undefined ? { expressionType: 'SQL92', subString: opts.sql } : opts.expression;
  consumer.subscribe(opts.topic, expression, async msg => {
    emit(Object.assign({ event: 'message' }, describe(msg)));
    received++;
    if (received >= opts.expect) reachedResolve();
  });
  await consumer.ready();
  await sleep(opts.settle * 1000);
  emit({ event: 'ready' });
  if (opts.expect === 0) reachedResolve();
  const left = opts.deadline - Date.now();
  const ok = await Promise.race([reached.then(() => true), sleep(left).then(() => false)]);
  if (ok) await sleep(Math.min(opts.linger * 1000, Math.max(0, opts.deadline - Date.now())));
  const got = received;
  await consumer.close();
  const error = got >= opts.expect ? null : `received ${got} of ${opts.expect} messages before the deadline`;
  finish(error ? 1 : 0, { received: got, expected: opts.expect, error });
}

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, Math.max(0, ms)));
}

async function main() {
  let opts;
  let specs;
  try {
    opts = parseArgs(process.argv.slice(2));
    if (opts.command === 'send') specs = loadMessages(opts.messages);
  } catch (err) {
    return finish(2, { error: `usage: ${err.message}` });
  }
  opts.deadline = Date.now() + opts.timeout * 1000;
  // ali-ons retries without end on a dead server; never outlive the caller's budget.
  setTimeout(() => {
    emit({ event: 'error', error: `watchdog: still running after ${opts.timeout + 10}s` });
    finish(3, { error: 'watchdog' });
  }, (opts.timeout + 10) * 1000);
  try {
    await checkNamesrv(opts.namesrv);
  } catch (err) {
    return finish(2, { error: `namesrv ${opts.namesrv} not reachable: ${err.message}` });
  }
  try {
    if (opts.command === 'send') await runSend(opts, specs);
    else await runPush(opts);
  } catch (err) {
    finish(1, { error: `${err.name}: ${err.message}` });
  }
}

process.on('exit', code => {
  // A promise that never settles lets node exit quietly with status 0: never report that as success.
  if (!finished) {
    emit({ event: 'summary', ok: false, error: 'exited without finishing its job' });
    finished = true;
    process.exitCode = code || 1;
  }
});

main();
