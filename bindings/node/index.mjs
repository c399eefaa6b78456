// ESM entry: the same module as index.js, every name it exports (test/exports.test.js
// imports each documented name both ways).
import shardlimit from './index.js'

export const {
  Limiter,
  Limit,
  Decision,
  ManualClock,
  ShardlimitError,
  ConfigError,
  InvalidArgumentError,
  UnknownPolicyError,
  ConnectionError,
  TimeoutError,
  ScriptError,
  IoError,
  InternalError,
  UnavailableError,
  OverloadedError,
  ERROR_CLASSES,
  ERROR_CODES,
  TrustedProxies,
  clientIp,
  ipKey,
  errorKinds,
  coreVersion,
  platformTag,
  expressMiddleware,
  fastifyHook,
  fastifyPlugin,
} = shardlimit
export default shardlimit
