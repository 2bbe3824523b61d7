/**
 * The MySQL / MariaDB connection phase, as the agent reads it to check the database user and name, and the Proxy
 * to record them in the session audit (src/proxy/dbstartup.ts): one reading for both (MySQL client/server
 * protocol, "Connection Phase"; MariaDB's is the same for what is read here). Pure and bounded.
 *
 * The server speaks first: the agent relays the server's greeting (HandshakeV10) with CLIENT_SSL and the
 * compression capabilities taken out (mysqlGreeting), so that the client's HandshakeResponse41 comes in the
 * clear and every later packet keeps its plain framing; then it reads that response (parseMysqlResponse): user,
 * and the database when CLIENT_CONNECT_WITH_DB is set. A client that asks for TLS anyway (an SSLRequest: a
 * 32-byte response with CLIENT_SSL), for compression, or speaks the pre-4.1 protocol is refused.
 *
 * After the connection phase every command starts a packet of sequence id 0; MysqlCommandScanner follows the
 * packet headers of the client's bytes and stops at COM_CHANGE_USER (which would switch the database user
 * without a new startup). What a session does with SQL (USE, qualified table names) is the database's own
 * grants' business: only the database named at connect time is checked (docs/security.md says so).
 *
 * Every parser takes the bytes received so far and answers need-more, a result, or invalid: it never throws.
 * A packet's 3-byte length is checked against the cap as soon as its header is in.
 */

/** The largest greeting or handshake response accepted (real ones are a few hundred bytes). */
export const MYSQL_MAX_HANDSHAKE_BYTES = 64 * 1024;
export const CLIENT_CONNECT_WITH_DB = 0x8;
export const CLIENT_COMPRESS = 0x20;
export const CLIENT_PROTOCOL_41 = 0x200;
export const CLIENT_SSL = 0x800;
export const CLIENT_SECURE_CONNECTION = 0x8000;
export const CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA = 0x200000;
export const CLIENT_ZSTD_COMPRESSION_ALGORITHM = 0x4000000;
export const COM_CHANGE_USER = 0x11;

export type MysqlPacketResult = { kind: 'need-more' } | { kind: 'packet'; seq: number; payload: Buffer; length: number } | { kind: 'invalid'; reason: string };

/** One packet (3-byte little-endian payload length, sequence id, payload) at the start of buf. */
export function parseMysqlPacket(buf: Buffer, maxPayload = MYSQL_MAX_HANDSHAKE_BYTES): MysqlPacketResult {
  if (buf.length < 4) return { kind: 'need-more' };
  const size = buf.readUIntLE(0, 3);
  if (size > maxPayload) return { kind: 'invalid', reason: `a handshake packet of ${size} bytes (at most ${maxPayload})` };
  if (buf.length < 4 + size) return { kind: 'need-more' };
  return { kind: 'packet', seq: buf[3]!, payload: buf.subarray(4, 4 + size), length: 4 + size };
}

export type MysqlGreeting = { kind: 'greeting'; packet: Buffer } | { kind: 'server-error'; packet: Buffer } | { kind: 'invalid'; reason: string };

/**
 * The server's greeting packet to relay: a HandshakeV10 with CLIENT_SSL, CLIENT_COMPRESS and zstd compression
 * cleared (in a copy), or the server's ERR packet as it is (too many connections, host blocked).
 */
export function mysqlGreeting(packet: Buffer): MysqlGreeting {
  const payload = packet.subarray(4);
  if (payload[0] === 0xff) return { kind: 'server-error', packet };
  if (payload[0] !== 10) return { kind: 'invalid', reason: `greeting of protocol version ${payload[0] ?? 'none'} (10 is spoken)` };
  const versionEnd = payload.indexOf(0, 1);
  const lower = versionEnd + 1 + 4 + 8 + 1;
  if (versionEnd < 0 || payload.length < lower + 2) return { kind: 'invalid', reason: 'a truncated greeting' };
  const out = Buffer.from(packet);
  const at = 4 + lower;
  out.writeUInt16LE(out.readUInt16LE(at) & ~(CLIENT_SSL | CLIENT_COMPRESS) & 0xffff, at);
  const upper = at + 2 + 1 + 2;
  if (out.length >= upper + 2) out.writeUInt16LE(out.readUInt16LE(upper) & ~(CLIENT_ZSTD_COMPRESSION_ALGORITHM >>> 16) & 0xffff, upper);
  return { kind: 'greeting', packet: out };
}

export type MysqlResponse = { kind: 'response'; user: string; database?: string } | { kind: 'invalid'; reason: string };

