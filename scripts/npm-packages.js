#!/usr/bin/env node
'use strict'
// Packs the npm packages of a release in napi-rs's layout (scripts/dist.sh, dist-all.sh):
//   node scripts/npm-packages.js main STAGEDIR OUTDIR TAG...
//     shardlimit: bindings/node (JS, .d.ts, README, LICENSE; no binary, no install script),
//     its package.json without the checkout's scripts and devDependencies, and given
//     optionalDependencies on exactly the platform packages TAG... (linux-x64-gnu,
//     darwin-arm64, ...: the ones this release packed, as `napi prepublish` does; the source
//     package.json has none: `npm ci` in a checkout would need them in the lock file). A
//     main package naming a platform package nobody built makes npm ask the registry for
//     it. The README's relative links become absolute (the registry page has no repository
//     around it);
//   node scripts/npm-packages.js platform TRIPLE ADDON STAGEDIR OUTDIR
//     @shardlimit/binding-<tag>: ADDON (the Node addon of TRIPLE's release build) as
//     shardlimit.<tag>.node, with os/cpu/libc so npm installs it only there;
//   node scripts/npm-packages.js ADDON STAGEDIR OUTDIR
//     both for linux-x64-gnu (the main package names it and the tags in NPM_PLATFORM_TAGS,
//     comma-separated).
// Each is packed with `npm pack`; the tarballs go to OUTDIR, their names to stdout.
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const root = path.join(__dirname, '..')
const src = path.join(root, 'bindings', 'node')
const main = JSON.parse(fs.readFileSync(path.join(src, 'package.json'), 'utf8'))

// the platform packages a release may publish (scripts/platforms.sh: the ones built here)
const platforms = {
  'x86_64-unknown-linux-gnu': { tag: 'linux-x64-gnu', os: 'linux', cpu: 'x64', libc: 'glibc' },
  'aarch64-unknown-linux-gnu': { tag: 'linux-arm64-gnu', os: 'linux', cpu: 'arm64', libc: 'glibc' },
  'x86_64-unknown-linux-musl': { tag: 'linux-x64-musl', os: 'linux', cpu: 'x64', libc: 'musl' },
  'aarch64-unknown-linux-musl': { tag: 'linux-arm64-musl', os: 'linux', cpu: 'arm64', libc: 'musl' },
  'x86_64-apple-darwin': { tag: 'darwin-x64', os: 'darwin', cpu: 'x64' },
  'aarch64-apple-darwin': { tag: 'darwin-arm64', os: 'darwin', cpu: 'arm64' },
  'x86_64-pc-windows-gnu': { tag: 'win32-x64-gnu', os: 'win32', cpu: 'x64' },
}
const known = new Set(main.napi.targets.map((t) => platforms[t].tag))
if (main.optionalDependencies) {
  console.error('bindings/node/package.json: optionalDependencies are added here, at release time')
  process.exit(1)
}
if (main.scripts && (main.scripts.install || main.scripts.preinstall || main.scripts.postinstall)) {
  console.error('bindings/node/package.json: the published package must have no install script')
  process.exit(1)
}

function fail(message) {
  console.error(message)
  process.exit(1)
}

function pack(dir, outdir) {
  const out = execFileSync('npm', ['pack', '--json', '--pack-destination', path.resolve(outdir)], {
    cwd: dir,
    encoding: 'utf8',
  })
  return JSON.parse(out)[0]
}

// the main package: the files package.json lists, plus the LICENSE
function packMain(stage, outdir, tags) {
  for (const tag of tags) {
    if (!known.has(tag)) fail(`${tag} is not one of package.json's napi.targets (${[...known].join(', ')})`)
  }
  const expected = Object.fromEntries([...new Set(tags)].map((tag) => [`${main.napi.packageName}-${tag}`, main.version]))
  const mainDir = stage
  fs.rmSync(mainDir, { recursive: true, force: true })
  fs.mkdirSync(mainDir, { recursive: true })
  fs.mkdirSync(outdir, { recursive: true })
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
    fail(`the published README keeps a relative link: ${relative[0]}`)
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
  const packed = pack(mainDir, outdir)
  if (packed.files.some((f) => f.path.endsWith('.node'))) {
    fail('the main npm package must not carry a binary')
  }
  return packed.filename
}

// the platform package of TRIPLE
function packPlatform(triple, addon, stage, outdir) {
  const p = platforms[triple]
  if (!p || !known.has(p.tag)) fail(`${triple} is not one of package.json's napi.targets`)
  const binary = `${main.napi.binaryName}.${p.tag}.node`
  const platDir = stage
  fs.rmSync(platDir, { recursive: true, force: true })
  fs.mkdirSync(platDir, { recursive: true })
  fs.mkdirSync(outdir, { recursive: true })
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
  return pack(platDir, outdir).filename
}

const args = process.argv.slice(2)
const usage = 'usage: node scripts/npm-packages.js main STAGEDIR OUTDIR TAG... | platform TRIPLE ADDON STAGEDIR OUTDIR | ADDON STAGEDIR OUTDIR'
if (args[0] === 'main') {
  if (args.length < 4) fail(usage)
  console.log(packMain(path.join(args[1], 'shardlimit'), args[2], args.slice(3)))
} else if (args[0] === 'platform') {
  if (args.length !== 5) fail(usage)
  console.log(packPlatform(args[1], args[2], args[3], args[4]))
} else {
  if (args.length !== 3) fail(usage)
  const [addon, stage, outdir] = args
  const more = (process.env.NPM_PLATFORM_TAGS || '').split(',').map((s) => s.trim()).filter(Boolean)
  for (const tag of more) if (!known.has(tag)) fail(`NPM_PLATFORM_TAGS: ${tag} is not one of package.json's napi.targets (${[...known].join(', ')})`)
  fs.rmSync(stage, { recursive: true, force: true })
  const names = [
    packMain(path.join(stage, 'shardlimit'), outdir, ['linux-x64-gnu', ...more]),
    packPlatform('x86_64-unknown-linux-gnu', addon, path.join(stage, 'linux-x64-gnu'), outdir),
  ]
  console.log(names.join('\n'))
}
