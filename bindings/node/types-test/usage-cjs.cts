// The CommonJS view of the same types.
import sl = require('shardlimit')

export async function cjs(): Promise<boolean> {
  const limiter = sl.Limiter.memory()
  const d = await limiter.check('k', { policy: 'p' })
  return d.allowed && sl.ERROR_CODES.ERR_SHARDLIMIT_CONFIG === sl.ConfigError
}
