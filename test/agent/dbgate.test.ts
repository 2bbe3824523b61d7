/**
 * The agent's database gate (src/agent/dbgate.ts) against hostile clients, with a scripted database on a real
 * socket: what reaches the database is exactly what the grant allows, and a refusal is the protocol's own error
 * carrying the gateway's code. The real-client paths (psql, mysql, redis-cli) are in test/e2e/dbrules.test.ts.
 */
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { gateDatabase, type GateResult } from '../../src/agent/dbgate.js';
import { pgErrorResponse } from '../../src/dbproto/postgres.js';
import { splice } from '../../src/stream/splice.js';
import type { DatabaseGrant } from '../../src/tunnel/protocol.js';
import { frame, opMsg, opQuery, scramFirst } from '../helpers/mongowire.js';
import { waitUntil } from '../helpers/wait.js';
import { pgStartup } from '../helpers/pgwire.js';

const ALICE: DatabaseGrant = { users: { allow: ['alice'], deny: [] }, names: { allow: ['shop'], deny: [] } };

const sockets: net.Socket[] = [];
const servers: net.Server[] = [];
afterEach(() => {
  for (const s of sockets.splice(0)) s.destroy();
  for (const s of servers.splice(0)) s.close();
});

/** Two connected TCP sockets. */
async function pair(): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer({ allowHalfOpen: true });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const a = net.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen: true });
  const b = await accepted;
  sockets.push(a, b);
  for (const s of [a, b]) s.on('error', () => undefined);
  return [a, b];
}

/** What a socket has received so far, and whether the far end ended (or it closed). */
function record(s: net.Socket) {
  const got: Buffer[] = [];
  let closed = false;
  s.on('data', (c: Buffer) => got.push(c));
  s.once('end', () => (closed = true));
  s.once('close', () => (closed = true));
  return { bytes: () => Buffer.concat(got), text: () => Buffer.concat(got).toString('latin1'), closed: () => closed };
}

/** A gate between a client and a database, each the test's end of a socket pair; the result is spliced like the agent does. */
async function gate(protocol: 'postgres' | 'mysql' | 'redis' | 'mongodb', grant: DatabaseGrant | undefined) {
  const [client, channel] = await pair();
  const [target, db] = await pair();
  const fromDb = record(client);
  const toDb = record(db);
  /** The gate's result once spliced, or its refusal (code). */
  const result: Promise<Partial<GateResult> & { code?: string }> = gateDatabase(channel, target, { protocol, grant, timeoutMs: 10_000 }).then(
    (r: GateResult) => {
      splice(r.client, target);
      return r;
    },
    (err: unknown) => err as Error & { code: string },
  );
  return { client, db, fromDb, toDb, result };
}


describe('PostgreSQL', () => {
  it('an allowed startup reaches the database byte for byte, with what the client pipelined after it', async () => {
    const g = await gate('postgres', ALICE);
    const startup = pgStartup([['user', 'alice'], ['database', 'shop']]);
    g.client.write(Buffer.concat([startup, Buffer.from('p-after')]));
    expect(await g.result).toMatchObject({ startup: { protocol: 'postgres', user: 'alice', database: 'shop' } });
    await waitUntil('the startup at the database', () => g.toDb.bytes().length === startup.length + 7);
    expect(g.toDb.bytes()).toEqual(Buffer.concat([startup, Buffer.from('p-after')]));
    g.db.write('R-reply');
    await waitUntil('the reply at the client', () => g.fromDb.text() === 'R-reply');
  });

  it('a database user the grant does not allow never reaches the database; the client reads FATAL 28000 with the code', async () => {
    const g = await gate('postgres', ALICE);
    g.client.write(pgStartup([['user', 'postgres'], ['database', 'shop']]));
    expect((await g.result).code).toBe('GW_ERR_DB_USER_DENIED');
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.text()).toContain('C28000\0');
    expect(g.fromDb.text()).toContain('GW_ERR_DB_USER_DENIED');
    await waitUntil('the database connection to be closed', () => g.toDb.closed(), 5_000);
    expect(g.toDb.bytes().length).toBe(0);
  });

  it('hostile: a user name of 9000 bytes with line breaks and escapes is refused with a short, quoted message', async () => {
    const g = await gate('postgres', ALICE);
    g.client.write(pgStartup([['user', `x\n\u001b[31mFATAL: fake\n${'y'.repeat(9000)}`], ['database', 'shop']]));
    expect((await g.result).code).toBe('GW_ERR_DB_USER_DENIED');
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.bytes().length).toBeLessThan(1000);
    expect(g.fromDb.text()).not.toContain('\n');
    expect(g.fromDb.text()).not.toContain('\u001b');
  });

  it('a user named twice (the server would read the last) is refused as a protocol violation', async () => {
    const g = await gate('postgres', ALICE);
    g.client.write(pgStartup([['user', 'alice'], ['database', 'shop'], ['user', 'postgres']]));
    expect((await g.result).code).toBe('GW_ERR_DB_PROTOCOL');
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.text()).toContain('C08P01\0');
    expect(g.toDb.bytes().length).toBe(0);
  });

  it('a dial without a grant (an older Proxy, or a forged request) is refused', async () => {
    const g = await gate('postgres', undefined);
    g.client.write(pgStartup([['user', 'alice'], ['database', 'shop']]));
    expect((await g.result).code).toBe('GW_ERR_DB_USER_DENIED');
    expect(g.toDb.bytes().length).toBe(0);
  });

  it("SSLRequest is declined with 'N' (the database never sees it); asking over and over is refused", async () => {
    const g = await gate('postgres', ALICE);
    const ssl = Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
    g.client.write(ssl);
    await waitUntil('the decline', () => g.fromDb.text() === 'N');
    g.client.write(Buffer.concat([ssl, ssl]));
    expect((await g.result).code).toBe('GW_ERR_DB_PROTOCOL');
    expect(g.toDb.bytes().length).toBe(0);
  });

  it('a startup announcing 1 GiB is refused at its length, without waiting', async () => {
    const g = await gate('postgres', ALICE);
    g.client.write(Buffer.from([0x40, 0, 0, 0]));
    expect((await g.result).code).toBe('GW_ERR_DB_PROTOCOL');
  });

  it('the ErrorResponse is well framed (psql reads it as FATAL)', () => {
    const e = pgErrorResponse('28000', 'x');
    expect(e.readUInt32BE(1)).toBe(e.length - 1);
  });
});

