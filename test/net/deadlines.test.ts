/**
 * src/net/deadlines.ts, source.ts, listen.ts and http.ts in-process: the pure helpers, and real loopback
 * sockets against guarded listeners (phase deadlines, caps per listener and per source, the half-close
 * linger, the HTTP phases of a server that is handed its connections).
 *
 * No test asserts a timing: a deadline is shown by the connection being closed (within a generous bound) and by
 * the counter of the phase that closed it.
 */
import http from 'node:http';
import net from 'node:net';
import { PassThrough } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/log.js';
import { ConnectionLimits, connectionOf, type LimitSettings, type Phase } from '../../src/net/deadlines.js';
import { guardHttpServer } from '../../src/net/http.js';
import { closeServer, guardedServer, listenOn } from '../../src/net/listen.js';
import { connectionBudget, parseOpenFileLimit, sourceKey } from '../../src/net/source.js';

const silent = createLogger({ level: 'silent' });
const BOUND_MS = 10_000;

const SETTINGS: LimitSettings = {
  tlsHandshakeMs: 300,
  headerMs: 300,
  requestMs: 300,
  idleMs: 30_000,
  sshHandshakeMs: 300,
  halfCloseLingerMs: 300,
  maxConnections: 100,
  maxConnectionsPerSource: 100,
};

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('sourceKey', () => {
  it.each([
    ['192.0.2.7', '192.0.2.7'],
    ['::ffff:192.0.2.7', '192.0.2.7'],
    ['::FFFF:10.0.0.1', '10.0.0.1'],
    ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2::/64'],
    ['2001:db8:1:2::9', '2001:db8:1:2::/64'],
    ['2001:0DB8:0001:0002:ffff::1', '2001:db8:1:2::/64'],
    ['::1', '0:0:0:0::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['64:ff9b::192.0.2.1', '64:ff9b:0:0::/64'],
    ['', 'unknown'],
  ])('%s counts as %s', (address, key) => {
    expect(sourceKey(address)).toBe(key);
  });

  it('puts two addresses of one /64 under one key and of two /64s under two', () => {
    expect(sourceKey('2001:db8::1')).toBe(sourceKey('2001:db8::ffff:1'));
    expect(sourceKey('2001:db8:0:1::1')).not.toBe(sourceKey('2001:db8:0:2::1'));
  });
});

describe('parseOpenFileLimit', () => {
  const limits = (soft: string, hard: string) =>
    `Limit                     Soft Limit           Hard Limit           Units\nMax processes             63459                63459                processes\nMax open files            ${soft}                 ${hard}                 files\n`;

  it('reads the soft limit', () => {
    expect(parseOpenFileLimit(limits('256', '4096'))).toBe(256);
  });

  it('says nothing for an unlimited or missing line', () => {
    expect(parseOpenFileLimit(limits('unlimited', 'unlimited'))).toBeUndefined();
    expect(parseOpenFileLimit('Max processes 1 1 processes\n')).toBeUndefined();
  });
});

describe('connectionBudget', () => {
  it('gives each listener a quarter of the descriptors left after the reserve, at least one', () => {
    expect(connectionBudget(128 + 400)).toBe(100);
    expect(connectionBudget(256)).toBe(32);
    expect(connectionBudget(100)).toBe(1);
    expect(connectionBudget(undefined)).toBeUndefined();
  });
});

describe('ConnectionLimits', () => {
  it('warns when a written cap is more than the open-file limit can hold, and uses it as written', () => {
    const lines: string[] = [];
    const log = createLogger({ level: 'warn', destination: { write: (l: string) => void lines.push(l) } });
    const limits = new ConnectionLimits({ ...SETTINGS, maxConnections: 1_000 }, { openFiles: 256, log });
    expect(limits.settings.maxConnections).toBe(1_000);
    expect(lines.map((l) => (JSON.parse(l) as { fits?: number }).fits)).toEqual([32]);
    lines.length = 0;
    void new ConnectionLimits({ ...SETTINGS, maxConnections: 32 }, { openFiles: 256, log });
    expect(lines).toEqual([]);
  });
});

// --- guarded listeners on loopback ---------------------------------------------------------------------------

async function listener(settings: Partial<LimitSettings>, onSocket: (socket: net.Socket) => void, sourceAtAccept = true) {
  const limits = new ConnectionLimits({ ...SETTINGS, ...settings }, { openFiles: null, log: silent });
  const guard = limits.listener('test', { sourceAtAccept });
  const server = guardedServer(guard, (socket) => onSocket(socket));
  const addr = await listenOn(server, { host: '127.0.0.1', port: 0 }, 'test');
  cleanups.push(() => closeServer(server));
  return { limits, port: Number(addr.split(':').pop()), stats: () => limits.stats().test! };
}

/**
 * Connects from `from`; resolves once connected (or refused: a reset may come before 'connect'), with a promise
 * of its close (true: closed within the bound).
 */
function connect(port: number, from = '127.0.0.1'): Promise<{ socket: net.Socket; closed: Promise<boolean> }> {
  return new Promise((resolve) => {
    const socket = net.connect({ port, host: '127.0.0.1', localAddress: from });
    cleanups.push(() => socket.destroy());
    socket.on('error', () => undefined);
    const closed = new Promise<boolean>((r) => {
      const t = setTimeout(() => r(false), BOUND_MS);
      socket.once('close', () => {
        clearTimeout(t);
        r(true);
      });
    });
    socket.resume();
    socket.once('connect', () => resolve({ socket, closed }));
    socket.once('close', () => resolve({ socket, closed }));
  });
}

const until = async (check: () => boolean): Promise<boolean> => {
  const end = Date.now() + BOUND_MS;
  while (!check()) {
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
};

describe('phases', () => {
  it('closes a connection whose phase deadline passes, counts it, and frees its place', async () => {
    const l = await listener({}, (socket) => connectionOf(socket).enter('ssh-handshake', 200));
    const c = await connect(l.port);
    expect(await c.closed).toBe(true);
    expect(l.stats().deadlines).toEqual({ 'ssh-handshake': 1 });
    expect(await until(() => l.stats().open === 0)).toBe(true);
  });

  it('a phase that is left, or whose `unless` holds, closes nothing', async () => {
    const l = await listener({}, (socket) => {
      const conn = connectionOf(socket);
      conn.enter('http-request', 100, { unless: () => true });
      setTimeout(() => {
        conn.enter('detect', 100);
        conn.leave('detect');
      }, 150);
    });
    const c = await connect(l.port);
    await new Promise((r) => setTimeout(r, 500));
    expect(c.socket.destroyed).toBe(false);
    expect(l.stats().deadlines).toEqual({});
  });
});

describe('caps', () => {
  it('refuses connections over the per-source cap, counts and logs them, and takes another source', async () => {
    const l = await listener({ maxConnectionsPerSource: 2 }, () => undefined);
    const a = await connect(l.port, '127.0.0.1');
    const b = await connect(l.port, '127.0.0.1');
    const c = await connect(l.port, '127.0.0.1');
    expect(await c.closed).toBe(true);
    const other = await connect(l.port, '127.0.0.2');
    expect(await until(() => l.stats().open === 3)).toBe(true);
    expect(l.stats().refused).toEqual({ total: 0, per_source: 1 });
    expect([a.socket.destroyed, b.socket.destroyed, other.socket.destroyed]).toEqual([false, false, false]);
    // A place freed is a place given back.
    a.socket.destroy();
    expect(await until(() => l.stats().open === 2)).toBe(true);
    const d = await connect(l.port, '127.0.0.1');
    await new Promise((r) => setTimeout(r, 200));
    expect(d.socket.destroyed).toBe(false);
  });

  it('refuses connections over the listener total', async () => {
    const l = await listener({ maxConnections: 2 }, () => undefined);
    await connect(l.port, '127.0.0.1');
    await connect(l.port, '127.0.0.2');
    const third = await connect(l.port, '127.0.0.3');
    expect(await third.closed).toBe(true);
    expect(l.stats().refused).toEqual({ total: 1, per_source: 0 });
  });

  it('a stream adopted from a connection upgrade counts under the same total, and is refused and destroyed over it', () => {
    const limits = new ConnectionLimits({ ...SETTINGS, maxConnections: 2 }, { openFiles: null, log: silent });
    const guard = limits.listener('upgrade');
    const streams = [new PassThrough(), new PassThrough(), new PassThrough()];
    expect(guard.adopt(streams[0]!)).toBeDefined();
    expect(guard.adopt(streams[1]!)).toBeDefined();
    expect(guard.hasRoom()).toBe(false);
    expect(guard.adopt(streams[2]!)).toBeUndefined();
    expect(streams[2]!.destroyed).toBe(true);
    expect(limits.stats().upgrade).toMatchObject({ open: 2, refused: { total: 1, per_source: 0 } });
  });

  it('with the source learned later (a PROXY header), counts it when attributed', async () => {
    const results: boolean[] = [];
    const l = await listener(
      { maxConnectionsPerSource: 1 },
      (socket) => results.push(connectionOf(socket).attribute('198.51.100.1')),
      false,
    );
    await connect(l.port);
    const second = await connect(l.port);
    expect(await second.closed).toBe(true);
    expect(results).toEqual([true, false]);
    expect(l.stats().refused.per_source).toBe(1);
  });
});

describe('half-close', () => {
  it('closes a connection the peer half-closed once nothing moves for the linger', async () => {
    const l = await listener({}, () => undefined); // a handler that never ends its side
    const c = await connect(l.port);
    c.socket.end();
    expect(await c.closed).toBe(true);
    expect(l.stats().deadlines).toEqual({ 'half-close': 1 });
  });

  it('keeps a half-closed connection while the answer is still being written', async () => {
    const l = await listener({ halfCloseLingerMs: 300 }, (socket) => {
      socket.once('end', () => {
        let n = 0;
        const t = setInterval(() => {
          socket.write('x');
          if (++n === 8) {
            clearInterval(t);
            socket.end();
          }
        }, 100);
      });
    });
    const c = await connect(l.port);
    let got = 0;
    c.socket.on('data', (d: Buffer) => (got += d.length));
    c.socket.end();
    expect(await c.closed).toBe(true);
    expect(got).toBe(8);
    expect(l.stats().deadlines).toEqual({});
  });
});

describe('guardHttpServer', () => {
  async function httpListener(settings: Partial<LimitSettings>) {
    const server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => res.end('ok'));
    });
    let accept: (s: net.Socket) => void = () => undefined;
    const l = await listener(settings, (socket) => accept(socket));
    accept = guardHttpServer(server, { headerMs: settings.headerMs ?? 300, requestMs: settings.requestMs ?? 300, idleMs: settings.idleMs ?? 30_000 });
    return l;
  }

  const phaseOf = (stats: ReturnType<Awaited<ReturnType<typeof httpListener>>['stats']>) => Object.keys(stats.deadlines) as Phase[];

  it('closes a connection that sends nothing, and one that trickles its headers', async () => {
    const l = await httpListener({});
    const silentClient = await connect(l.port);
    expect(await silentClient.closed).toBe(true);
    const slow = await connect(l.port);
    slow.socket.write('GET / HTTP/1.1\r\nHost: x\r\n');
    const t = setInterval(() => slow.socket.write('X-A: b\r\n'), 50);
    expect(await slow.closed).toBe(true);
    clearInterval(t);
    expect(l.stats().deadlines).toEqual({ 'http-headers': 2 });
  });

  it('closes a request whose body trickles', async () => {
    const l = await httpListener({ headerMs: 5_000 });
    const c = await connect(l.port);
    c.socket.write('POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc');
    const t = setInterval(() => c.socket.write('d'), 50);
    expect(await c.closed).toBe(true);
    clearInterval(t);
    expect(phaseOf(l.stats())).toEqual(['http-request']);
  });

  it('answers prompt requests on a kept-alive connection, each with a fresh head deadline', async () => {
    const l = await httpListener({ headerMs: 400 });
    const c = await connect(l.port);
    let text = '';
    c.socket.on('data', (d: Buffer) => (text += d.toString()));
    for (let i = 0; i < 3; i++) {
      c.socket.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
      await until(() => text.split('HTTP/1.1 200').length - 1 === i + 1);
      await new Promise((r) => setTimeout(r, 250)); // under the deadline each time, over it in total
    }
    expect(text.split('HTTP/1.1 200').length - 1).toBe(3);
    expect(await c.closed).toBe(true); // and the idle connection is then closed by the head deadline
    expect(l.stats().deadlines).toEqual({ 'http-headers': 1 });
  });
});
