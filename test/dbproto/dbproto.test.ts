/**
 * The database protocol parsers (src/dbproto/: the agent enforces with them, the Proxy's audit records with them)
 * under hostile bytes: split at every byte, oversized lengths, truncated, garbage. They never throw, refuse an oversized length as soon as its header is in, and
 * read what the server reads (a check that reads another user than the server is a bypass).
 */
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  CLIENT_COMPRESS,
  CLIENT_CONNECT_WITH_DB,
  CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA,
  CLIENT_PROTOCOL_41,
  CLIENT_SECURE_CONNECTION,
  CLIENT_SSL,
  MysqlCommandScanner,
  mysqlErrPacket,
  mysqlGreeting,
  parseMysqlPacket,
  parseMysqlResponse,
} from '../../src/dbproto/mysql.js';
import { parsePgStartup, pgErrorResponse, PG_MAX_STARTUP_BYTES } from '../../src/dbproto/postgres.js';
import { bsonElements, MongoCommandScanner, mongoErrorReply, readCommand, saslUser, type MongoEvent } from '../../src/dbproto/mongo.js';
import { RedisCommandScanner, redisCommandUser, type RedisEvent } from '../../src/dbproto/redis.js';
import { bson, frame, opMsg, opQuery, scramFirst } from '../helpers/mongowire.js';

function pgStartup(params: Array<[string, string]>, version = 0x00030000): Buffer {
  const body = Buffer.concat([...params.map(([k, v]) => Buffer.from(`${k}\0${v}\0`)), Buffer.alloc(1)]);
  const head = Buffer.alloc(8);
  head.writeUInt32BE(body.length + 8, 0);
  head.writeUInt32BE(version, 4);
  return Buffer.concat([head, body]);
}

function int32s(...values: number[]): Buffer {
  const b = Buffer.alloc(values.length * 4);
  values.forEach((v, i) => b.writeUInt32BE(v >>> 0, i * 4));
  return b;
}

describe('PostgreSQL startup', () => {
  const startup = pgStartup([['user', 'orders_app'], ['database', 'orders'], ['application_name', 'psql']]);

  it('reads user and database, and only once the whole message is in (split at every byte)', () => {
    for (let i = 0; i < startup.length; i++) expect(parsePgStartup(startup.subarray(0, i))).toEqual({ kind: 'need-more' });
    expect(parsePgStartup(startup)).toEqual({ kind: 'startup', length: startup.length, user: 'orders_app', database: 'orders' });
    // What follows the message is not its business (the caller forwards it).
    expect(parsePgStartup(Buffer.concat([startup, Buffer.from('Xtrailing')]))).toMatchObject({ kind: 'startup', length: startup.length });
  });

  it('the database defaults to the user, as the server decides', () => {
    expect(parsePgStartup(pgStartup([['user', 'alice']]))).toMatchObject({ user: 'alice', database: 'alice' });
    expect(parsePgStartup(pgStartup([['user', 'alice'], ['database', '']]))).toMatchObject({ database: 'alice' });
  });

  it('SSLRequest, GSSENCRequest and CancelRequest', () => {
    expect(parsePgStartup(int32s(8, 80877103))).toEqual({ kind: 'ssl-request', length: 8 });
    expect(parsePgStartup(int32s(8, 80877104))).toEqual({ kind: 'gssenc-request', length: 8 });
    expect(parsePgStartup(int32s(16, 80877102, 1, 2))).toEqual({ kind: 'cancel', length: 16 });
    expect(parsePgStartup(int32s(16, 80877102, 1))).toEqual({ kind: 'need-more' });
    expect(parsePgStartup(int32s(12, 80877103, 0)).kind).toBe('invalid');
  });

  it('an oversized or undersized length is refused from its 4 bytes, without waiting for the body', () => {
    for (const len of [0, 7, PG_MAX_STARTUP_BYTES + 1, 0x7fffffff, 0xffffffff]) {
      expect(parsePgStartup(int32s(len)).kind, String(len)).toBe('invalid');
    }
  });

  it('refuses what a check could misread: a user twice, no user, bytes after the parameters, no final NUL, protocol 2', () => {
    expect(parsePgStartup(pgStartup([['user', 'alice'], ['user', 'postgres']])).kind).toBe('invalid');
    expect(parsePgStartup(pgStartup([['database', 'x']])).kind).toBe('invalid');
    expect(parsePgStartup(pgStartup([['user', '']])).kind).toBe('invalid');
    const noFinal = pgStartup([['user', 'alice']]).subarray(0, -1);
    noFinal.writeUInt32BE(noFinal.length, 0);
    expect(parsePgStartup(noFinal).kind).toBe('invalid');
    const extra = Buffer.concat([pgStartup([['user', 'alice']]), Buffer.from('junk\0')]);
    extra.writeUInt32BE(extra.length, 0);
    expect(parsePgStartup(extra).kind).toBe('invalid');
    const unterminated = Buffer.concat([int32s(0, 0x00030000), Buffer.from('user\0alice')]);
    unterminated.writeUInt32BE(unterminated.length, 0);
    expect(parsePgStartup(unterminated).kind).toBe('invalid');
    expect(parsePgStartup(pgStartup([['user', 'alice']], 0x00020000)).kind).toBe('invalid');
  });

  it('garbage never throws, and every answer is one of the kinds', () => {
    for (let i = 0; i < 3000; i++) {
      const b = randomBytes(1 + (i % 64));
      if (i % 3 === 0 && b.length >= 4) b.writeUInt32BE(8 + (i % 200), 0);
      if (b.length >= 8 && i % 2 === 0) b.writeUInt32BE(0x00030000, 4);
      expect(['need-more', 'invalid', 'startup', 'ssl-request', 'gssenc-request', 'cancel']).toContain(parsePgStartup(b).kind);
    }
  });

  it('the ErrorResponse carries FATAL, the SQLSTATE and the message, framed by its length', () => {
    const e = pgErrorResponse('28000', 'GW_ERR_DB_USER_DENIED: no\0pe');
    expect(e[0]).toBe('E'.charCodeAt(0));
    expect(e.readUInt32BE(1)).toBe(e.length - 1);
    expect(e.toString('latin1')).toContain('C28000\0');
    expect(e.toString('latin1')).toContain('MGW_ERR_DB_USER_DENIED: nope\0');
  });
});