function packet(seq: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(4);
  h.writeUIntLE(payload.length, 0, 3);
  h[3] = seq;
  return Buffer.concat([h, payload]);
}

const GREETING = packet(
  0,
  Buffer.concat([Buffer.from([10]), Buffer.from('10.11.0-MariaDB\0'), Buffer.from([1, 0, 0, 0]), Buffer.alloc(8, 0x41), Buffer.alloc(1), Buffer.from([0x00, 0xaa]), Buffer.from([33, 2, 0, 0x1f, 0x00, 21]), Buffer.alloc(10), Buffer.alloc(13, 0x42), Buffer.from('mysql_native_password\0')]),
);

function response(user: string, database: string): Buffer {
  const head = Buffer.alloc(32);
  head.writeUInt32LE(0x200 | 0x8000 | 0x8, 0);
  return packet(1, Buffer.concat([head, Buffer.from(`${user}\0`), Buffer.from([20]), Buffer.alloc(20, 0x55), Buffer.from(`${database}\0`)]));
}

describe('MySQL', () => {
  it('the greeting goes to the client without CLIENT_SSL; an allowed response goes to the server', async () => {
    const g = await gate('mysql', ALICE);
    g.db.write(GREETING);
    await waitUntil('the greeting', () => g.fromDb.bytes().length === GREETING.length);
    const at = 4 + 1 + 16 + 4 + 8 + 1;
    expect(GREETING.readUInt16LE(at) & 0x800).toBe(0x800);
    expect(g.fromDb.bytes().readUInt16LE(at) & 0x800).toBe(0);
    const r = response('alice', 'shop');
    g.client.write(r);
    expect(await g.result).toMatchObject({ startup: { protocol: 'mysql', user: 'alice', database: 'shop' } });
    await waitUntil('the response at the server', () => g.toDb.bytes().length === r.length);
  });

  it('another database: ERR 1044 with the code and sequence id 2; the server never sees the response', async () => {
    const g = await gate('mysql', ALICE);
    g.db.write(GREETING);
    g.client.write(response('alice', 'mysql'));
    expect((await g.result).code).toBe('GW_ERR_DB_NAME_DENIED');
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    const err = g.fromDb.bytes().subarray(GREETING.length);
    expect(err[3]).toBe(2);
    expect(err.readUInt16LE(5)).toBe(1044);
    expect(err.toString('latin1')).toContain('GW_ERR_DB_NAME_DENIED');
    expect(g.toDb.bytes().length).toBe(0);
  });

  it('COM_CHANGE_USER to root after an allowed login: the session is closed, the server never gets its payload', async () => {
    const g = await gate('mysql', ALICE);
    g.db.write(GREETING);
    const r = response('alice', 'shop');
    const query = packet(0, Buffer.from('\x03select 1'));
    const change = packet(0, Buffer.concat([Buffer.from([0x11]), Buffer.from('root\0')]));
    g.client.write(r);
    await g.result;
    g.client.write(Buffer.concat([query, change, query]));
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.text()).toContain('GW_ERR_DB_USER_DENIED');
    await waitUntil('the database connection to be closed', () => g.toDb.closed(), 5_000);
    // The session is cut at the violation: what was before it may or may not have been written yet, never what follows.
    const allowed = Buffer.concat([r, query, change.subarray(0, 4)]);
    expect(allowed.subarray(0, g.toDb.bytes().length)).toEqual(g.toDb.bytes());
    expect(g.toDb.bytes().length).toBeGreaterThanOrEqual(r.length);
  });
});

