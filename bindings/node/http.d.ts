// Optional: types `req.rateLimit` on Node's IncomingMessage for users who have @types/node.
// `import type {} from 'shardlimit/http'` once in the program.
import type { Decision } from './index.js'

declare module 'node:http' {
  interface IncomingMessage {
    /** Set by the shardlimit middleware. */
    rateLimit?: Decision
  }
}
