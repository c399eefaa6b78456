'use strict'
// ESM and CJS export the same names, and every value index.d.ts documents is exported both
// ways (`import { clientIp } from 'shardlimit'` once type-checked and then failed at run time).

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const dts = fs.readFileSync(path.join(__dirname, '..', 'index.d.ts'), 'utf8')
const documented = [...dts.matchAll(/^export declare (?:class|function|const) (\w+)/gm)].map((m) => m[1])

test('every documented value is exported by require() and by import, the same object', async () => {
  assert.ok(documented.length >= 20, documented.join(' '))
  const cjs = require('shardlimit')
  const esm = await import('shardlimit')
  for (const name of documented) {
    assert.notEqual(cjs[name], undefined, `require('shardlimit').${name}`)
    assert.notEqual(esm[name], undefined, `import { ${name} } from 'shardlimit'`)
    assert.equal(esm[name], cjs[name], name)
  }
  assert.equal(esm.default, cjs)
})

test('ESM and CJS export the same names, and only documented ones', async () => {
  const cjs = require('shardlimit')
  const esm = await import('shardlimit')
  const esmNames = Object.keys(esm).filter((n) => n !== 'default').sort()
  assert.deepEqual(esmNames, Object.keys(cjs).sort())
  assert.deepEqual(esmNames, [...documented].sort())
})

test('the http types entry resolves both ways', async () => {
  assert.deepEqual(require('shardlimit/http'), {})
  assert.ok(await import('shardlimit/http'))
})
