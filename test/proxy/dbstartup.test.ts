/**
 * The database startup peeks (src/proxy/dbstartup.ts): incremental adapters over the agent's parsers (src/dbproto/).
 * Postgres: what the client asks for, byte by byte or at once, after an SSLRequest refused; nothing when the client
 * negotiates TLS with the database, sends garbage or too much, or sends what the agent's parser refuses.
 */
import { describe, expect, it } from 'vitest';
import { MAX_STARTUP_BYTES, MYSQL_PEEK_BYTES, MysqlStartupPeek, PG_PEEK_BYTES, PgStartupPeek, startupPeek } from '../../src/proxy/dbstartup.js';

function startup(params: Record<string, string>): Buffer {
  const body = Buffer.concat([...Object.entries(params).flatMap(([k, v]) => [Buffer.from(`${k}\0${v}\0`)]), Buffer.from('\0')]);
  const head = Buffer.alloc(8);
  head.writeUInt32BE(8 + body.length, 0);
  head.writeUInt32BE(196608, 4);
  return Buffer.concat([head, body]);
}
const sslRequest = Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);

describe('PgStartupPeek', () => {
  it('reads user and database, fed at once or one byte at a time, after a refused SSLRequest', () => {
    const bytes = Buffer.concat([sslRequest, startup({ user: 'orders_app', database: 'shop', application_name: 'psql' }), Buffer.from('Q...')]);
    expect(new PgStartupPeek().feed(bytes)).toEqual({ done: true, user: 'orders_app', database: 'shop' });
    const peek = new PgStartupPeek();
    let answer = peek.feed(Buffer.alloc(0));
    for (const b of bytes) answer = peek.feed(Buffer.from([b]));
    expect(answer).toEqual({ done: true, user: 'orders_app', database: 'shop' });
  });

  it('the database defaults to the user, as Postgres does', () => {
    expect(new PgStartupPeek().feed(startup({ user: 'alice' }))).toEqual({ done: true, user: 'alice', database: 'alice' });
  });

  it('hostile: TLS with the database, garbage, an endless message, control characters: no answer, bounded', () => {
    const tlsHello = Buffer.concat([sslRequest, Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])]);
    expect(new PgStartupPeek().feed(tlsHello)).toEqual({ done: true });
    expect(new PgStartupPeek().feed(Buffer.from('GET / HTTP/1.1\r\n\r\n'))).toEqual({ done: true });
    const huge = Buffer.alloc(12);
    huge.writeUInt32BE(0x7fffffff, 0);
    huge.writeUInt32BE(196608, 4);
    expect(new PgStartupPeek().feed(huge)).toEqual({ done: true });
    // A message that claims to be short but never completes: given up once MAX_STARTUP_BYTES have passed.
    const peek = new PgStartupPeek();
    const head = Buffer.alloc(8);
    head.writeUInt32BE(4000, 0);
    head.writeUInt32BE(196608, 4);
    expect(peek.feed(head)).toEqual({ done: false });
    expect(peek.feed(Buffer.alloc(MAX_STARTUP_BYTES))).toEqual({ done: true });
    expect(new PgStartupPeek().feed(startup({ user: 'a\u001b[2Jb', database: 'x'.repeat(300) }))).toEqual({ done: true });
    // An endless run of SSLRequests is bounded too.
    const many = new PgStartupPeek();
    let answer = many.feed(sslRequest);
    for (let i = 0; i < 2000 && !answer.done; i++) answer = many.feed(sslRequest);
    expect(answer).toEqual({ done: true });
  });

  it('reads what the agent reads: a parameter named twice is refused, a GSSENCRequest then an SSLRequest are passed over', () => {
    // The server takes the last of two `user` parameters; the agent's parser refuses the message, and so the audit
    // records no user rather than one the agent did not check.
    const twice = Buffer.concat([startup({ user: 'alice' }).subarray(0, 8 + 'user\0alice\0'.length), Buffer.from('user\0postgres\0\0')]);
    twice.writeUInt32BE(twice.length, 0);
    expect(new PgStartupPeek().feed(twice)).toEqual({ done: true });
    const gssenc = Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30]);
    expect(new PgStartupPeek().feed(Buffer.concat([gssenc, sslRequest, startup({ user: 'bob', database: '' })]))).toEqual({ done: true, user: 'bob', database: 'bob' });
    const cancel = Buffer.alloc(16);
    cancel.writeUInt32BE(16, 0);
    cancel.writeUInt32BE(80877102, 4);
    expect(new PgStartupPeek().feed(cancel)).toEqual({ done: true });
  });

  it('never holds more than its bound, however the bytes come', () => {
    const peek = new PgStartupPeek();
    const head = Buffer.alloc(8);
    head.writeUInt32BE(PG_PEEK_BYTES - 16, 0);
    head.writeUInt32BE(196608, 4);
    expect(peek.feed(Buffer.concat([sslRequest, sslRequest, head]))).toEqual({ done: false });
    for (let i = 0; i < 100 && peek.held > 0; i++) {
      expect(peek.held).toBeLessThanOrEqual(PG_PEEK_BYTES);
      peek.feed(Buffer.alloc(1000, 0x61));
    }
    expect(peek.held).toBe(0);
    expect(peek.feed(Buffer.alloc(1))).toEqual({ done: true });
    expect(MAX_STARTUP_BYTES).toBe(Math.max(PG_PEEK_BYTES, MYSQL_PEEK_BYTES));
  });
});

