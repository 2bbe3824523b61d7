/**
 * What a database client asks for, read from the first bytes it sends through the Proxy, for the audit of its
 * session (sessionaudit.ts): the database user and name.
 *
 *   Postgres   the startup message's `user` and `database` (after an SSLRequest or GSSENCRequest the server
 *              refused; one it accepted is followed by a TLS record, and the peek gives up)
 *   MySQL      the handshake response's username and, with CLIENT_CONNECT_WITH_DB, database (the server speaks
 *              first; the client's first packet is the response, or an SSL request, after which the peek gives up)
 *
 * Pure, bounded and incremental, like the parsers of src/mux/: feed() takes the client's chunks as they come and
 * the answer is known once the message is complete, or given up when the client negotiates TLS with the
 * database, sends something else, or exceeds MAX_STARTUP_BYTES. It decides nothing: the Proxy only records what
 * the client asked for. The database (and the agent) still authenticate and authorize the user.
 */

/** The most bytes looked at: an SSLRequest or GSSENCRequest (8 each) and a startup message of at most 8 KiB. */
export const MAX_STARTUP_BYTES = 8 * 1024 + 16;
const PROTOCOL_3 = 196608;
const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

export type StartupAnswer = { done: false } | { done: true; user?: string; database?: string };

export interface StartupPeek {
  feed(chunk: Buffer): StartupAnswer;
}

/** The peek for a database protocol, or undefined when its startup names no user the Proxy reads. */
export function startupPeek(protocol: string | undefined): StartupPeek | undefined {
  if (protocol === 'postgres') return new PgStartupPeek();
  if (protocol === 'mysql') return new MysqlStartupPeek();
  return undefined;
}

export class PgStartupPeek implements StartupPeek {
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

const CLIENT_CONNECT_WITH_DB = 0x8;
const CLIENT_PROTOCOL_41 = 0x200;
const CLIENT_SSL = 0x800;
const CLIENT_SECURE_CONNECTION = 0x8000;
const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA = 0x200000;
/** The fixed part of a HandshakeResponse41: capabilities, max packet size, character set, 23 reserved bytes. */
const MYSQL_FIXED = 32;

export class MysqlStartupPeek implements StartupPeek {
  private buffered = Buffer.alloc(0);
  private answer: StartupAnswer = { done: false };

  feed(chunk: Buffer): StartupAnswer {
    if (this.answer.done) return this.answer;
    this.buffered = Buffer.concat([this.buffered, chunk.subarray(0, Math.max(0, MAX_STARTUP_BYTES - this.buffered.length))]);
    if (this.buffered.length < 4) return this.answer;
    const length = this.buffered.readUIntLE(0, 3);
    if (length < MYSQL_FIXED || length > MAX_STARTUP_BYTES - 4) return this.give({});
    if (this.buffered.length < 4 + length) return this.buffered.length >= MAX_STARTUP_BYTES ? this.give({}) : this.answer;
    return this.give(handshakeResponse(this.buffered.subarray(4, 4 + length)));
  }

  private give(found: { user?: string; database?: string }): StartupAnswer {
    this.answer = { done: true, ...found };
    this.buffered = Buffer.alloc(0);
    return this.answer;
  }
}

/** A HandshakeResponse41's username and database; nothing from an SSL request or an old protocol's response. */
function handshakeResponse(p: Buffer): { user?: string; database?: string } {
  const caps = p.readUInt32LE(0);
  if (!(caps & CLIENT_PROTOCOL_41) || ((caps & CLIENT_SSL) && p.length === MYSQL_FIXED)) return {};
  let at = MYSQL_FIXED;
  const user = cString(p, at);
  if (user === undefined) return {};
  at += Buffer.byteLength(user) + 1;
  if (caps & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA) {
    const n = p[at];
    if (n === undefined || n >= 0xfb) return printable(user) ? { user } : {}; // a longer length-encoded integer: not for a password hash
    at += 1 + n;
  } else if (caps & CLIENT_SECURE_CONNECTION) {
    at += 1 + (p[at] ?? 0);
  } else {
    const auth = cString(p, at);
    at += auth === undefined ? p.length : Buffer.byteLength(auth) + 1;
  }
  const database = caps & CLIENT_CONNECT_WITH_DB ? cString(p, at) : undefined;
  return { ...(printable(user) ? { user } : {}), ...(database !== undefined && printable(database) && printable(user) ? { database } : {}) };
}

/** The NUL-terminated string at at, or undefined when there is none. */
function cString(p: Buffer, at: number): string | undefined {
  if (at >= p.length) return undefined;
  const end = p.indexOf(0, at);
  return end < 0 ? undefined : p.subarray(at, end).toString('utf8');
}

function printable(value: string): boolean {
  // eslint-disable-next-line no-control-regex
  return value.length > 0 && value.length <= 256 && !/[\u0000-\u001f\u007f]/.test(value);
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