function packet(seq: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(4);
  h.writeUIntLE(payload.length, 0, 3);
  h[3] = seq;
  return Buffer.concat([h, payload]);
}

function greeting(caps: number): Buffer {
  const p = Buffer.concat([
    Buffer.from([10]),
    Buffer.from('10.11.0-MariaDB\0'),
    Buffer.from([1, 0, 0, 0]),
    Buffer.alloc(8, 0x41),
    Buffer.alloc(1),
    Buffer.from([caps & 0xff, (caps >> 8) & 0xff]),
    Buffer.from([33, 2, 0]),
    Buffer.from([(caps >> 16) & 0xff, (caps >> 24) & 0xff]),
    Buffer.from([21]),
    Buffer.alloc(10),
    Buffer.alloc(13, 0x42),
    Buffer.from('mysql_native_password\0'),
  ]);
  return packet(0, p);
}

function response(user: string, database: string | undefined, caps = CLIENT_PROTOCOL_41 | CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA): Buffer {
  const c = database === undefined ? caps : caps | CLIENT_CONNECT_WITH_DB;
  const head = Buffer.alloc(32);
  head.writeUInt32LE(c >>> 0, 0);
  head.writeUInt32LE(16 * 1024 * 1024, 4);
  head[8] = 33;
  const auth = Buffer.alloc(20, 0x55);
  const authField = c & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA ? Buffer.concat([Buffer.from([auth.length]), auth]) : c & CLIENT_SECURE_CONNECTION ? Buffer.concat([Buffer.from([auth.length]), auth]) : Buffer.from('x\0');
  return Buffer.concat([head, Buffer.from(`${user}\0`), authField, database === undefined ? Buffer.alloc(0) : Buffer.from(`${database}\0`), Buffer.from('mysql_native_password\0')]);
}

