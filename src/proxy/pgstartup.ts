/**
 * What a Postgres client asks for, read from the first bytes it sends through the Proxy, for the audit of its
 * session (sessionaudit.ts): the startup message's `user` and `database`. Pure, bounded and incremental, like the
 * parsers of src/mux/: feed() takes the client's chunks as they come and the answer is known once the startup
 * message is complete, or given up when the client negotiates TLS with the database (an SSLRequest answered 'S':
 * the next bytes are a TLS record), sends something else, or exceeds MAX_STARTUP_BYTES.
 *
 * It decides nothing: the Proxy only records what the client asked for. The database (and the agent) still
 * authenticate and authorize the user.
 */

/** The most bytes looked at: an SSLRequest or GSSENCRequest (8 each) and a startup message of at most 8 KiB. */
export const MAX_STARTUP_BYTES = 8 * 1024 + 16;
const PROTOCOL_3 = 196608;
const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

export type StartupAnswer = { done: false } | { done: true; user?: string; database?: string };

export class PgStartupPeek {
  private buffered = Buffer.alloc(0);
  private seen = 0;
  private answer: StartupAnswer = { done: false };

  /** Takes the client's next chunk; returns the answer once known (and the same answer afterwards). */
  feed(chunk: Buffer): StartupAnswer {
    if (this.answer.done) return this.answer;
    this.seen += chunk.length;
    const room = MAX_STARTUP_BYTES - this.buffered.length;
    this.buffered = Buffer.concat([this.buffered, chunk.subarray(0, Math.max(0, room))]);
    for (;;) {
      if (this.buffered.length < 8) return this.seen > MAX_STARTUP_BYTES ? this.give() : this.answer;
      const length = this.buffered.readUInt32BE(0);
      const code = this.buffered.readUInt32BE(4);
      if (length === 8 && (code === SSL_REQUEST || code === GSSENC_REQUEST)) {
        this.buffered = this.buffered.subarray(8);
        continue;
      }
      if (code !== PROTOCOL_3 || length < 9 || length > MAX_STARTUP_BYTES - 16) return this.give();
      if (this.buffered.length < length) return this.seen > MAX_STARTUP_BYTES ? this.give() : this.answer;
      return this.give(parameters(this.buffered.subarray(8, length)));
    }
  }

  private give(params: Map<string, string> = new Map()): StartupAnswer {
    const user = params.get('user');
    const database = params.get('database') ?? user;
    this.answer = { done: true, ...(user ? { user } : {}), ...(user && database ? { database } : {}) };
    this.buffered = Buffer.alloc(0);
    return this.answer;
  }
}

/** The startup message's key\0value\0 pairs (ended by an empty key); printable values of at most 256 characters. */
function parameters(body: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  const parts = body.toString('utf8').split('\0');
  for (let i = 0; i + 1 < parts.length; i += 2) {
    const key = parts[i]!;
    if (key === '') break;
    const value = parts[i + 1]!;
    // eslint-disable-next-line no-control-regex
    if (value.length <= 256 && !/[\u0000-\u001f\u007f]/.test(value)) out.set(key, value);
  }
  return out;
}
