'use strict'
// Decisions over TLS (rediss://) against a real redis-server --tls-port that requires a
// client certificate, with a CA generated for this file by tests/tls/gen-certs.sh: verified
// mTLS works; a wrong CA or a missing client certificate is err.kind 'connection' (code
// ERR_SHARDLIMIT_CONNECTION), and the policy's on_error answers.

const test = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { Limiter } = require('..')
const { startRedis, freePort } = require('./support/redis.js')

const certs = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-node-tls-'))
const cert = (name) => path.join(certs, name)
let redis
let tlsPort
test.before(async () => {
  execFileSync('sh', [path.join(__dirname, '..', '..', '..', 'tests', 'tls', 'gen-certs.sh'), certs])
  tlsPort = await freePort()
  redis = await startRedis([
    '--tls-port', String(tlsPort),
    '--tls-cert-file', cert('server.crt'),
    '--tls-key-file', cert('server.key'),
    '--tls-ca-cert-file', cert('ca.crt'),
    '--tls-auth-clients', 'yes',
  ])
})
test.after(async () => {
  await redis.stop()
  fs.rmSync(certs, { recursive: true, force: true })
})

const policies = {
  strict: { algorithm: 'fixed_window', limit: 5, window: '1h', on_error: 'error' },
  closed: { algorithm: 'fixed_window', limit: 5, window: '1h', on_error: 'closed' },
}
const limiter = (tls) =>
  Limiter.fromJson({ timeout_ms: 2000, shards: [{ name: 's0', url: `rediss://127.0.0.1:${tlsPort}`, tls }], policies })

test('verified mTLS: the decision is made on Redis', async () => {
  const l = limiter({ ca_file: cert('ca.crt'), cert_file: cert('client.crt'), key_file: cert('client.key') })
  const d = await l.check('tls-user', 'strict')
  assert.equal(d.allowed, true)
  assert.equal(d.source, 'redis')
  assert.equal(d.remaining, 4)
  // the state is in that server (read over its plain port)
  assert.equal(await redis.command('DBSIZE'), ':1')
})

for (const [what, tls] of [
  ['a wrong CA', () => ({ ca_file: cert('other-ca.crt') })],
  ['a missing client certificate', () => ({ ca_file: cert('ca.crt') })],
]) {
  test(`${what} is a connection error, and on_error decides`, async () => {
    const l = limiter(tls())
    await assert.rejects(l.check('k', 'strict'), (e) => {
      assert.equal(e.kind, 'connection', String(e))
      assert.equal(e.code, 'ERR_SHARDLIMIT_CONNECTION')
      assert.match(e.message, /shard `s0`/)
      return true
    })
    const d = await l.check('k', 'closed')
    assert.equal(d.allowed, false)
    assert.equal(d.source, 'fallback')
  })
}