const resp = (...args: string[]) => `*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;

describe('Redis', () => {
  it('AUTH as a user the grant does not allow: -NOPERM with the code, and the server never sees the AUTH', async () => {
    const g = await gate('redis', ALICE);
    g.client.write(resp('AUTH', 'admin', 'pw'));
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.text()).toMatch(/^-NOPERM GW_ERR_DB_USER_DENIED/);
    expect(g.toDb.bytes().length).toBe(0);
  });

  it('a command before any AUTH runs as "default": refused when the grant does not allow it', async () => {
    const g = await gate('redis', ALICE);
    g.client.write(resp('GET', 'k'));
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.text()).toContain('GW_ERR_DB_USER_DENIED');
    expect(g.toDb.bytes().length).toBe(0);
  });

  it('a failed first AUTH as an allowed user with a command pipelined after it: held until the reply, then refused (it would run as default)', async () => {
    const g = await gate('redis', ALICE);
    const auth = resp('AUTH', 'alice', 'wrong');
    g.client.write(auth + resp('GET', 'secret'));
    await waitUntil('the AUTH at the server', () => g.toDb.bytes().length >= auth.length);
    expect(g.toDb.text()).toBe(auth);
    g.db.write('-WRONGPASS invalid username-password pair\r\n');
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.text()).toContain('GW_ERR_DB_USER_DENIED');
    expect(g.toDb.text()).toBe(auth);
  });

  it('a successful first AUTH as an allowed user: the pipelined commands follow', async () => {
    const g = await gate('redis', ALICE);
    const auth = resp('AUTH', 'alice', 'right');
    g.client.write(auth + resp('GET', 'k'));
    await waitUntil('the AUTH at the server', () => g.toDb.bytes().length >= auth.length);
    g.db.write('+OK\r\n');
    await waitUntil('the GET at the server', () => g.toDb.text() === auth + resp('GET', 'k'));
    const result = await g.result;
    expect(result.startup?.user).toBe('alice');
  });

  it('a later AUTH to another user, split across writes, is stopped before the server sees any of it', async () => {
    const grant: DatabaseGrant = { users: { allow: ['default'], deny: [] }, names: { allow: [], deny: [] } };
    const g = await gate('redis', grant);
    g.client.write(resp('PING'));
    await waitUntil('the PING', () => g.toDb.text() === resp('PING'));
    const auth = resp('AUTH', 'admin', 'pw');
    g.client.write(auth.slice(0, 9));
    g.client.write(auth.slice(9));
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.toDb.text()).toBe(resp('PING'));
  });
});

describe('MongoDB', () => {
  it('the handshake and an authentication as an allowed user pass; a command on an allowed database passes', async () => {
    const g = await gate('mongodb', ALICE);
    const msgs = [
      opQuery(1, 'admin.$cmd', { isMaster: 1 }),
      opMsg(2, { saslStart: 1, mechanism: 'SCRAM-SHA-256', payload: scramFirst('alice'), $db: 'admin' }),
      opMsg(3, { find: 'orders', $db: 'shop' }, { id: 'x', docs: [{ a: 1 }] }),
    ];
    g.client.write(Buffer.concat(msgs));
    await waitUntil('every message at the server', () => g.toDb.bytes().length === Buffer.concat(msgs).length, 5_000);
    expect(g.toDb.bytes()).toEqual(Buffer.concat(msgs));
    expect((await g.result).startup).toEqual({ protocol: 'mongodb', user: 'alice', database: 'shop' });
  });

  it('a command on another database: an error reply to that request with the code; the server never sees it', async () => {
    const g = await gate('mongodb', ALICE);
    const ok = opMsg(1, { ping: 1, $db: 'admin' });
    g.client.write(Buffer.concat([ok, opMsg(77, { find: 'users', $db: 'admin' }), opMsg(78, { find: 'orders', $db: 'shop' })]));
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    const reply = g.fromDb.bytes();
    expect(reply.readInt32LE(8)).toBe(77);
    expect(reply.toString('latin1')).toContain('GW_ERR_DB_NAME_DENIED');
    // Cut at the refusal: what came before it may or may not have been written yet, never the refused message.
    expect(ok.subarray(0, g.toDb.bytes().length)).toEqual(g.toDb.bytes());
  });

  it("hostile: mallory's SCRAM inside hello's speculativeAuthenticate is refused before the server sees the hello", async () => {
    const g = await gate('mongodb', ALICE);
    g.client.write(opMsg(5, { hello: 1, speculativeAuthenticate: { saslStart: 1, mechanism: 'SCRAM-SHA-256', payload: scramFirst('mallory'), db: 'admin' }, $db: 'admin' }));
    await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
    expect(g.fromDb.text()).toContain('GW_ERR_DB_USER_DENIED');
    expect(g.toDb.bytes().length).toBe(0);
  });

  it('hostile: TLS straight to the database (a ClientHello) and OP_COMPRESSED are refused', async () => {
    for (const bytes of [Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, ...Array(20).fill(7)]), frame(9, 2012, Buffer.alloc(40))]) {
      const g = await gate('mongodb', ALICE);
      g.client.write(bytes);
      await waitUntil('the client to be closed', () => g.fromDb.closed(), 5_000);
      expect(g.toDb.bytes().length).toBe(0);
    }
  });
});
