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

test("spec/names.json: Node's names for loading a file, metrics and an event's kind", async () => {
  const names = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', '..', 'spec', 'names.json'), 'utf8'))
  const member = (dotted) => {
    const [cls, name] = dotted.split('.')
    assert.equal(cls, 'Limiter', dotted)
    return name
  }
  for (const thing of ['load_from_file', 'metrics_text', 'metrics_snapshot']) {
    const all = [names[thing].node, ...((names[thing].aliases || {}).node || [])]
    for (const n of all) assert.ok(has(member(n)), `${thing}: Limiter has no ${n}`)
  }
  const file = path.join(fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'names-')), 'c.json')
  fs.writeFileSync(file, JSON.stringify({ policies: { api: '1/minute' } }))
  const l = Limiter[member(names.load_from_file.node)](file)
  assert.deepEqual(Limiter[member(names.load_from_file.aliases.node[0])](file).policies, l.policies)
  // metrics(): the Prometheus text; the snapshot: an object
  assert.equal(typeof l[member(names.metrics_text.node)](), 'string')
  assert.match(l.metrics(), /^# (HELP|TYPE) shardlimit_/m)
  assert.equal(typeof l[member(names.metrics_snapshot.node)]().policies, 'object')
  // an event carries its kind under the one name
  assert.equal(names.event_kind_field.node, 'event.kind')
  const seen = []
  l.subscribe((e) => seen.push(e))
  await l.check('k', 'api')
  await l.check('k', 'api')
  for (let i = 0; i < 100 && !seen.some((e) => e.kind === 'denied'); i++) await new Promise((r) => setTimeout(r, 10))
  assert.ok(seen.some((e) => e.kind === 'denied'), JSON.stringify(seen))
  for (const e of seen) {
    assert.equal(e.event, undefined)
    assert.ok(names.event_kinds.includes(e.kind), e.kind)
  }
  l.close()
})
