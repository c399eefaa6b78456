'use strict'
// Every public name in index.d.ts carries a doc comment (IDE hovers): each exported
// declaration, and each member of an exported class or interface.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

test('every public name in index.d.ts has a doc comment', () => {
  const lines = fs.readFileSync(path.join(__dirname, '..', 'index.d.ts'), 'utf8').split('\n')
  const missing = []
  let depth = 0
  let names = 0
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]
    const top = depth === 0 && /^export (declare )?(class|function|const|interface|type) (\w+)/.exec(line)
    // a member: two-space indent inside an exported block, a name then ( : ? or a getter
    const member = depth === 1 && /^ {2}(?:static |readonly |get )?(\w+)\??[(:<]/.exec(line)
    const name = top ? top[3] : member ? member[1] : null
    if (name && !(member && /^ {2}private constructor/.test(line))) {
      names++
      let j = i - 1
      while (j >= 0 && lines[j].trim() === '') j--
      if (!lines[j].trim().endsWith('*/')) missing.push(`${i + 1}: ${line.trim()}`)
    }
    // a multi-line generic signature or object type counts as one level
    for (const ch of line.replace(/\/\*.*?\*\/|\/\/.*$/g, '')) {
      if (ch === '{') depth++
      else if (ch === '}') depth--
    }
  }
  assert.ok(names > 150, `found ${names} names`)
  assert.deepEqual(missing, [], 'names without a doc comment')
})
