'use strict'
// The host transport (`{ transport: 'host' }`): a check's bytes move on this event loop
// (host.js, one net.Socket per shard) and the core's state machine decides. Its decisions
// equal the default transport's; a stopped Redis gives the on_error fallback within the
// deadline; a killed one is reconnected to; a hostile reply fails the checks in flight
// with a clear error and never hands one check another's decision.

const test = require('node:test')
const assert = require('node:assert/strict')
const net = require('node:net')
const { Limiter, ManualClock, ConnectionError } = require('..')
const { startRedis, freePort } = require('./support/redis.js')

const T0 = 1_800_000_000_000_000
const POLICIES = {
  fw: { algorithm: 'fixed_window', limit: 7, window: '1m' },
  sl: { algorithm: 'sliding_log', limit: 5, window: '1m' },
  tb: { algorithm: 'token_bucket', capacity: 6, refill_per_sec: 0.5 },
  sw: { algorithm: 'sliding_window', limit: 4, window: '1m' },
}

let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

const shape = (d) => ({
  allowed: d.allowed,
  remaining: d.remaining,
  limit: d.limit,
  resetAfter: d.resetAfter,
  retryAfter: d.retryAfter,
  source: d.source,
  shard: d.shard,
  policy: d.policy,
})

test('decisions equal the thread transport', async () => {
  const clock = new ManualClock(T0)
  const config = (prefix) => ({ ...redis.config(POLICIES), key_prefix: prefix })
  const byDefault = Limiter.fromJson(config('d:'), { clock, transport: 'thread' })
  const hosted = Limiter.fromJson(config('h:'), { clock, transport: 'host' })
  try {
    let compared = 0
    for (let round = 0; round < 10; round++) {
      // one burst: every key under every policy once, costs 1 to 3
      const checks = []
      for (const [pi, policy] of Object.keys(POLICIES).entries()) {
        for (let k = 0; k < 8; k++) checks.push([`user-${k}`, policy, 1 + ((round + k + pi) % 3)])
      }
      const [want, got] = await Promise.all([
        Promise.all(checks.map(([key, policy, cost]) => byDefault.check(key, { policy, cost }))),
        Promise.all(checks.map(([key, policy, cost]) => hosted.check(key, { policy, cost }))),
      ])
      for (let i = 0; i < checks.length; i++) {
        assert.equal(got[i].source, 'redis')
        assert.deepEqual(shape(got[i]), shape(want[i]), `round ${round}, ${checks[i]}`)
        compared++
      }
      clock.advanceUs(3_100_000)
    }
    assert.equal(compared, 10 * 32)
    // counted like any check
    const text = hosted.metrics()
    const counted = [...text.matchAll(/^shardlimit_(?:allowed|denied)_total\{[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0)
    assert.equal(counted, compared, text)
  } finally {
    byDefault.close()
    hosted.close()
  }
})

test('what the host transport does not carry goes the default way, with the same answers', async () => {
  const limiter = Limiter.fromJson(
    redis.config({
      sh: { algorithm: 'fixed_window', limit: 1, window: '1m', shadow: true },
      fw: { algorithm: 'fixed_window', limit: 2, window: '1m' },
    }),
    { transport: 'host' }
  )
  try {
    await limiter.check('shadowed', 'sh')
    const d = await limiter.check('shadowed', 'sh')
    assert.equal(d.allowed, true)
    assert.equal(d.shadowDenied, true)
    await assert.rejects(limiter.check('', 'fw'), /key/)
    await assert.rejects(limiter.check('k', 'nope'), /nope/)
    assert.equal((await limiter.peek('k', 'fw')).remaining, 2)
    const inFlight = limiter.check('closing', 'fw')
    limiter.close()
    // a check in flight when the limiter closes is still answered by Redis (as on the I/O
    // thread), a later one rejects
    const last = await inFlight
    assert.equal(last.source, 'redis')
    assert.equal(last.remaining, 1)
    await assert.rejects(limiter.check('k', 'fw'), /closed/)
  } finally {
    limiter.close()
  }
  assert.throws(() => Limiter.fromJson(redis.config({}), { transport: 'carrier pigeon' }), /options.transport/)
  assert.throws(
    () => Limiter.fromJson({ shards: [{ name: 't', url: 'rediss://127.0.0.1:1' }], policies: {} }, { transport: 'host' }),
    /plain TCP only/
  )
})

test('a stopped Redis gives the on_error fallback within the deadline; a killed one is reconnected to', async () => {
  const own = await startRedis()
  let restarted = null
  const limiter = Limiter.fromJson(own.config(POLICIES, { timeout_ms: 300, on_error: 'open' }), { transport: 'host' })
  try {
    assert.equal((await limiter.check('k', 'fw')).source, 'redis')
    process.kill(own.pid, 'SIGSTOP')
    const t0 = Date.now()
    let ds
    try {
      ds = await Promise.all([limiter.check('k', 'fw'), limiter.check('j', 'fw')])
    } finally {
      process.kill(own.pid, 'SIGCONT')
    }
    const took = Date.now() - t0
    for (const d of ds) {
      assert.equal(d.allowed, true)
      assert.equal(d.source, 'fallback')
    }
    assert.ok(took >= 290 && took < 1000, `the deadline is 300 ms, took ${took} ms`)
    // answering again: a new connection decides on Redis
    const deadline = Date.now() + 5000
    for (;;) {
      const d = await limiter.check('k', 'fw')
      if (d.source === 'redis') {
        assert.equal(d.remaining, 5)
        break
      }
      assert.ok(Date.now() < deadline, 'never reconnected after SIGCONT')
      await new Promise((r) => setTimeout(r, 20))
    }
    // killed: the fallback, for an outage long enough (1.5 s, a check every 10 ms) that the
    // circuit is open and every back-off at its longest
    await own.stop()
    const outage = Date.now() + 1500
    while (Date.now() < outage) {
      assert.equal((await limiter.check('k', 'fw')).source, 'fallback')
      await new Promise((r) => setTimeout(r, 10))
    }
    // restarted on its port: the checks use Redis again within 500 ms of its start (counted
    // from before the spawn, so Redis's own start-up is in it too)
    let stop = false
    let firstRedis = null
    const checking = (async () => {
      while (!stop) {
        const d = await limiter.check('fresh', 'fw')
        if (d.source === 'redis') {
          firstRedis = { at: Date.now(), remaining: d.remaining }
          return
        }
        await new Promise((r) => setTimeout(r, 5))
      }
    })()
    const spawned = Date.now()
    restarted = await startRedis(['--port', String(own.port)])
    const until = Date.now() + 5000
    while (firstRedis === null && Date.now() < until) await new Promise((r) => setTimeout(r, 5))
    stop = true
    await checking
    assert.notEqual(firstRedis, null, 'never reconnected after a restart')
    assert.equal(firstRedis.remaining, 6)
    const reconnect = firstRedis.at - spawned
    if (process.env.SHARDLIMIT_TEST_SAY) console.log(`reconnect ${reconnect} ms`)
    assert.ok(reconnect < 500, `Redis was used again ${reconnect} ms after its restart (the promise: under 500 ms)`)
  } finally {
    limiter.close()
    await own.stop()
    if (restarted !== null) await restarted.stop()
  }
})

/** A fake Redis: answers each script call with `answer(tags)` (RESP text). */
async function fakeRedis(answer) {
  const port = await freePort()
  const sockets = new Set()
  const server = net.createServer((sock) => {
    sockets.add(sock)
    sock.on('close', () => sockets.delete(sock))
    sock.on('error', () => {})
    let buf = Buffer.alloc(0)
    sock.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk])
      for (;;) {
        const cmd = parseCommand(buf)
        if (cmd === null) return
        buf = buf.subarray(cmd.used)
        const args = cmd.args
        // (the circuit's probe, made by the core on its own connection)
        if (args[0].toUpperCase() === 'PING') {
          sock.write('+PONG\r\n')
          continue
        }
        const tags = checkTags(args)
        let reply = answer(tags)
        if (tags.head !== undefined && reply.startsWith('*')) {
          // a compact batch's reply: the call's tag first
          const end = reply.indexOf('\r\n')
          reply = `*${Number(reply.slice(1, end)) + 1}\r\n:${tags.head}\r\n` + reply.slice(end + 2)
        }
        sock.write(reply)
      }
    })
  })
  await new Promise((r) => server.listen(port, '127.0.0.1', r))
  return {
    url: `redis://127.0.0.1:${port}`,
    close: () => {
      for (const s of sockets) s.destroy()
      return new Promise((r) => server.close(r))
    },
  }
}