/** The client's HandshakeResponse41 payload: its user and (with CLIENT_CONNECT_WITH_DB) database. */
export function parseMysqlResponse(payload: Buffer): MysqlResponse {
  if (payload.length < 4) return { kind: 'invalid', reason: 'a truncated handshake response' };
  const caps = payload.readUInt32LE(0);
  if ((caps & CLIENT_PROTOCOL_41) === 0) return { kind: 'invalid', reason: 'a pre-4.1 handshake response' };
  if (caps & CLIENT_SSL) return { kind: 'invalid', reason: 'the client asks the database for TLS' };
  if (caps & (CLIENT_COMPRESS | CLIENT_ZSTD_COMPRESSION_ALGORITHM)) return { kind: 'invalid', reason: 'the client asks for compression' };
  const userEnd = payload.indexOf(0, 32);
  if (payload.length < 32 || userEnd < 0) return { kind: 'invalid', reason: 'no user in the handshake response' };
  const user = payload.toString('utf8', 32, userEnd);
  const authEnd = skipAuthResponse(payload, userEnd + 1, caps);
  if (authEnd === undefined) return { kind: 'invalid', reason: 'a truncated auth response' };
  if (!(caps & CLIENT_CONNECT_WITH_DB)) return { kind: 'response', user };
  const dbEnd = payload.indexOf(0, authEnd);
  if (dbEnd < 0) return { kind: 'invalid', reason: 'CLIENT_CONNECT_WITH_DB without a database' };
  const database = payload.toString('utf8', authEnd, dbEnd);
  return database === '' ? { kind: 'response', user } : { kind: 'response', user, database };
}

/** Where the auth response that starts at `at` ends, or undefined when it runs past the payload. */
function skipAuthResponse(payload: Buffer, at: number, caps: number): number | undefined {
  if (caps & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA) {
    const first = payload[at];
    if (first === undefined) return undefined;
    let len: number;
    let head: number;
    if (first < 0xfb) [len, head] = [first, 1];
    else if (first === 0xfc && at + 3 <= payload.length) [len, head] = [payload.readUInt16LE(at + 1), 3];
    else if (first === 0xfd && at + 4 <= payload.length) [len, head] = [payload.readUIntLE(at + 1, 3), 4];
    else return undefined; // 0xfb (NULL), 0xfe (8 bytes: more than any packet here) and 0xff: not an auth response
    return at + head + len <= payload.length ? at + head + len : undefined;
  }
  if (caps & CLIENT_SECURE_CONNECTION) {
    const len = payload[at];
    return len !== undefined && at + 1 + len <= payload.length ? at + 1 + len : undefined;
  }
  const end = payload.indexOf(0, at);
  return end < 0 ? undefined : end + 1;
}

/** An ERR packet: code 1045 (user) or 1044 (database) with SQLSTATE 28000 / 42000; the client prints the message. */
export function mysqlErrPacket(seq: number, code: number, sqlstate: string, message: string): Buffer {
  const text = Buffer.from(message, 'utf8').subarray(0, 60_000);
  const payload = Buffer.concat([Buffer.from([0xff, code & 0xff, code >> 8]), Buffer.from(`#${sqlstate.slice(0, 5).padEnd(5, '0')}`), text]);
  const header = Buffer.alloc(4);
  header.writeUIntLE(payload.length, 0, 3);
  header[3] = seq & 0xff;
  return Buffer.concat([header, payload]);
}

/**
 * Follows the client's packets after the handshake response without holding them: push() says how many bytes of
 * the chunk may go to the server, and stops (violation) at a command packet (sequence id 0) that is
 * COM_CHANGE_USER. State is the header bytes seen of the current packet and how much of its payload is left.
 */
export class MysqlCommandScanner {
  private header = Buffer.alloc(4);
  private headerHave = 0;
  private remaining = 0;
  /** The current packet is a command (sequence id 0) whose first payload byte has not been seen yet. */
  private awaitingCommand = false;

  push(chunk: Buffer): { forward: number; violation?: string } {
    let at = 0;
    while (at < chunk.length) {
      if (this.remaining > 0) {
        if (this.awaitingCommand) {
          this.awaitingCommand = false;
          if (chunk[at] === COM_CHANGE_USER) return { forward: at, violation: 'COM_CHANGE_USER (a change of database user inside the session)' };
        }
        const take = Math.min(this.remaining, chunk.length - at);
        this.remaining -= take;
        at += take;
        continue;
      }
      const take = Math.min(4 - this.headerHave, chunk.length - at);
      chunk.copy(this.header, this.headerHave, at, at + take);
      this.headerHave += take;
      at += take;
      if (this.headerHave === 4) {
        this.headerHave = 0;
        this.remaining = this.header.readUIntLE(0, 3);
        this.awaitingCommand = this.header[3] === 0 && this.remaining > 0;
      }
    }
    return { forward: chunk.length };
  }
}
