'use strict'
// Loads the native addon: a binary built next to this file (`npm run build`, the install
// script, or one shipped inside the package tarball), else the per-platform package
// `@shardlimit/binding-<platform>` that a published release lists in optionalDependencies.

const { join } = require('node:path')
const { existsSync } = require('node:fs')

function isMusl() {
  if (process.platform !== 'linux') return false
  try {
    const report = process.report && process.report.getReport()
    const header = report && (typeof report === 'string' ? JSON.parse(report) : report).header
    return !(header && header.glibcVersionRuntime)
  } catch {
    return false
  }
}

/** The napi-rs platform tag of this process: linux-x64-gnu, darwin-arm64, win32-x64-gnu, ... */
function platformTag() {
  const { platform, arch } = process
  if (platform === 'linux') return `linux-${arch}-${isMusl() ? 'musl' : 'gnu'}`
  // the Windows addon is built with MinGW-w64 (gnu): it loads into the MSVC-built node.exe
  // as well, finding Node-API in the process at load time
  if (platform === 'win32') return `win32-${arch}-gnu`
  return `${platform}-${arch}`
}

function load() {
  const tag = platformTag()
  const tried = []
  const override = process.env.SHARDLIMIT_NATIVE_LIBRARY
  const candidates = override ? [override] : [join(__dirname, `shardlimit.${tag}.node`)]
  for (const file of candidates) {
    tried.push(file)
    if (existsSync(file)) return require(file)
  }
  const pkg = `@shardlimit/binding-${tag}`
  tried.push(pkg)
  try {
    return require(pkg)
  } catch (e) {
    if (e && e.code !== 'MODULE_NOT_FOUND') throw e
  }
  // an installed package: the platform package was not installed (npm skipped it, or
  // --omit=optional, or a lock file made on another platform); a checkout: not built yet
  const installed = __dirname.split(/[\\/]/).includes('node_modules')
  const err = new Error(
    `shardlimit: no native addon for ${tag}; tried ${tried.join(', ')}. ` +
      (installed
        ? `Install ${pkg} (npm installs it with shardlimit unless optional dependencies are omitted ` +
          'or the lock file was made on another platform), or use a platform shardlimit ships for.'
        : 'In a source checkout, build it with `npm run build` in bindings/node (needs Rust).')
  )
  err.code = 'ERR_SHARDLIMIT_NATIVE_MISSING'
  throw err
}

module.exports = { native: load(), platformTag }
