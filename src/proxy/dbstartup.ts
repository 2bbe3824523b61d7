/**
 * What a database client asks for, read from the first bytes it sends through the Proxy, for the audit of its
 * session (sessionaudit.ts): the database user and name.
 *
 *   Postgres   the startup message's `user` and `database` (after an SSLRequest or GSSENCRequest the server
 *              refused; one it accepted is followed by a TLS record, and the peek gives up)
 *   MySQL      the handshake response's username and, with CLIENT_CONNECT_WITH_DB, database (the server speaks
 *              first; the client's first packet is the response, or an SSL request, after which the peek gives up)
 *
 * The reading itself is the agent's (src/dbproto/: parsePgStartup, parseMysqlPacket, parseMysqlResponse): the
 * agent enforces db_users and db_names with those parsers, and the audit records what they read, never a reading
 * of its own. What a parser refuses (a parameter named twice, a client asking the database for TLS or compression,
 * a pre-4.1 handshake) is recorded as unknown here, and refused by the agent. This file only makes them
 * incremental: feed() takes the client's chunks as they come, holds at most the protocol's bound (the parser's own
 * limit, plus the two 8-byte requests Postgres may send first), and gives up past it. Values that are not printable
 * or longer than 256 characters are not recorded (they would go into the audit log as they are).
 *
 * It decides nothing: the Proxy only records what the client asked for. The database (and the agent) still
 * authenticate and authorize the user.
 */
import { MYSQL_MAX_HANDSHAKE_BYTES, parseMysqlPacket, parseMysqlResponse } from '../dbproto/mysql.js';
import { parsePgStartup, PG_MAX_STARTUP_BYTES } from '../dbproto/postgres.js';

/** Postgres: a GSSENCRequest and an SSLRequest (8 bytes each, both refused) and the startup message. */
export const PG_PEEK_BYTES = 8 + 8 + PG_MAX_STARTUP_BYTES;
/** MySQL: the handshake response packet (4-byte header and its payload). */
export const MYSQL_PEEK_BYTES = 4 + MYSQL_MAX_HANDSHAKE_BYTES;
/** The most bytes any peek holds. */
export const MAX_STARTUP_BYTES = Math.max(PG_PEEK_BYTES, MYSQL_PEEK_BYTES);

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

/** What a parser found: nothing (given up), or the user and database it read. */
type Found = { user?: string; database?: string };

/**
 * The incremental part both peeks share: the client's bytes are kept (up to the bound) until read() answers;
 * undefined from read() means a valid prefix, to be read again with more bytes.
 */
abstract class BoundedPeek implements StartupPeek {
  private buffered = Buffer.alloc(0);
  private seen = 0;
  private answer: StartupAnswer = { done: false };

  constructor(private readonly bound: number) {}

  /** The bytes held now (never more than the bound). */
  get held(): number {
    return this.buffered.length;
  }

  /** Takes the client's next chunk; returns the answer once known (and the same answer afterwards). */
  feed(chunk: Buffer): StartupAnswer {
    if (this.answer.done) return this.answer;
    this.seen += chunk.length;
    const room = this.bound - this.buffered.length;
    if (room > 0 && chunk.length > 0) this.buffered = Buffer.concat([this.buffered, chunk.subarray(0, room)]);
    const found = this.read(this.buffered);
    if (found) return this.give(found);
    // Still a prefix, but the client has sent the bound or more: a message longer than the parsers accept.
    return this.seen >= this.bound ? this.give({}) : this.answer;
  }

  /** What the bytes held so far say, or undefined for more. */
  protected abstract read(buffered: Buffer): Found | undefined;

  /** Drops the first n bytes held (a message read and passed over). */
  protected consume(n: number): void {
    this.buffered = this.buffered.subarray(n);
  }

  private give(found: Found): StartupAnswer {
    const user = found.user !== undefined && printable(found.user) ? found.user : undefined;
    const database = user !== undefined && found.database !== undefined && printable(found.database) ? found.database : undefined;
    this.answer = { done: true, ...(user !== undefined ? { user } : {}), ...(database !== undefined ? { database } : {}) };
    this.buffered = Buffer.alloc(0);
    return this.answer;
  }
}

export class PgStartupPeek extends BoundedPeek {
  constructor() {
    super(PG_PEEK_BYTES);
  }

  protected read(buffered: Buffer): Found | undefined {
    let rest = buffered;
    for (;;) {
      const r = parsePgStartup(rest);
      if (r.kind === 'need-more') return undefined;
      if (r.kind === 'startup') return { user: r.user, database: r.database };
      if (r.kind !== 'ssl-request' && r.kind !== 'gssenc-request') return {}; // a CancelRequest (no user) or what the parser refuses
      // Refused by the agent ('N'): the startup message follows. Accepted (by the database): a TLS record
      // follows, which parsePgStartup refuses as a length out of range, and the peek gives up.
      this.consume(r.length);
      rest = rest.subarray(r.length);
    }
  }
}

export class MysqlStartupPeek extends BoundedPeek {
  constructor() {
    super(MYSQL_PEEK_BYTES);
  }

  protected read(buffered: Buffer): Found | undefined {
    const packet = parseMysqlPacket(buffered, MYSQL_MAX_HANDSHAKE_BYTES);
    if (packet.kind === 'need-more') return undefined;
    if (packet.kind === 'invalid') return {};
    const response = parseMysqlResponse(packet.payload);
    return response.kind === 'response' ? { user: response.user, ...(response.database !== undefined ? { database: response.database } : {}) } : {};
  }
}

function printable(value: string): boolean {
  // eslint-disable-next-line no-control-regex
  return value.length > 0 && value.length <= 256 && !/[\u0000-\u001f\u007f]/.test(value);
}