/**
 * The tag of each check of an EVALSHA: a single call (2 keys, core/lua/main_check.lua)
 * has it last; a batch (core/lua/main_batch.lua) sends its shapes first, then per check
 * its shape, its cost, its flags and the values they name (n, x, g, o one each), its tag;
 * in the compact layout (plain checks of one shape, cost 1) "0", the shape, the call's tag.
 */
function checkTags(args) {
  const nkeys = Number(args[2])
  const argv = args.slice(3 + nkeys)
  if (nkeys === 2) return [argv[argv.length - 1]]
  // the compact layout: "0", one shape (its length, its values), the call's tag; the
  // reply starts with the call's tag, and each check's carries its place (1..n) for a tag
  if (argv[0] === '0') {
    const tags = Array.from({ length: nkeys / 2 }, (_, i) => String(i + 1))
    tags.head = argv[argv.length - 1]
    return tags
  }
  let i = 1
  for (let s = 0; s < Number(argv[0]); s++) i += 1 + Number(argv[i])
  const tags = []
  while (i < argv.length) {
    i += 2 // its shape and cost
    if (/^[a-z]/i.test(argv[i])) i += 1 + [...argv[i]].filter((c) => 'nxgo'.includes(c)).length
    tags.push(argv[i])
    i += 1
  }
  return tags
}

