'use strict'
// spec/operations.json lists every public operation of the core's Limiter. Node must offer
// each one not marked `not_in.node`, under its camelCase name, as a static factory or a
// member of Limiter. Where the JS idiom differs, IDIOM says under which name, and that
// name is checked instead.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { Limiter, ManualClock } = require('..')

const spec = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'spec', 'operations.json'), 'utf8'))
const camel = (s) => s.replace(/_(\w)/g, (_, c) => c.toUpperCase())

// core name → where Node has it, when not under the camelCase name
const IDIOM = {
  new: 'fromJson', // `new Limiter()` is reserved for the factories' handles
  from_config_file: 'fromConfig',
  with_clock: null, // the `{ clock }` option of every factory: checked below
  check_shadow: null, // the `{ shadow: true }` option of check: test/shadow.test.js
}

const has = (name) => name in Limiter || name in Limiter.prototype

test('Node offers every operation of spec/operations.json not marked not_in node', () => {
  const missing = []
  let checked = 0
  for (const op of spec.operations) {
    if (op.not_in && op.not_in.node) continue
    checked++
    const name = op.name in IDIOM ? IDIOM[op.name] : camel(op.name)
    if (name === null) continue
    if (!has(name)) missing.push(`${op.name} (as ${name})`)
  }
  assert.deepEqual(missing, [], 'operations Node lacks')
  assert.ok(checked >= 25, `checked ${checked}`)
})

test('with_clock is the clock option of the factories', async () => {
  const clock = new ManualClock(0)
  const l = Limiter.fromJson({ policies: { p: { algorithm: 'fixed_window', limit: 1, window: '10s' } } }, { clock })
  clock.setUs(4_000_000)
  assert.equal((await l.check('k', 'p')).resetAfter, 6_000)
  assert.equal(Limiter.memory({ clock }).memoryKeys, 0)
  assert.ok(Limiter.fromEnv({ clock }))
})

test('operations marked not_in node are absent, each with a reason', () => {
  for (const op of spec.operations) {
    const why = op.not_in && op.not_in.node
    if (!why) continue
    assert.ok(why.length > 5, op.name)
    assert.equal(has(camel(op.name)), false, `${op.name} is marked not_in node but exists`)
  }
})
