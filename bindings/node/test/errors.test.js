'use strict'
// The error classes against spec/errors.json (generated from the core's ErrorKind): one
// class per kind with its code and name, the parent as the superclass (an unknown policy
// is an invalid argument), `isBackend` as the table says, and no class for a retired code.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const sl = require('..')

const spec = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'spec', 'errors.json'), 'utf8'))
const className = (name) => name.replace(/(^|_)(\w)/g, (_, __, c) => c.toUpperCase()) + 'Error'

test('every kind of spec/errors.json has its class, code, parent and backend flag', () => {
  assert.ok(spec.kinds.length >= 9)
  for (const k of spec.kinds) {
    const cls = sl.ERROR_CLASSES[k.name]
    assert.ok(cls, `no class for ${k.name}`)
    assert.equal(cls.name, className(k.name))
    assert.equal(sl[cls.name], cls, `${cls.name} is exported`)
    const code = `ERR_SHARDLIMIT_${k.name.toUpperCase()}`
    assert.equal(sl.ERROR_CODES[code], cls)
    const parent = k.parent === null ? sl.ShardlimitError : sl.ERROR_CLASSES[k.parent]
    assert.equal(Object.getPrototypeOf(cls), parent, `${cls.name} extends ${parent.name}`)
    const e = new cls('m', k.name)
    assert.ok(e instanceof sl.ShardlimitError && e instanceof Error)
    assert.equal(e.code, code)
    assert.equal(e.kind, k.name)
    assert.equal(e.name, cls.name)
    assert.equal(e.isBackend, k.backend, `${k.name}.isBackend`)
  }
  assert.deepEqual(Object.keys(sl.ERROR_CLASSES).sort(), spec.kinds.map((k) => k.name).sort(), 'kinds the spec does not have')
})

test('the addon reports the same kinds and numbers as the spec', () => {
  assert.deepEqual(
    sl.errorKinds().map((k) => [k.name, k.number, k.code]),
    spec.kinds.map((k) => [k.name, k.code, `ERR_SHARDLIMIT_${k.name.toUpperCase()}`])
  )
})

test('retired codes have no class and no export', () => {
  assert.ok(spec.retired.length >= 1)
  for (const r of spec.retired) {
    assert.equal(sl.ERROR_CLASSES[r.name], undefined)
    assert.equal(sl[className(r.name)], undefined, `${className(r.name)} is retired`)
    assert.equal(sl.ERROR_CODES[`ERR_SHARDLIMIT_${r.name.toUpperCase()}`], undefined)
  }
})

test('an unknown policy rejects as an InvalidArgumentError', async () => {
  const limiter = sl.Limiter.memory()
  await assert.rejects(limiter.check('k', 'nope'), (e) => e instanceof sl.UnknownPolicyError && e instanceof sl.InvalidArgumentError)
  assert.throws(() => limiter.policy('nope'), sl.InvalidArgumentError)
})

test('a 50 MB config value makes a short error message, naming the field', () => {
  const big = 'x'.repeat(50e6)
  const configs = [
    [{ policies: { a: { algorithm: big, limit: 1, window: '1m' } } }, 'policies.a.algorithm'],
    [{ policies: { a: { algorithm: 'fixed_window', limit: 1, window: big } } }, 'policies.a.window'],
    [{ policies: { a: big } }, 'policies.a'],
    [{ policies: { [big]: '5/minute' } }, 'policies.'],
    [{ policies: { a: { algorithm: 'fixed_window', limit: 1, window: '1m', on_error: big } } }, 'policies.a.on_error'],
  ]
  for (const [cfg, field] of configs) {
    assert.throws(
      () => sl.Limiter.fromJson(cfg),
      (e) => e.code === 'ERR_SHARDLIMIT_CONFIG' && e.message.length < 2048 && e.message.startsWith(field) && /bytes elided/.test(e.message),
      field
    )
  }
})