function parseCommand(buf) {
  let at = 0
  const line = () => {
    const end = buf.indexOf('\r\n', at)
    if (end < 0) return null
    const s = buf.toString('latin1', at, end)
    at = end + 2
    return s
  }
  const head = line()
  if (head === null) return null
  const n = Number(head.slice(1))
  const args = []
  for (let i = 0; i < n; i++) {
    const h = line()
    if (h === null) return null
    const len = Number(h.slice(1))
    if (buf.length < at + len + 2) return null
    args.push(buf.toString('latin1', at, at + len))
    at += len + 2
  }
  return { args, used: at }
}

const honest = (tag, remaining) => `*8\r\n:1\r\n:${remaining}\r\n:1000\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:${tag}\r\n`

test('a hostile reply fails the checks in flight with a clear error, and no check gets another one\'s decision', async () => {
  let mode = 'honest'
  const fake = await fakeRedis((tags) => {
    if (mode === 'honest') return tags.length === 1 ? honest(tags[0], 6) : `*${tags.length}\r\n` + tags.map((t) => honest(t, 6)).join('')
    if (mode === 'swap') {
      // a batch's replies in the wrong order: each would be another check's decision
      const rotated = tags.slice(1).concat(tags.slice(0, 1))
      return `*${tags.length}\r\n` + rotated.map((t, i) => honest(t, i)).join('')
    }
    if (mode === 'deep') return '*1\r\n'.repeat(100_000)
    return `*8\r\n:1\r\n:6\r\n:1000\r\n:-1\r\n:0\r\n:0\r\n:1\r\n:${Number(tags[0]) + 1}\r\n`
  })
  const limiter = Limiter.fromJson(
    { timeout_ms: 1000, on_error: 'error', shards: [{ name: 'fake', url: fake.url }], policies: POLICIES },
    { transport: 'host' }
  )
  try {
    const d = await limiter.check('k', 'fw')
    assert.equal(d.source, 'redis')
    assert.equal(d.remaining, 6)
    const batch = await Promise.all(['a', 'b', 'c'].map((k) => limiter.check(k, 'fw')))
    assert.deepEqual(batch.map((d) => d.remaining), [6, 6, 6])
    for (const [m, says] of [
      ['swap', /another call's tag/],
      ['other-tag', /another call's tag/],
      ['deep', /nested deeper/],
    ]) {
      mode = m
      const t0 = Date.now()
      const n = m === 'swap' ? 3 : 1
      const results = await Promise.allSettled(Array.from({ length: n }, (_, i) => limiter.check(`${m}-${i}`, 'fw')))
      for (const r of results) {
        assert.equal(r.status, 'rejected', `${m}: a decision came through: ${JSON.stringify(r.value)}`)
        assert.ok(r.reason instanceof ConnectionError, `${m}: ${r.reason}`)
        assert.match(r.reason.message, says)
      }
      assert.ok(Date.now() - t0 < 1000, `${m}: failed at once, not at the deadline`)
      // the connection is made again; an honest server decides again
      mode = 'honest'
      const until = Date.now() + 5000
      for (;;) {
        const r = await limiter.check('k', 'fw').then((d) => d, (e) => e)
        if (!(r instanceof Error)) {
          assert.equal(r.remaining, 6)
          break
        }
        assert.ok(Date.now() < until, `${m}: never reconnected: ${r}`)
        await new Promise((res) => setTimeout(res, 20))
      }
    }
  } finally {
    limiter.close()
    await fake.close()
  }
})

test('an endless reply fails its check at the reply bound (1 MiB), not at the deadline, and is dropped', async () => {
  // a line that never ends; an array announced within the bound that grows past it
  for (const [head, unit] of [['+', 'x'], ['*200000\r\n', ':1111111\r\n']]) {
    let sent = 0
    let closed
    const dropped = new Promise((resolve) => {
      closed = resolve
    })
    const server = net.createServer((s) => {
      s.on('error', () => {})
      s.on('close', () => closed(sent))
      s.once('data', () => {
        const chunk = Buffer.from(unit.repeat(Math.floor(65536 / unit.length)))
        s.write(head)
        const pump = () => {
          // at most 1 GiB: the client drops it long before, or the test fails
          while (sent < 2 ** 30 && !s.destroyed) {
            sent += chunk.length
            if (!s.write(chunk)) return s.once('drain', pump)
          }
        }
        pump()
      })
    })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    const limiter = Limiter.fromJson(
      {
        timeout_ms: 5000,
        on_error: 'error',
        shards: [{ name: 'fake', url: `redis://127.0.0.1:${server.address().port}` }],
        policies: POLICIES,
      },
      { transport: 'host' }
    )
    try {
      const t0 = Date.now()
      const r = await limiter.check('k', 'fw').then(
        (d) => d,
        (e) => e
      )
      assert.ok(r instanceof ConnectionError, `${JSON.stringify(head)}: ${r}`)
      assert.match(r.message, /longer than|over the bound/)
      assert.ok(Date.now() - t0 < 4000, 'failed at the bound, not the deadline')
      const total = await dropped
      assert.ok(total < 32 * 2 ** 20, `the server wrote ${total >> 20} MiB before the drop`)
    } finally {
      limiter.close()
      await new Promise((resolve) => server.close(resolve))
    }
  }
})

/** A native half that only counts the writes: the machine's own batching is tested in sansio.rs. */
async function countingHost() {
  const { HostTransport } = require('../host.js')
  const server = net.createServer((s) => s.on('data', () => {}))
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  const counts = { transmits: 0 }
  let connected
  const up = new Promise((resolve) => {
    connected = resolve
  })
  const fake = {
    shardCount: 1,
    address: () => ({ host: '127.0.0.1', port: server.address().port }),
    connecting: () => {},
    connected: () => connected(),
    check: () => new Promise(() => {}),
    transmit: () => {
      counts.transmits++
      return null
    },
    nextDeadlineMs: () => null,
    onClosed: () => {},
  }
  const host = new HostTransport(fake)
  // the write that follows the connect (the log-in) is not one of the tests'
  await up
  counts.transmits = 0
  const close = () => {
    host.close()
    server.close()
  }
  return { host, counts, close }
}

const nextTurn = () => new Promise((resolve) => setImmediate(resolve))

test('a burst is written every 16 checks, and the rest once this turn of the event loop is done (several batches in flight)', async () => {
  const { host, counts, close } = await countingHost()
  try {
    for (let i = 0; i < 40; i++) host.check(`k${i}`, 'fw', 1)
    assert.equal(counts.transmits, 2, 'written at the 16th and the 32nd check, before the turn ends')
    await Promise.resolve()
    assert.equal(counts.transmits, 2, 'the microtask queue drained: the last 8 still wait for the turn to end')
    await nextTurn()
    assert.equal(counts.transmits, 3, 'the last 8 once the turn ended')
  } finally {
    close()
  }
})

test('checks made by separate callbacks of one turn (one per HTTP request) share one write', async () => {
  const { host, counts, close } = await countingHost()
  try {
    // what an HTTP server does: one check per request, each in its own callback, with the
    // microtask queue drained in between
    await new Promise((resolve) => {
      let left = 5
      for (let r = 0; r < 5; r++) {
        setImmediate(() => {
          host.check(`req${r}`, 'fw', 1)
          queueMicrotask(() => {
            if (--left === 0) resolve()
          })
        })
      }
    })
    assert.equal(counts.transmits, 0, 'not one write per request')
    await nextTurn()
    assert.equal(counts.transmits, 1, 'the five requests in one write')
  } finally {
    close()
  }
})

test("'host' and 'default' move checks to this event loop, 'thread' keeps them on the I/O thread; limiter.transport says which", () => {
  const config = redis.config({ fw: { algorithm: 'fixed_window', limit: 3, window: '1m' } })
  for (const [transport, carried] of [[undefined, 'host'], ['default', 'host'], ['thread', 'thread'], ['host', 'host']]) {
    const l = Limiter.fromJson(config, { transport })
    assert.equal(l.transport, carried, String(transport))
    l.close()
  }
  // shards the host transport cannot serve: the default is the I/O thread, no error
  const tls = Limiter.fromJson({ shards: [{ name: 't', url: 'rediss://127.0.0.1:1' }], policies: {} })
  assert.equal(tls.transport, 'thread')
  tls.close()
  assert.equal(Limiter.fromJson({ policies: {} }).transport, 'thread')
  assert.equal(Limiter.memory().transport, 'thread')
  assert.throws(() => Limiter.fromJson(config, { transport: 'event loop' }), /'default', 'thread' or 'host'/)
})

test('a timer late on a busy event loop does not fail checks whose replies wait in the socket', async () => {
  // the deadline (50 ms, the default) is the shard's silence: the loop is blocked for
  // 300 ms right after the checks are written, Redis answers meanwhile; the timer is due
  // when the loop wakes, and the replies in the socket are read before it is looked at
  const limiter = Limiter.fromJson(redis.config(POLICIES, { timeout_ms: 50, key_prefix: 'busy:' }), { transport: 'host' })
  try {
    assert.equal((await limiter.check('warm', 'fw')).source, 'redis')
    for (let round = 0; round < 3; round++) {
      // 32 checks: written at once (every 16 go out without waiting for the turn's end)
      const ps = Array.from({ length: 32 }, (_, i) => limiter.check(`busy-${round}-${i}`, 'fw'))
      const until = Date.now() + 300
      while (Date.now() < until) {
        // a busy loop: this process is slow, Redis is not
      }
      const ds = await Promise.all(ps)
      assert.deepEqual(
        ds.map((d) => d.source),
        ds.map(() => 'redis'),
        `round ${round}: ${ds.filter((d) => d.source !== 'redis').length} of 32 fell back`
      )
    }
  } finally {
    limiter.close()
  }
})

test('a check that meets NOSCRIPT (SCRIPT FLUSH) goes again as EVAL from the read that saw it, and Redis decides', { timeout: 10_000 }, async () => {
  // on_error 'error': a check that waited for its deadline instead would reject
  const limiter = Limiter.fromJson(redis.config(POLICIES, { timeout_ms: 2000, on_error: 'error', key_prefix: 'noscript:' }), { transport: 'host' })
  try {
    assert.equal((await limiter.check('k', 'fw')).remaining, 6)
    for (let round = 0; round < 2; round++) {
      await redis.command('SCRIPT', 'FLUSH')
      const t0 = Date.now()
      const ds = await Promise.all([limiter.check('k', 'fw'), limiter.check('j', 'sw')])
      assert.deepEqual(ds.map((d) => [d.source, d.remaining]), [['redis', 5 - round], ['redis', 3 - round]])
      assert.ok(Date.now() - t0 < 1000, `answered after NOSCRIPT without waiting for the deadline (${Date.now() - t0} ms)`)
    }
  } finally {
    limiter.close()
  }
})
