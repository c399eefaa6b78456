'use strict'
// What the published npm packages carry (scripts/npm-packages.js, run as `make dist` runs
// it, on a stand-in addon file): a package.json without the checkout's scripts and
// devDependencies, optionalDependencies only on platform packages that were built, a README
// whose links work on the registry page. And the error of a missing addon in node_modules.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')

const root = path.join(__dirname, '..', '..', '..')

function packs(t, env = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-npm-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const addon = path.join(dir, 'addon.node')
  fs.writeFileSync(addon, 'not a real addon')
  const out = execFileSync(process.execPath, [path.join(root, 'scripts', 'npm-packages.js'), addon, path.join(dir, 'stage'), path.join(dir, 'out')], {
    encoding: 'utf8',
    env: { ...process.env, ...env },
  })
  return { dir, out }
}

test('the published package.json: no dev scripts, no devDependencies, only built platform packages', (t) => {
  const { dir } = packs(t)
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'stage', 'shardlimit', 'package.json'), 'utf8'))
  assert.equal(pkg.scripts, undefined)
  assert.equal(pkg.devDependencies, undefined)
  assert.deepEqual(pkg.optionalDependencies, { '@shardlimit/binding-linux-x64-gnu': pkg.version })
  assert.ok(fs.existsSync(path.join(dir, 'out', `shardlimit-${pkg.version}.tgz`)))
  assert.ok(fs.existsSync(path.join(dir, 'out', `shardlimit-binding-linux-x64-gnu-${pkg.version}.tgz`)))

  const readme = fs.readFileSync(path.join(dir, 'stage', 'shardlimit', 'README.md'), 'utf8')
  const links = [...readme.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1])
  assert.ok(links.length > 0)
  for (const l of links) assert.match(l, /^(https?:|mailto:|#)/, `a relative link on the registry page: ${l}`)
  assert.ok(links.includes(`https://github.com/shardlimit/shardlimit/blob/v${pkg.version}/docs/DESIGN.md#the-transport`), links.join('\n'))
})

test('a release that built more platforms names them (NPM_PLATFORM_TAGS), and only known ones', (t) => {
  const { dir } = packs(t, { NPM_PLATFORM_TAGS: 'darwin-arm64, linux-arm64-gnu' })
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'stage', 'shardlimit', 'package.json'), 'utf8'))
  assert.deepEqual(Object.keys(pkg.optionalDependencies).sort(), [
    '@shardlimit/binding-darwin-arm64',
    '@shardlimit/binding-linux-arm64-gnu',
    '@shardlimit/binding-linux-x64-gnu',
  ])
  assert.throws(() => packs(t, { NPM_PLATFORM_TAGS: 'plan9-mips' }), /plan9-mips is not one of/)
})

test('make dist-all packs each platform package alone, then the main package naming exactly those', (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-npm-all-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const script = path.join(root, 'scripts', 'npm-packages.js')
  const addon = path.join(dir, 'addon.node')
  fs.writeFileSync(addon, 'not a real addon')
  const run = (...args) => execFileSync(process.execPath, [script, ...args], { encoding: 'utf8', stdio: 'pipe' }).trim()
  const name = run('platform', 'aarch64-unknown-linux-musl', addon, path.join(dir, 'stage-arm64-musl'), path.join(dir, 'out'))
  const plat = JSON.parse(fs.readFileSync(path.join(dir, 'stage-arm64-musl', 'package.json'), 'utf8'))
  assert.equal(plat.name, '@shardlimit/binding-linux-arm64-musl')
  assert.deepEqual([plat.os, plat.cpu, plat.libc], [['linux'], ['arm64'], ['musl']])
  assert.equal(plat.main, 'shardlimit.linux-arm64-musl.node')
  assert.equal(name, `shardlimit-binding-linux-arm64-musl-${plat.version}.tgz`)
  const mac = run('platform', 'aarch64-apple-darwin', addon, path.join(dir, 'stage-darwin'), path.join(dir, 'out'))
  const darwin = JSON.parse(fs.readFileSync(path.join(dir, 'stage-darwin', 'package.json'), 'utf8'))
  assert.deepEqual([darwin.os, darwin.cpu, darwin.libc], [['darwin'], ['arm64'], undefined])
  assert.ok(fs.existsSync(path.join(dir, 'out', mac)))
  run('main', path.join(dir, 'stage'), path.join(dir, 'out'), 'linux-arm64-musl', 'darwin-arm64')
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'stage', 'shardlimit', 'package.json'), 'utf8'))
  assert.deepEqual(pkg.optionalDependencies, {
    '@shardlimit/binding-linux-arm64-musl': pkg.version,
    '@shardlimit/binding-darwin-arm64': pkg.version,
  })
  assert.throws(() => run('platform', 'mips-unknown-linux-gnu', addon, path.join(dir, 's'), path.join(dir, 'out')), /not one of/)
})

test('a missing addon in node_modules does not advise `npm run build`', (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'shardlimit-missing-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const pkg = path.join(dir, 'node_modules', 'shardlimit')
  fs.mkdirSync(pkg, { recursive: true })
  fs.copyFileSync(path.join(__dirname, '..', 'binding.js'), path.join(pkg, 'binding.js'))
  const env = { ...process.env }
  delete env.SHARDLIMIT_NATIVE_LIBRARY
  let message = ''
  try {
    execFileSync(process.execPath, ['-e', `require(${JSON.stringify(path.join(pkg, 'binding.js'))})`], { cwd: dir, env, stdio: 'pipe', encoding: 'utf8' })
  } catch (e) {
    message = e.stderr
  }
  assert.match(message, /ERR_SHARDLIMIT_NATIVE_MISSING|no native addon/)
  assert.doesNotMatch(message, /npm run build/)
  assert.match(message, /Install @shardlimit\/binding-/)
})
