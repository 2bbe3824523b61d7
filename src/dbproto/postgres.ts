/**
 * The PostgreSQL client's first message, as the agent reads it to check the database user and name, and the Proxy
 * to record them in the session audit (src/proxy/dbstartup.ts): one reading for both (the protocol's "startup
 * phase", PostgreSQL documentation, chapter "Frontend/Backend Protocol"). Pure and bounded:
 * parsePgStartup is called with every byte received so far and answers
 *
 *   { kind: 'need-more' }            a valid prefix: call again with more bytes;
 *   { kind: 'ssl-request' }          SSLRequest (8 bytes); the agent answers 'N' and reads the next message;
 *   { kind: 'gssenc-request' }       GSSENCRequest (8 bytes); likewise 'N';
 *   { kind: 'cancel' }               CancelRequest (16 bytes): no user in it, it only names a backend and its key;
 *   { kind: 'startup', user, database, length }   StartupMessage of protocol 3.x: its parameters;
 *   { kind: 'invalid', reason }      anything else (never a throw).
 *
 * Every message of this phase is Int32 length (itself included) then Int32 code; the length is checked against
 * 8..PG_MAX_STARTUP_BYTES as soon as its 4 bytes are in (a length of 1 GiB is refused at once, nothing is waited
 * for), and nothing is decoded before the whole message is in. The parameters are NUL-terminated name/value
 * pairs ending with one more NUL, which must be the message's last byte. `user` is required; `database` defaults
 * to the user, as the server does. A parameter named twice is refused: the server takes the last one, and a
 * check must read what the server reads.
 */

/** The server's own limit for a startup packet (MAX_STARTUP_PACKET_LENGTH in PostgreSQL's source). */
export const PG_MAX_STARTUP_BYTES = 10_000;
export const PG_SSL_REQUEST_CODE = 80877103;
export const PG_GSSENC_REQUEST_CODE = 80877104;
export const PG_CANCEL_REQUEST_CODE = 80877102;

export type PgStartupResult =
  | { kind: 'need-more' }
  | { kind: 'ssl-request'; length: 8 }
  | { kind: 'gssenc-request'; length: 8 }
  | { kind: 'cancel'; length: 16 }
  | { kind: 'startup'; length: number; user: string; database: string }
  | { kind: 'invalid'; reason: string };

export function parsePgStartup(buf: Buffer): PgStartupResult {
  if (buf.length < 4) return { kind: 'need-more' };
  const length = buf.readUInt32BE(0);
  if (length < 8 || length > PG_MAX_STARTUP_BYTES) return { kind: 'invalid', reason: `a startup message of ${length} bytes (8 to ${PG_MAX_STARTUP_BYTES})` };
  if (buf.length < 8) return { kind: 'need-more' };
  const code = buf.readUInt32BE(4);
  if (code === PG_SSL_REQUEST_CODE || code === PG_GSSENC_REQUEST_CODE) {
    if (length !== 8) return { kind: 'invalid', reason: `an encryption request of ${length} bytes` };
    return code === PG_SSL_REQUEST_CODE ? { kind: 'ssl-request', length: 8 } : { kind: 'gssenc-request', length: 8 };
  }
  if (code === PG_CANCEL_REQUEST_CODE) {
    if (length !== 16) return { kind: 'invalid', reason: `a cancel request of ${length} bytes` };
    return buf.length < 16 ? { kind: 'need-more' } : { kind: 'cancel', length: 16 };
  }
  if (code >>> 16 !== 3) return { kind: 'invalid', reason: `protocol version ${code >>> 16}.${code & 0xffff} (3.x is spoken)` };
  if (buf.length < length) return { kind: 'need-more' };
  return startupParameters(buf.subarray(8, length), length);
}

function startupParameters(body: Buffer, length: number): PgStartupResult {
  const params = new Map<string, string>();
  let at = 0;
  for (;;) {
    if (at >= body.length) return { kind: 'invalid', reason: 'the parameters do not end with a NUL' };
    if (body[at] === 0) {
      if (at !== body.length - 1) return { kind: 'invalid', reason: 'bytes after the parameters' };
      break;
    }
    const nameEnd = body.indexOf(0, at);
    const valueEnd = nameEnd < 0 ? -1 : body.indexOf(0, nameEnd + 1);
    if (valueEnd < 0) return { kind: 'invalid', reason: 'a parameter without its NUL terminators' };
    const name = body.toString('utf8', at, nameEnd);
    if (params.has(name)) return { kind: 'invalid', reason: `the parameter "${name.slice(0, 64)}" twice` };
    params.set(name, body.toString('utf8', nameEnd + 1, valueEnd));
    at = valueEnd + 1;
  }
  const user = params.get('user');
  if (!user) return { kind: 'invalid', reason: 'no user in the startup message' };
  const database = params.get('database') || user;
  return { kind: 'startup', length, user, database };
}

/** The single byte that declines SSLRequest and GSSENCRequest: the client goes on in the clear (inside the tunnel). */
export const PG_DECLINE = Buffer.from('N');

/**
 * An ErrorResponse ('E'), severity FATAL, with sqlstate (28000 for a refused user or database name, 08P01 for a
 * protocol violation) and message: psql prints "FATAL:  <message>". NUL bytes in the message are dropped.
 */
export function pgErrorResponse(sqlstate: string, message: string): Buffer {
  const field = (type: string, value: string) => Buffer.concat([Buffer.from(type), Buffer.from(value.replace(/\0/g, ''), 'utf8'), Buffer.alloc(1)]);
  const body = Buffer.concat([field('S', 'FATAL'), field('V', 'FATAL'), field('C', sqlstate), field('M', message), Buffer.alloc(1)]);
  const header = Buffer.alloc(5);
  header.write('E', 0);
  header.writeUInt32BE(body.length + 4, 1);
  return Buffer.concat([header, body]);
}
