// Compiled with no @types/node (tsconfig "types": []): the package's own types stand alone.
import { Limiter, ManualClock, Limit, expressMiddleware, UnknownPolicyError, type Decision } from 'shardlimit'

export async function plain(): Promise<boolean> {
  const limiter = Limiter.fromJson({ policies: { api: { algorithm: 'fixed_window', limit: 5, window: '1m' } } }, { clock: new ManualClock(0) })
  const d: Decision = await limiter.check('k', { policy: 'api' })
  const a = await limiter.check('k', { limit: new Limit({ algorithm: 'fixed_window', limit: 1, window: '1s' }) })
  try {
    limiter.policy('nope')
  } catch (e) {
    if (e instanceof UnknownPolicyError) void e.code
  }
  // the middleware types need no Node types either
  void expressMiddleware(limiter, { policy: 'api' })
  limiter.close()
  return d.allowed && a.allowed
}
