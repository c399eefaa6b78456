'use strict'
// The production surface of the core through Node: layered checks, the block list,
// client_ip behind trusted proxies (also in the middleware), scaling and metrics.

const test = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const express = require('express')
const sl = require('..')
const { Limiter, ManualClock, clientIp, TrustedProxies, expressMiddleware } = sl
const { startRedis } = require('./support/redis.js')

const T0 = 1_800_000_000_000_000
let redis
test.before(async () => {
  redis = await startRedis()
})
test.after(() => redis.stop())

const policies = {
  ip: { algorithm: 'fixed_window', limit: 3, window: '1m' },
  tenant: { algorithm: 'fixed_window', limit: 100, window: '1m' },
}

for (const engine of ['memory', 'redis']) {
  const make = () => {
    const clock = new ManualClock(T0)
    const cfg = engine === 'redis' ? redis.config(policies) : { policies }
    return Limiter.fromJson(cfg, { clock })
  }

  test(`${engine}: checkAll admits only when every layer does, and a denial consumes nothing`, async () => {
    const limiter = make()
    const layers = [
      { key: 'ip:1', policy: 'ip' },
      { key: 'tenant:a', policy: 'tenant', cost: 1 },
    ]
    for (let i = 0; i < 3; i++) assert.equal((await limiter.checkAll(layers)).allowed, true)
    const denied = await limiter.checkAll(layers)
    assert.equal(denied.allowed, false)
    assert.equal(denied.policy, 'ip')
    assert.equal(denied.layer, 0)
    // the tenant layer was not charged for the denied request
    assert.equal((await limiter.peek('tenant:a', 'tenant')).remaining, 97)
    await assert.rejects(limiter.checkAll([]), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
    await assert.rejects(limiter.checkAll([{ key: 'k', policy: 'nope' }]), { code: 'ERR_SHARDLIMIT_UNKNOWN_POLICY' })
    await assert.rejects(limiter.checkAll('ip'), TypeError)
    await assert.rejects(limiter.checkAll([{ key: 1, policy: 'ip' }]), TypeError)
  })

  test(`${engine}: block, blocked, unblock`, async () => {
    const limiter = make()
    assert.equal(await limiter.blocked('ip:6.6.6.6'), null)
    await limiter.block('ip:6.6.6.6', { ttl: 60_000, reason: 'abuse' })
    const info = await limiter.blocked('ip:6.6.6.6')
    assert.equal(info.reason, 'abuse')
    assert.ok(info.remaining > 0 && info.remaining <= 60_000, String(info.remaining))
    const d = await limiter.check('ip:6.6.6.6', 'ip')
    assert.equal(d.allowed, false)
    assert.equal(d.source, 'block')
    assert.equal(await limiter.unblock('ip:6.6.6.6'), true)
    assert.equal(await limiter.unblock('ip:6.6.6.6'), false)
    assert.equal((await limiter.check('ip:6.6.6.6', 'ip')).allowed, true)
    await limiter.block('forever')
    assert.deepEqual(await limiter.blocked('forever'), { reason: '', remaining: null })
    await assert.rejects(limiter.block('k', { ttl: '1m' }), TypeError)
    await assert.rejects(limiter.block('k', { ttl: 0 }), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  })
}

test('ipKey: IPv4 as itself, IPv6 by its network, in every form the core takes', () => {
  for (const [ip, prefix, want] of [
    ['2001:db8:1:2::1', undefined, '2001:db8:1:2::/64'],
    ['[2001:0db8:0001:0002:ffff::9]:443', 64, '2001:db8:1:2::/64'],
    ['2001:db8:1:2::abcd%eth0', 64, '2001:db8:1:2::/64'],
    ['2001:db8:1:2ff::1', 56, '2001:db8:1:200::/56'],
    ['2001:db8::1', 128, '2001:db8::1'],
    ['::ffff:203.0.113.9', 64, '203.0.113.9'],
    ['203.0.113.9:80', 64, '203.0.113.9'],
  ]) {
    assert.equal(sl.ipKey(ip, prefix), want, ip)
  }
  assert.equal(new TrustedProxies(['10.0.0.0/8']).clientKey('10.0.0.5', '2001:db9::5:6'), '2001:db9::/64')
  assert.equal(new TrustedProxies([], 48).clientKey('[2001:db9:7:8::1]:1'), '2001:db9:7::/48')
  for (const bad of [0, 129, 300]) {
    assert.throws(() => sl.ipKey('::1', bad), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT', message: /ipv6_prefix/ })
    assert.throws(() => new TrustedProxies([], bad), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  }
  assert.throws(() => sl.ipKey('nope'), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT', message: /peer_addr/ })
  assert.throws(() => sl.ipKey('::1', 1.5), TypeError)
  assert.throws(() => expressMiddleware(Limiter.memory(), { policy: 'ip', ipv6Prefix: 0 }), {
    code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT',
  })
})

test('the middleware keys IPv6 clients by their /64 (or the prefix it is given)', async () => {
  const limiter = Limiter.fromJson({ policies: { ip: policies.ip } }, { clock: new ManualClock(T0) })
  const serve = async (options) => {
    const mw = expressMiddleware(limiter, { policy: 'ip', trustedProxies: ['127.0.0.1'], ...options })
    const server = http.createServer((req, res) => mw(req, res, () => res.end('ok')))
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    return server
  }
  const statuses = async (server, clients) => {
    const out = []
    for (const c of clients) {
      const r = await fetch(`http://127.0.0.1:${server.address().port}/`, { headers: { 'x-forwarded-for': c } })
      await r.text()
      out.push(r.status)
    }
    return out
  }
  const s64 = await serve({})
  try {
    // one client rotating through its /64: limit 3, then denied; the next /64 is another client
    const got = await statuses(s64, ['2001:db8:1:2::1', '2001:db8:1:2::2', '2001:db8:1:2::3', '2001:db8:1:2:ffff::4', '2001:db8:1:3::1'])
    assert.deepEqual(got, [200, 200, 200, 429, 200])
  } finally {
    await new Promise((resolve) => s64.close(resolve))
  }
  const s56 = await serve({ ipv6Prefix: 56 })
  try {
    const got = await statuses(s56, ['2001:db8:5:10::1', '2001:db8:5:20::1', '2001:db8:5:30::1', '2001:db8:5:ff::1'])
    assert.deepEqual(got, [200, 200, 200, 429])
  } finally {
    await new Promise((resolve) => s56.close(resolve))
  }
})

test('clientIp follows the core: X-Forwarded-For only from trusted proxies', () => {
  const proxies = ['10.0.0.0/8']
  assert.equal(clientIp('203.0.113.9:4431', '1.1.1.1', proxies), '203.0.113.9')
  assert.equal(clientIp('10.0.0.5:80', '6.6.6.6, 198.51.100.7', proxies), '198.51.100.7')
  assert.equal(new TrustedProxies(proxies).clientIp('::ffff:10.1.2.3', '203.0.113.1'), '203.0.113.1')
  assert.throws(() => clientIp('nope'), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  assert.throws(() => new TrustedProxies(['10.0.0.0/33']), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  assert.throws(() => clientIp(1), TypeError)
})

test('middleware: the default key is the client IP behind trusted proxies', async (t) => {
  const limiter = Limiter.fromJson(redis.config(policies), { clock: new ManualClock(T0) })
  const app = express()
  app.use(expressMiddleware(limiter, { policy: 'ip', trustedProxies: ['127.0.0.1'] }))
  app.get('/', (req, res) => res.send('ok'))
  const server = http.createServer(app)
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  t.after(() => new Promise((r) => server.close(r)))
  const url = `http://127.0.0.1:${server.address().port}/`
  for (let i = 0; i < 3; i++) {
    assert.equal((await fetch(url, { headers: { 'x-forwarded-for': '198.51.100.7' } })).status, 200)
  }
  assert.equal((await fetch(url, { headers: { 'x-forwarded-for': '198.51.100.7' } })).status, 429)
  // another client behind the same proxy has its own budget
  assert.equal((await fetch(url, { headers: { 'x-forwarded-for': '198.51.100.8' } })).status, 200)
  assert.equal((await limiter.peek('198.51.100.7', 'ip')).remaining, 0)
})

test('scale and metrics', async () => {
  const limiter = Limiter.fromJson({ policies })
  assert.equal(limiter.scale, 1)
  limiter.setScale(0.5, ['tenant'])
  assert.equal((await limiter.check('t', 'tenant')).limit, 50)
  assert.throws(() => limiter.setScale(0), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  assert.throws(() => limiter.observeHealth(5), { code: 'ERR_SHARDLIMIT_INVALID_ARGUMENT' })
  limiter.setLatencyScale(100, 0.25)
  assert.equal(limiter.observeHealth(50), 1)
  assert.equal(limiter.observeHealth(200), 0.5)
  assert.equal(limiter.observeHealth(10_000), 0.25)
  assert.match(limiter.metrics(), /tenant/)
})

test('reload: new policies apply, a bad config is rejected and the old one stays', async () => {
  const limiter = Limiter.fromJson({ policies })
  const report = limiter.reload({ policies: { ...policies, extra: { algorithm: 'sliding_log', limit: 1, window: '1s' } } })
  assert.deepEqual(report.policiesAdded, ['extra'])
  assert.equal(report.engineChanged, false)
  assert.equal((await limiter.check('k', 'extra')).allowed, true)
  assert.throws(() => limiter.reload('{"policies":{"x":{"algorithm":"magic"}}}'), { code: 'ERR_SHARDLIMIT_CONFIG' })
  assert.equal((await limiter.check('k2', 'extra')).allowed, true)
  assert.throws(() => limiter.reloadFromFile('/nonexistent.json'), { code: 'ERR_SHARDLIMIT_IO' })
  assert.throws(() => limiter.reload(5), TypeError)
})