describe('MySQL connection phase', () => {
  it('packets: need-more at every split, the cap refused from the header alone', () => {
    const p = packet(1, response('alice', 'shop'));
    for (let i = 0; i < p.length; i++) expect(parseMysqlPacket(p.subarray(0, i))).toEqual({ kind: 'need-more' });
    expect(parseMysqlPacket(p)).toMatchObject({ kind: 'packet', seq: 1, length: p.length });
    expect(parseMysqlPacket(Buffer.from([0xff, 0xff, 0xff, 1])).kind).toBe('invalid');
  });

  it('the greeting relayed has no CLIENT_SSL and no compression; the rest is unchanged', () => {
    const g = greeting(CLIENT_PROTOCOL_41 | CLIENT_SSL | CLIENT_COMPRESS | CLIENT_SECURE_CONNECTION | 0x4000000);
    const out = mysqlGreeting(g);
    expect(out.kind).toBe('greeting');
    if (out.kind !== 'greeting') return;
    const at = 4 + 1 + '10.11.0-MariaDB'.length + 1 + 4 + 8 + 1;
    expect(out.packet.readUInt16LE(at) & (CLIENT_SSL | CLIENT_COMPRESS)).toBe(0);
    expect(out.packet.readUInt16LE(at) & CLIENT_PROTOCOL_41).toBe(CLIENT_PROTOCOL_41);
    expect(out.packet.readUInt16LE(at + 5) & 0x400).toBe(0);
    expect(out.packet.length).toBe(g.length);
    expect(g.readUInt16LE(at) & CLIENT_SSL).toBe(CLIENT_SSL); // the input is not changed
    expect(mysqlGreeting(packet(0, Buffer.from([0xff, 0x10, 0x04, 0x23]))).kind).toBe('server-error');
    expect(mysqlGreeting(packet(0, Buffer.from([9, 0x41]))).kind).toBe('invalid');
    for (let i = 0; i < g.length - 4; i++) expect(['greeting', 'invalid']).toContain(mysqlGreeting(packet(0, g.subarray(4, 4 + i))).kind);
  });

  it('reads user and database from HandshakeResponse41 in its three auth-response encodings', () => {
    expect(parseMysqlResponse(response('alice', 'shop'))).toEqual({ kind: 'response', user: 'alice', database: 'shop' });
    expect(parseMysqlResponse(response('alice', undefined))).toEqual({ kind: 'response', user: 'alice' });
    expect(parseMysqlResponse(response('bob', 'x', CLIENT_PROTOCOL_41 | CLIENT_SECURE_CONNECTION))).toEqual({ kind: 'response', user: 'bob', database: 'x' });
    expect(parseMysqlResponse(response('bob', 'y', CLIENT_PROTOCOL_41))).toEqual({ kind: 'response', user: 'bob', database: 'y' });
  });

  it('refuses an SSLRequest, compression, pre-4.1, and every truncation (never throws)', () => {
    const ssl = Buffer.alloc(32);
    ssl.writeUInt32LE(CLIENT_PROTOCOL_41 | CLIENT_SSL, 0);
    expect(parseMysqlResponse(ssl).kind).toBe('invalid');
    expect(parseMysqlResponse(response('a', 'b', CLIENT_PROTOCOL_41 | CLIENT_COMPRESS)).kind).toBe('invalid');
    expect(parseMysqlResponse(response('a', 'b', CLIENT_SECURE_CONNECTION)).kind).toBe('invalid');
    const full = response('alice', 'shop');
    const userEnd = 32 + 'alice'.length;
    for (let i = 0; i < full.length; i++) {
      const r = parseMysqlResponse(full.subarray(0, i));
      // Cut before the database's NUL, the response cannot name the user or database the server would read.
      if (i <= userEnd + 1 + 21 + 'shop'.length) expect(r.kind, `cut at ${i}`).toBe('invalid');
    }
    // An auth-response length running past the packet.
    const lying = response('alice', 'shop');
    lying[userEnd + 1] = 0xfc;
    expect(() => parseMysqlResponse(lying)).not.toThrow();
    for (let i = 0; i < 3000; i++) expect(['invalid', 'response']).toContain(parseMysqlResponse(randomBytes(i % 90)).kind);
  });

  it('ERR packets: code, SQLSTATE marker and message, with the sequence id asked for', () => {
    const e = mysqlErrPacket(2, 1045, '28000', 'GW_ERR_DB_USER_DENIED: no');
    expect(e.readUIntLE(0, 3)).toBe(e.length - 4);
    expect(e[3]).toBe(2);
    expect(e[4]).toBe(0xff);
    expect(e.readUInt16LE(5)).toBe(1045);
    expect(e.toString('latin1', 7)).toBe('#28000GW_ERR_DB_USER_DENIED: no');
  });

  it('COM_CHANGE_USER after the handshake is stopped before its payload, wherever the bytes are split', () => {
    const query = packet(0, Buffer.concat([Buffer.from([0x03]), Buffer.from('select 1')]));
    const big = packet(0, Buffer.concat([Buffer.from([0x03]), Buffer.alloc(70_000, 0x11)]).subarray(0, 60_000));
    const change = packet(0, Buffer.concat([Buffer.from([0x11]), Buffer.from('root\0')]));
    const stream = Buffer.concat([query, big, change, query]);
    const stopAt = query.length + big.length + 4;
    for (let split = 0; split <= stream.length; split += split < stopAt - 20 ? 997 : 1) {
      const scanner = new MysqlCommandScanner();
      let forwarded = 0;
      let violation: string | undefined;
      for (const part of [stream.subarray(0, split), stream.subarray(split)]) {
        if (violation) break;
        const r = scanner.push(part);
        forwarded += r.forward;
        violation = r.violation;
      }
      expect(violation, `split at ${split}`).toContain('COM_CHANGE_USER');
      expect(forwarded, `split at ${split}`).toBe(stopAt);
    }
  });

  it('a payload byte 0x11 that is not a command (sequence id above 0) passes', () => {
    const scanner = new MysqlCommandScanner();
    const data = Buffer.concat([packet(0, Buffer.from([0x03, 0x41])), packet(1, Buffer.from([0x11, 0x11])), packet(2, Buffer.alloc(0))]);
    expect(scanner.push(data)).toEqual({ forward: data.length });
  });
});

