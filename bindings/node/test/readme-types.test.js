'use strict'
// The TypeScript block of README.md ("TypeScript"), read from the file and type-checked as
// written with tsc against this package's index.d.ts (strict, as types-test is), with the
// `express` import its prose assumes. A block the types reject fails here.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const { execFileSync } = require('node:child_process')

test("README.md's TypeScript block type-checks", (t) => {
  const here = path.join(__dirname, '..')
  const text = fs.readFileSync(path.join(here, 'README.md'), 'utf8')
  const at = text.indexOf('### TypeScript')
  assert.ok(at >= 0, 'README.md has a TypeScript section')
  const m = text.slice(at).match(/```ts\n([\s\S]*?)```/)
  assert.ok(m, 'a ts block in the TypeScript section')
  // inside the package, so that 'shardlimit' resolves to it through its own "exports"
  const dir = fs.mkdtempSync(path.join(here, '.readme-types-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  fs.writeFileSync(path.join(dir, 'readme.mts'), `import express from 'express'\n${m[1]}\nexport {}\n`)
  fs.writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext',
      target: 'es2022', types: ['node'], skipLibCheck: true,
    },
    files: ['readme.mts'],
  }))
  const tsc = path.join(here, 'node_modules', '.bin', 'tsc')
  try {
    execFileSync(tsc, ['-p', dir], { encoding: 'utf8', stdio: 'pipe' })
  } catch (e) {
    assert.fail(`README.md's TypeScript block does not type-check:\n${e.stdout}${e.stderr}`)
  }
})
