/**
 * The database startup peeks (src/proxy/dbstartup.ts). Postgres: what the client asks for, byte by byte or at once, after an
 * SSLRequest refused; nothing when the client negotiates TLS with the database, sends garbage or too much.
 */
import { describe, expect, it } from 'vitest';
import { MAX_STARTUP_BYTES, MysqlStartupPeek, PgStartupPeek, startupPeek } from '../../src/proxy/dbstartup.js';

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
});
