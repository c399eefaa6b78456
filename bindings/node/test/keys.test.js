'use strict'
// tests/vectors/keys.json, the one key rule (1..=1024 bytes of UTF-8, no NUL), replayed on
// both engines, for a check, a peek, an acquire and a layered check. A JS string cannot
// hold invalid UTF-8: those cases are checked to be invalid UTF-8 (so no JS string can
// carry them), and the string a lossy decoding gives is not the key the case names.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { TextDecoder } = require('node:util')
const { Limiter, InvalidArgumentError } = require('..')
const { startRedis } = require('./support/redis.js')

const doc = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'tests', 'vectors', 'keys.json'), 'utf8'))
const strict = new TextDecoder('utf-8', { fatal: true })
const policies = {
  w: { algorithm: 'fixed_window', limit: 100, window: '1m' },
  c: { algorithm: 'concurrency', max: 100, lease_ttl: '1m' },
}

function asString(c) {
  try {
    return strict.decode(Buffer.from(c.hex, 'hex'))
  } catch {
    return null
  }
}

async function replay(limiter) {
  let replayed = 0
  for (const c of doc.cases) {
    const key = asString(c)
    if (key === null) {
      assert.equal(c.accepted, false, `${c.name}: invalid UTF-8 must be a rejected case`)
      continue
    }
    const calls = {
      check: () => limiter.check(key, 'w'),
      peek: () => limiter.peek(key, 'w'),
      acquire: () => limiter.acquire(key, 'c'),
      checkAll: () => limiter.checkAll([{ key, policy: 'w' }]),
    }
    for (const [what, call] of Object.entries(calls)) {
      if (c.accepted) {
        await call()
      } else {
        await assert.rejects(call(), (e) => {
          assert.ok(e instanceof InvalidArgumentError, `${c.name} / ${what}: ${e}`)
          assert.match(e.message, /key/, `${c.name} / ${what} names the key`)
          return true
        })
      }
      replayed++
    }
  }
  return replayed
}

test('the key rule on the in-memory engine', async () => {
  assert.ok((await replay(Limiter.fromJson({ policies }))) >= 40)
})

test('the key rule on Redis', async (t) => {
  const redis = await startRedis()
  t.after(() => redis.stop())
  assert.ok((await replay(Limiter.fromJson(redis.config(policies)))) >= 40)
})

test('the invalid UTF-8 cases cannot be JS strings', () => {
  const invalid = doc.cases.filter((c) => asString(c) === null)
  assert.equal(invalid.length, 3)
  for (const c of invalid) assert.equal(c.accepted, false)
})