function resp(...args: string[]): Buffer {
  return Buffer.from(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`);
}

/** Events of the whole stream, with offsets from the stream's start, fed in the given pieces. */
function scan(pieces: Buffer[]): RedisEvent[] {
  const scanner = new RedisCommandScanner();
  const out: RedisEvent[] = [];
  let base = 0;
  for (const p of pieces) {
    for (const e of scanner.push(p)) out.push({ ...e, at: e.at + base });
    base += p.length;
  }
  return out;
}

describe('Redis commands', () => {
  it('AUTH user, AUTH password (default), and ordinary commands, the same at every split', () => {
    const stream = Buffer.concat([resp('AUTH', 'alice', 'pw'), resp('GET', 'k'), resp('auth', 'secret'), Buffer.from('PING\r\n')]);
    const whole = scan([stream]);
    expect(whole.filter((e) => e.kind === 'ready')).toEqual([
      { kind: 'ready', at: resp('AUTH', 'alice', 'pw').length, name: 'auth', user: 'alice' },
      { kind: 'ready', at: expect.any(Number), name: 'get' },
      { kind: 'ready', at: expect.any(Number), name: 'auth', user: 'default' },
      { kind: 'ready', at: stream.length, name: 'ping' },
    ]);
    for (let i = 0; i <= stream.length; i++) expect(scan([stream.subarray(0, i), stream.subarray(i)]), `split at ${i}`).toEqual(whole);
    expect(scan([...stream].map((b) => Buffer.from([b])))).toEqual(whole);
  });

  it('reads a bulk string as the server does: exactly its length, the 2 bytes after it skipped unread', () => {
    // "$4\r\nauthXY": the server reads "auth" and skips "XY"; reading "authXY" would let AUTH mallory through unchecked.
    const trick = Buffer.from('*3\r\n$4\r\nauthXY$7\r\nmallory\r\n$2\r\npw\r\n');
    expect(scan([trick]).find((e) => e.kind === 'ready')).toEqual({ kind: 'ready', at: trick.length, name: 'auth', user: 'mallory' });
  });

  it('HELLO in the server order; RESET is the default user; a malformed AUTH names nobody', () => {
    expect(redisCommandUser('hello', ['3', 'AUTH', 'u', 'p', 'SETNAME', 'x'])).toBe('u');
    expect(redisCommandUser('hello', ['3', 'SETNAME', 'x', 'auth', 'u', 'p'])).toBe('u');
    expect(redisCommandUser('hello', ['3', 'AUTH', 'u'])).toBeUndefined();
    expect(redisCommandUser('hello', ['3'])).toBeUndefined();
    expect(redisCommandUser('hello', ['3', 'AUTH', 'u', 'p', 'BOGUS'])).toBeUndefined();
    expect(redisCommandUser('reset', [])).toBe('default');
    expect(redisCommandUser('auth', [])).toBeUndefined();
    expect(redisCommandUser('auth', ['a', 'b', 'c'])).toBeUndefined();
    expect(scan([resp('HELLO', '3', 'AUTH', 'bob', 'pw')]).at(-1)).toMatchObject({ name: 'hello', user: 'bob' });
  });

  it('a big value is counted through, never kept: the name is ready before the value arrives', () => {
    const scanner = new RedisCommandScanner();
    const head = Buffer.from(`*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$${64 * 1024 * 1024}\r\n`);
    expect(scanner.push(head)).toEqual([{ kind: 'start', at: 0 }, { kind: 'ready', at: 13, name: 'set' }]);
    const mb = Buffer.alloc(1024 * 1024, 0x61);
    for (let i = 0; i < 64; i++) expect(scanner.push(mb)).toEqual([]);
    expect(scanner.push(Buffer.from('\r\n'))).toEqual([]);
    expect(scanner.push(resp('AUTH', 'x', 'y')).at(-1)).toMatchObject({ name: 'auth', user: 'x' });
  });

  it('refuses what it cannot follow: oversized lengths, long length lines, non-bulk elements, quoted inline, an AUTH over the cap', () => {
    expect(scan([Buffer.from('*2\r\n$600000000\r\n')]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from('*99999999\r\n')]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from(`*1${'0'.repeat(40)}`)]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from('*1\r\n:5\r\n')]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from('*1\r\n$-1\r\n')]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from('"auth" mallory pw\r\n')]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from(`GET ${'k'.repeat(70 * 1024)}`)]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from(`*3\r\n$4\r\nAUTH\r\n$70000\r\n`)]).at(-1)?.kind).toBe('invalid');
    expect(scan([Buffer.from('AUTH bob pw\r\n')]).at(-1)).toEqual({ kind: 'ready', at: 13, name: 'auth', user: 'bob' });
    // A length line ended by a bare LF: refused outright (the server reads up to a CR; it refuses this too).
    expect(scan([Buffer.from('*3\n$4\nAUTH\n$7\nmallory\n$2\npw\n')]).at(-1)?.kind).toBe('invalid');
  });

  it('after invalid nothing more is read; garbage never throws', () => {
    const scanner = new RedisCommandScanner();
    expect(scanner.push(Buffer.from('*x\r\n')).at(-1)?.kind).toBe('invalid');
    expect(scanner.push(resp('AUTH', 'a', 'b'))).toEqual([]);
    for (let i = 0; i < 2000; i++) {
      const s = new RedisCommandScanner();
      expect(() => s.push(randomBytes(1 + (i % 100)))).not.toThrow();
    }
  });
});

describe('MongoDB messages', () => {
  const find = opMsg(7, { find: 'orders', filter: {}, $db: 'shop' });
  const sasl = opMsg(8, { saslStart: 1, mechanism: 'SCRAM-SHA-256', payload: scramFirst('alice'), $db: 'admin' });
  const scanAll = (pieces: Buffer[]) => {
    const scanner = new MongoCommandScanner();
    const out: MongoEvent[] = [];
    let base = 0;
    for (const p of pieces) {
      for (const e of scanner.push(p)) out.push({ ...e, at: e.at + base });
      base += p.length;
    }
    return out;
  };

  it('reads command, $db and the SCRAM user, the same at every split; a kind-1 section after the body is counted through', () => {
    const insert = opMsg(9, { insert: 'orders', $db: 'shop' }, { id: 'documents', docs: [{ a: 'x'.repeat(5000) }, { b: 2 }] });
    const stream = Buffer.concat([find, sasl, insert]);
    const whole = scanAll([stream]);
    expect(whole.filter((e) => e.kind === 'ready')).toEqual([
      { kind: 'ready', at: find.length, requestId: 7, op: 'msg', command: 'find', db: 'shop' },
      { kind: 'ready', at: find.length + sasl.length, requestId: 8, op: 'msg', command: 'saslstart', db: 'admin', user: 'alice' },
      { kind: 'ready', at: expect.any(Number), requestId: 9, op: 'msg', command: 'insert', db: 'shop' },
    ]);
    for (let i = 0; i <= find.length + sasl.length + 40; i++) expect(scanAll([stream.subarray(0, i), stream.subarray(i)]), `split at ${i}`).toEqual(whole);
  });

  it('users: SCRAM escapes, PLAIN, authenticate, and hello with speculativeAuthenticate', () => {
    expect(saslUser('SCRAM-SHA-1', scramFirst('a,b=c'))).toBe('a,b=c');
    expect(saslUser('PLAIN', Buffer.from('\0bob\0pw'))).toBe('bob');
    expect(saslUser('GSSAPI', Buffer.from('x'))).toBeUndefined();
    expect(readCommand(bson({ authenticate: 1, mechanism: 'MONGODB-X509', user: 'CN=carol', $db: '$external' }))).toEqual({ command: 'authenticate', db: '$external', user: 'CN=carol' });
    const hello = bson({ hello: 1, speculativeAuthenticate: { saslStart: 1, mechanism: 'SCRAM-SHA-256', payload: scramFirst('mallory'), db: 'admin' }, $db: 'admin' });
    expect(readCommand(hello)).toEqual({ command: 'hello', db: 'admin', user: 'mallory' });
  });

  it('refuses what it cannot check: other mechanisms, compression, body not first, legacy opcodes, OP_QUERY beyond the handshake, no $db', () => {
    const invalid = (b: Buffer) => scanAll([b]).at(-1)?.kind;
    expect(invalid(opMsg(1, { saslStart: 1, mechanism: 'GSSAPI', payload: Buffer.from('x'), $db: '$external' }))).toBe('invalid');
    expect(invalid(opMsg(1, { hello: 1, speculativeAuthenticate: { saslStart: 1, mechanism: 'MONGODB-AWS', payload: Buffer.from('x') }, $db: 'admin' }))).toBe('invalid');
    expect(invalid(frame(1, 2012, Buffer.alloc(30)))).toBe('invalid');
    expect(invalid(frame(1, 2002, Buffer.alloc(30)))).toBe('invalid');
    const sectionFirst = Buffer.from(find);
    sectionFirst[20] = 1;
    expect(invalid(sectionFirst)).toBe('invalid');
    expect(invalid(opMsg(1, { find: 'orders' }))).toBe('invalid');
    // A field read twice: the check and the server could each take another one.
    const twice = Buffer.concat([bson({ find: 'orders', $db: 'shop' }).subarray(0, -1), bson({ $db: 'admin' }).subarray(4)]);
    twice.writeInt32LE(twice.length, 0);
    expect(readCommand(twice)).toMatch(/\$db given twice/);
    expect(readCommand(bson({ saslStart: 1, mechanism: 'PLAIN', payload: Buffer.from('\0alice\0pw'), $db: 'admin' }))).toMatchObject({ user: 'alice' });
    const twoPayloads = Buffer.concat([bson({ saslStart: 1, mechanism: 'PLAIN', payload: Buffer.from('\0alice\0pw') }).subarray(0, -1), bson({ payload: Buffer.from('\0root\0pw'), $db: 'admin' }).subarray(4)]);
    twoPayloads.writeInt32LE(twoPayloads.length, 0);
    expect(typeof readCommand(twoPayloads)).toBe('string');
    expect(scanAll([opQuery(3, 'admin.$cmd', { isMaster: 1 })]).at(-1)).toMatchObject({ kind: 'ready', op: 'query', command: 'ismaster', db: 'admin' });
    expect(invalid(opQuery(3, 'shop.$cmd', { find: 'orders' }))).toBe('invalid');
  });

  it('lengths are checked before anything is waited for: a message or body announcing too much, a BSON length that lies', () => {
    const huge = Buffer.from(find);
    huge.writeInt32LE(0x7fffffff, 0);
    expect(scanAll([huge.subarray(0, 16)]).at(-1)?.kind).toBe('invalid');
    const body = Buffer.from(find);
    body.writeInt32LE(64 * 1024 * 1024, 21);
    expect(scanAll([body.subarray(0, 25)]).at(-1)?.kind).toBe('invalid');
    const lying = Buffer.from(find);
    lying.writeInt32LE(1000, 26 + 'find\0'.length); // the string length of "orders" says 1000
    expect(scanAll([lying]).at(-1)?.kind).toBe('invalid');
    expect(bsonElements(Buffer.from([5, 0, 0, 0, 1]))).toMatch(/does not fit/);
  });

  it('garbage never throws, and the error reply is a well-framed OP_MSG answering the request', () => {
    for (let i = 0; i < 3000; i++) {
      const b = randomBytes(1 + (i % 120));
      if (i % 2 === 0 && b.length >= 16) {
        b.writeInt32LE(b.length, 0);
        b.writeInt32LE(2013, 12);
      }
      expect(() => new MongoCommandScanner().push(b)).not.toThrow();
    }
    const reply = mongoErrorReply(42, 'msg', 'GW_ERR_DB_NAME_DENIED: no');
    expect(reply.readInt32LE(0)).toBe(reply.length);
    expect(reply.readInt32LE(8)).toBe(42);
    expect(reply.readInt32LE(12)).toBe(2013);
    expect(readCommand(reply.subarray(21))).toEqual({ command: 'ok' });
    expect(reply.toString('latin1')).toContain('GW_ERR_DB_NAME_DENIED');
  });
});
