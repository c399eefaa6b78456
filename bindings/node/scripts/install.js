'use strict'
// npm "install" (and "prepack") step: make sure a native addon for this platform exists.
// 1. A binary next to index.js (shipped in the tarball, or built before) or a per-platform
//    package (@shardlimit/binding-<platform>, from optionalDependencies): nothing to do.
// 2. Else, in a source checkout (Cargo.toml present) with cargo on PATH: build it, release.
// 3. Else: fail with what to do.

const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const root = path.join(__dirname, '..')

function platformTag() {
  // the same rule as binding.js, without loading the addon
  const { platform, arch } = process
  if (platform === 'linux') {
    let glibc = true
    try {
      glibc = Boolean(process.report.getReport().header.glibcVersionRuntime)
    } catch {}
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`
  }
  if (platform === 'win32') return `win32-${arch}-msvc`
  return `${platform}-${arch}`
}

const tag = platformTag()
const target = path.join(root, `shardlimit.${tag}.node`)

function present() {
  if (fs.existsSync(target)) return true
  try {
    require.resolve(`@shardlimit/binding-${tag}`, { paths: [root] })
    return true
  } catch {
    return false
  }
}

function build() {
  const manifest = path.join(root, 'Cargo.toml')
  if (!fs.existsSync(manifest)) return false
  const env = { ...process.env }
  const cargo = env.CARGO || 'cargo'
  console.error(`shardlimit: building the native addon for ${tag} from source (cargo build --release)`)
  const r = spawnSync(cargo, ['build', '--release', '--lib', '--manifest-path', manifest], {
    stdio: 'inherit',
    env,
  })
  if (r.error || r.status !== 0) {
    console.error(`shardlimit: cargo build failed${r.error ? `: ${r.error.message}` : ''}`)
    process.exit(1)
  }
  const meta = spawnSync(cargo, ['metadata', '--format-version', '1', '--no-deps', '--manifest-path', manifest], {
    encoding: 'utf8',
    maxBuffer: 64 << 20,
  })
  if (meta.status !== 0) {
    console.error(meta.stderr)
    process.exit(1)
  }
  const targetDir = JSON.parse(meta.stdout).target_directory
  const lib = { darwin: 'libshardlimit_node.dylib', win32: 'shardlimit_node.dll' }[process.platform] || 'libshardlimit_node.so'
  fs.copyFileSync(path.join(targetDir, 'release', lib), target)
  console.error(`shardlimit: wrote ${path.relative(process.cwd(), target)}`)
  return true
}

if (!present() && !build()) {
  console.error(
    `shardlimit: no prebuilt native addon for ${tag} and no Rust sources to build it from.\n` +
      'Install a release that publishes this platform, or build from a source checkout (needs Rust).'
  )
  process.exit(1)
}