/** A MySQL HandshakeResponse41 packet (sequence 1) as the mysql and mariadb clients send it. */
function handshake(o: { user: string; database?: string; caps?: number; auth?: Buffer }): Buffer {
  const caps = o.caps ?? (0x200 | 0x8000 | 0x80000 | 0x200000 | (o.database ? 0x8 : 0));
  const fixed = Buffer.alloc(32);
  fixed.writeUInt32LE(caps, 0);
  fixed.writeUInt32LE(16 * 1024 * 1024, 4);
  fixed[8] = 45;
  const auth = o.auth ?? Buffer.alloc(20, 7);
  const body = Buffer.concat([fixed, Buffer.from(`${o.user}\0`), Buffer.from([auth.length]), auth, o.database ? Buffer.from(`${o.database}\0`) : Buffer.alloc(0), Buffer.from('mysql_native_password\0')]);
  const head = Buffer.alloc(4);
  head.writeUIntLE(body.length, 0, 3);
  head[3] = 1;
  return Buffer.concat([head, body]);
}

describe('MysqlStartupPeek', () => {
  it('reads the username and database of a handshake response, at once or byte by byte', () => {
    const bytes = handshake({ user: 'orders_app', database: 'shop' });
    expect(new MysqlStartupPeek().feed(bytes)).toEqual({ done: true, user: 'orders_app', database: 'shop' });
    const peek = new MysqlStartupPeek();
    let answer = peek.feed(Buffer.alloc(0));
    for (const b of bytes) answer = peek.feed(Buffer.from([b]));
    expect(answer).toEqual({ done: true, user: 'orders_app', database: 'shop' });
    expect(new MysqlStartupPeek().feed(handshake({ user: 'bob' }))).toEqual({ done: true, user: 'bob' });
    expect(startupPeek('mysql')).toBeInstanceOf(MysqlStartupPeek);
    expect(startupPeek('redis')).toBeUndefined();
  });

  it('hostile: an SSL request, an old protocol, garbage, a huge length, an unterminated name: no answer, bounded', () => {
    const ssl = Buffer.alloc(36);
    ssl.writeUIntLE(32, 0, 3);
    ssl[3] = 1;
    ssl.writeUInt32LE(0x200 | 0x800 | 0x8000, 4);
    expect(new MysqlStartupPeek().feed(ssl)).toEqual({ done: true });
    expect(new MysqlStartupPeek().feed(handshake({ user: 'old', caps: 0x8000 }))).toEqual({ done: true });
    expect(new MysqlStartupPeek().feed(Buffer.from('\x16\x03\x01\x02\x00garbage'))).toEqual({ done: true });
    expect(new MysqlStartupPeek().feed(Buffer.from([0xff, 0xff, 0xff, 0x01]))).toEqual({ done: true });
    const unterminated = handshake({ user: 'x'.repeat(40) }).subarray(0, 60);
    unterminated.writeUIntLE(56, 0, 3);
    expect(new MysqlStartupPeek().feed(unterminated)).toEqual({ done: true });
    expect(new MysqlStartupPeek().feed(handshake({ user: 'evil\u001b[2J', database: 'shop' }))).toEqual({ done: true });
  });

  it('reads what the agent reads: a long response (connection attributes) is read, TLS or compression asked for is not', () => {
    // 20 KiB of attributes after the plugin name: within the agent's 64 KiB, so read (beyond the old 8 KiB peek).
    const long = Buffer.concat([handshake({ user: 'orders_app', database: 'shop' }), Buffer.alloc(20 * 1024, 0x61)]);
    long.writeUIntLE(long.length - 4, 0, 3);
    expect(new MysqlStartupPeek().feed(long)).toEqual({ done: true, user: 'orders_app', database: 'shop' });
    // CLIENT_SSL in a full response, or CLIENT_COMPRESS: the agent refuses the client, the audit records no user.
    expect(new MysqlStartupPeek().feed(handshake({ user: 'tls', caps: 0x200 | 0x800 | 0x8000 | 0x200000 }))).toEqual({ done: true });
    expect(new MysqlStartupPeek().feed(handshake({ user: 'zip', caps: 0x200 | 0x20 | 0x8000 | 0x200000 }))).toEqual({ done: true });
    const peek = new MysqlStartupPeek();
    const head = Buffer.from([0xff, 0xff, 0x00, 0x01]); // 65535 bytes announced, never sent in full
    expect(peek.feed(head)).toEqual({ done: false });
    peek.feed(Buffer.alloc(60_000, 0x61));
    expect(peek.held).toBeLessThanOrEqual(MYSQL_PEEK_BYTES);
    expect(peek.feed(Buffer.alloc(MYSQL_PEEK_BYTES))).toEqual({ done: true });
  });
});
