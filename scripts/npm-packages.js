#!/usr/bin/env node
'use strict'
// Packs the npm packages of a release in napi-rs's layout (scripts/dist.sh):
//   node scripts/npm-packages.js ADDON STAGEDIR OUTDIR
// - shardlimit: bindings/node (JS, .d.ts, README, LICENSE; no binary, no install script),
//   its package.json without the checkout's scripts and devDependencies, and given
//   optionalDependencies on the platform packages this run packs (as `napi prepublish`
//   does; the source package.json has none: `npm ci` in a checkout would need them in the
//   lock file). Only those: a main package naming a platform package nobody built makes
//   npm ask the registry for it. A release that has built more platforms lists their tags
//   in NPM_PLATFORM_TAGS (comma-separated: linux-arm64-gnu,darwin-arm64,...). The README's
//   relative links become absolute (the registry page has no repository around it);
// - @shardlimit/binding-linux-x64-gnu: ADDON (libshardlimit_node.so of the shared release
//   build) as shardlimit.linux-x64-gnu.node, with os/cpu/libc so npm installs it only there.
// Both are packed with `npm pack`; the tarballs go to OUTDIR.
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const [addon, stage, outdir] = process.argv.slice(2)
if (!outdir) {
  console.error('usage: node scripts/npm-packages.js ADDON STAGEDIR OUTDIR')
  process.exit(2)
}
const root = path.join(__dirname, '..')
const src = path.join(root, 'bindings', 'node')
const main = JSON.parse(fs.readFileSync(path.join(src, 'package.json'), 'utf8'))

// the platform packages a release publishes; this machine builds the first one
const platforms = {
  'x86_64-unknown-linux-gnu': { tag: 'linux-x64-gnu', os: 'linux', cpu: 'x64', libc: 'glibc' },
  'aarch64-unknown-linux-gnu': { tag: 'linux-arm64-gnu', os: 'linux', cpu: 'arm64', libc: 'glibc' },
  'x86_64-unknown-linux-musl': { tag: 'linux-x64-musl', os: 'linux', cpu: 'x64', libc: 'musl' },
  'aarch64-unknown-linux-musl': { tag: 'linux-arm64-musl', os: 'linux', cpu: 'arm64', libc: 'musl' },
  'x86_64-apple-darwin': { tag: 'darwin-x64', os: 'darwin', cpu: 'x64' },
  'aarch64-apple-darwin': { tag: 'darwin-arm64', os: 'darwin', cpu: 'arm64' },
  'x86_64-pc-windows-msvc': { tag: 'win32-x64-msvc', os: 'win32', cpu: 'x64' },
}
const known = new Set(main.napi.targets.map((t) => platforms[t].tag))
const tags = ['linux-x64-gnu'] // packed below
for (const tag of (process.env.NPM_PLATFORM_TAGS || '').split(',').map((s) => s.trim()).filter(Boolean)) {
  if (!known.has(tag)) {
    console.error(`NPM_PLATFORM_TAGS: ${tag} is not one of package.json's napi.targets (${[...known].join(', ')})`)
    process.exit(1)
  }
  if (!tags.includes(tag)) tags.push(tag)
}
const expected = Object.fromEntries(tags.map((tag) => [`${main.napi.packageName}-${tag}`, main.version]))
if (main.optionalDependencies) {
  console.error('bindings/node/package.json: optionalDependencies are added here, at release time')
  process.exit(1)
}
if (main.scripts && (main.scripts.install || main.scripts.preinstall || main.scripts.postinstall)) {
  console.error('bindings/node/package.json: the published package must have no install script')
  process.exit(1)
}

function pack(dir) {
  const out = execFileSync('npm', ['pack', '--json', '--pack-destination', path.resolve(outdir)], {
    cwd: dir,
    encoding: 'utf8',
  })
  return JSON.parse(out)[0]
}

fs.rmSync(stage, { recursive: true, force: true })
fs.mkdirSync(outdir, { recursive: true })

// the main package: the files package.json lists, plus the LICENSE
const mainDir = path.join(stage, 'shardlimit')
fs.mkdirSync(mainDir, { recursive: true })
for (const f of main.files) fs.cpSync(path.join(src, f), path.join(mainDir, f), { recursive: true })
// the repository the README's relative links point into, at the release's tag
const repoUrl = main.repository.url.replace(/^git\+/, '').replace(/\.git$/, '')
const blob = `${repoUrl}/blob/v${main.version}/bindings/node/`
const readmePath = path.join(mainDir, 'README.md')
const readme = fs.readFileSync(readmePath, 'utf8').replace(/\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)/gi, (m, rel) => {
  return `](${new URL(rel, blob).href})`
})
const relative = readme.match(/\]\((?![a-z][a-z0-9+.-]*:|#)[^)]*\)/i)
if (relative) {
  console.error(`the published README keeps a relative link: ${relative[0]}`)
  process.exit(1)
}
fs.writeFileSync(readmePath, readme)
const published = {}
for (const [k, v] of Object.entries(main)) {
  // a checkout's build and test scripts and its devDependencies mean nothing in node_modules
  if (k === 'scripts' || k === 'devDependencies') continue
  published[k] = v
  if (k === 'engines') published.optionalDependencies = expected
}
if (!published.optionalDependencies) published.optionalDependencies = expected
fs.writeFileSync(path.join(mainDir, 'package.json'), JSON.stringify(published, null, 2) + '\n')
fs.copyFileSync(path.join(root, 'LICENSE'), path.join(mainDir, 'LICENSE'))
const packed = pack(mainDir)
if (packed.files.some((f) => f.path.endsWith('.node'))) {
  console.error('the main npm package must not carry a binary')
  process.exit(1)
}

// the linux-x64-gnu platform package
const p = platforms['x86_64-unknown-linux-gnu']
const binary = `${main.napi.binaryName}.${p.tag}.node`
const platDir = path.join(stage, p.tag)
fs.mkdirSync(platDir, { recursive: true })
fs.copyFileSync(addon, path.join(platDir, binary))
const platPkg = {
  name: `${main.napi.packageName}-${p.tag}`,
  version: main.version,
  description: `The ${p.tag} native addon of shardlimit (installed by the shardlimit package)`,
  license: main.license,
  author: main.author,
  homepage: main.homepage,
  repository: main.repository,
  bugs: main.bugs,
  main: binary,
  files: [binary],
  os: [p.os],
  cpu: [p.cpu],
  ...(p.libc ? { libc: [p.libc] } : {}),
  engines: main.engines,
}
fs.writeFileSync(path.join(platDir, 'package.json'), JSON.stringify(platPkg, null, 2) + '\n')
fs.copyFileSync(path.join(root, 'LICENSE'), path.join(platDir, 'LICENSE'))
fs.writeFileSync(
  path.join(platDir, 'README.md'),
  `# ${platPkg.name}\n\nThe ${p.tag} native addon of [shardlimit](${main.homepage}). Install \`shardlimit\`, not this package.\n`
)
const platPacked = pack(platDir)
console.log([packed.filename, platPacked.filename].join('\n'))
