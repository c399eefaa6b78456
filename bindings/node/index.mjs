// ESM entry: the same module as index.js.
import shardlimit from './index.js'

export const {
  Limiter,
  Decision,
  ManualClock,
  ShardlimitError,
  ConfigError,
  InvalidArgumentError,
  UnknownPolicyError,
  ConnectionError,
  TimeoutError,
  ScriptError,
  RoutingError,
  IoError,
  InternalError,
  ERROR_CLASSES,
  ERROR_CODES,
  errorKinds,
  coreVersion,
  platformTag,
  expressMiddleware,
  fastifyHook,
  fastifyPlugin,
  TrustedProxies,
  clientIp,
  ipKey,
} = shardlimit
export default shardlimit
