/**
 * Issue 11, "Hardening": a deadline on every phase of every connection, on every listener, shown against the
 * real daemon. Each test opens hostile connections (an idle TLS session, headers or a body sent a byte at a
 * time, a TLS handshake left unfinished, an SSH version line followed by silence or by a close) and shows
 *
 *   - the Proxy closes them (within a generous bound; no timing is asserted),
 *   - the deadline of the expected phase is what closed them (the daemon's debug line names the phase),
 *   - the daemon's open descriptors (/proc/<pid>/fd) come back to their count before the test, and no socket of
 *     the listener is left in CLOSE-WAIT (ss).
 *
 * Deadlines are configured at 1 s; the bound is 15 s. Before the fix every one of these connections stayed open
 * (the one port handed them to a web server that never armed Node's header timer, and ssh2 never ended a
 * socket its client had half-closed).
 */
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import { Duplex } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { separateListenLines } from '../helpers/listeners.js';

const BOUND_MS = 15_000;

const LIMITS = [
  '  limits:',
  '    tls_handshake_timeout: 1s',
  '    header_timeout: 1s',
  '    request_timeout: 1s',
  '    idle_timeout: 30s',
  '    ssh_handshake_timeout: 1s',
  '    half_close_linger: 1s',
];

function gatewayYaml(mode: 'multiplex' | 'separate'): string {
  return [
    'gateway:',
    `  nodename: deadlines-${mode}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: debug }',
    ...LIMITS,
    'auth_service:',
    '  cluster_name: deadlines.example',
    '  listen_addr: 127.0.0.1:0',
    `  proxy_listener_mode: ${mode}`,
    'proxy_service:',
    '  web_listen_addr: 127.0.0.1:0',
    '  detect_timeout: 1s',
    ...(mode === 'separate' ? separateListenLines('127.0.0.1') : []),
    '',
  ].join('\n');
}

// --- observing the daemon ------------------------------------------------------------------------------------------

const openFds = (gw: RunningGateway): number => readdirSync(`/proc/${gw.process.pid}/fd`).length;

/** Polls until the daemon holds no more descriptors than `baseline`; returns the last count seen. */
async function fdsBackTo(gw: RunningGateway, baseline: number): Promise<number> {
  const end = Date.now() + BOUND_MS;
  let n = openFds(gw);
  while (n > baseline && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100));
    n = openFds(gw);
  }
  return n;
}

/** Sockets of the daemon's listener on `port` in CLOSE-WAIT (the peer closed; the daemon never did). */
function closeWait(port: number): number {
  const r = spawnSync('ss', ['-Htan', 'state', 'close-wait', `( sport = :${port} )`], { encoding: 'utf8' });
  return r.stdout.split('\n').filter((l) => l.trim() !== '').length;
}

/** How many "deadline passed" lines name this phase. */
const deadlineLines = (gw: RunningGateway, phase: string): number =>
  gw.logs().split('\n').filter((l) => l.includes('"connection closed: deadline passed"') && l.includes(`"phase":"${phase}"`)).length;

async function linesGrow(gw: RunningGateway, phase: string, before: number, by: number): Promise<number> {
  const end = Date.now() + BOUND_MS;
  while (deadlineLines(gw, phase) < before + by && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
  return deadlineLines(gw, phase) - before;
}

const portOf = (addr: string): number => Number(addr.split(':').pop());

// --- hostile clients ---------------------------------------------------------------------------------------------

interface Held {
  socket: net.Socket;
  /** true once the daemon closed it (within the bound). */
  closed: Promise<boolean>;
}

function watchClose(socket: net.Socket): Promise<boolean> {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), BOUND_MS);
    socket.once('close', () => {
      clearTimeout(t);
      resolve(true);
    });
  });
}

const held: net.Socket[] = [];
function hold(socket: net.Socket): Held {
  held.push(socket);
  socket.on('error', () => undefined);
  socket.resume();
  return { socket, closed: watchClose(socket) };
}

/** A TLS session that completes its handshake; resolves once it has. */
function tlsSession(port: number, alpn?: string[]): Promise<Held> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', rejectUnauthorized: false, ...(alpn ? { ALPNProtocols: alpn } : {}) });
    const h = hold(s);
    s.once('secureConnect', () => resolve(h));
    s.once('error', reject);
  });
}

/** A raw TCP connection; resolves once connected. */
function tcp(port: number): Promise<Held> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port });
    const h = hold(s);
    s.once('connect', () => resolve(h));
    s.once('error', reject);
  });
}

/** The bytes of a real ClientHello (Node's own TLS client, captured before it reaches any network). */
function clientHello(): Promise<Buffer> {
  return new Promise((resolve) => {
    const sink = new Duplex({
      read() {},
      write(chunk: Buffer, _enc, cb) {
        resolve(chunk);
        cb();
      },
    });
    const t = tls.connect({ socket: sink, servername: 'localhost', rejectUnauthorized: false });
    t.on('error', () => undefined);
    setTimeout(() => t.destroy(), 1_000).unref();
  });
}

/** Writes `text` a few bytes at a time, every 200 ms, until the socket closes. */
function trickle(socket: net.Socket, text: string): void {
  let at = 0;
  const t = setInterval(() => {
    if (socket.destroyed || at >= text.length) return clearInterval(t);
    socket.write(text.slice(at, at + 2));
    at += 2;
  }, 200);
}

const SLOW_HEAD = `GET /webapi/ping HTTP/1.1\r\nHost: localhost\r\n${'X-Slow: ' + 'x'.repeat(400)}\r\n\r\n`;
const slowBody = () => [`POST /webapi/login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{"username":`, ' '.repeat(3980)] as const;

async function ping(port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    https
      .get({ host: '127.0.0.1', port, path: '/webapi/ping', rejectUnauthorized: false, servername: 'localhost', agent: false }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      })
      .on('error', reject);
  });
}

afterAll(() => {
  for (const s of held) s.destroy();
});

// --- the scenarios, per listener ---------------------------------------------------------------------------------

/**
 * The checks every listener gets: run `open` (which opens hostile connections and returns them), expect all to be
 * closed, `phase` to have closed `count` of them, the descriptors back to the baseline and no CLOSE-WAIT.
 */
async function expectClosedBy(gw: RunningGateway, port: number, phase: string | undefined, open: () => Promise<Held[]>): Promise<void> {
  const baseline = openFds(gw);
  const before = phase ? deadlineLines(gw, phase) : 0;
  const conns = await open();
  expect(await Promise.all(conns.map((c) => c.closed))).toEqual(conns.map(() => true));
  if (phase) expect(await linesGrow(gw, phase, before, conns.length)).toBeGreaterThanOrEqual(conns.length);
  expect(await fdsBackTo(gw, baseline)).toBeLessThanOrEqual(baseline);
  expect(closeWait(port)).toBe(0);
}

const times = <T>(n: number, f: () => Promise<T>): Promise<T[]> => Promise.all(Array.from({ length: n }, f));

describe('one port (TLS routing): after the multiplexer hands a connection on', () => {
  let gw: RunningGateway;
  let port: number;

  beforeAll(async () => {
    gw = await startGateway(gatewayYaml('multiplex'));
    port = portOf(gw.addresses.web!);
    expect(await ping(port)).toBe(200); // warm: what the first request loads is not counted as a leak
  });
  afterAll(async () => {
    await gw?.stop();
  });

  it('an idle TLS session routed to the web is closed at the header deadline', async () => {
    await expectClosedBy(gw, port, 'http-headers', () => times(10, () => tlsSession(port)));
  });

  it('headers sent a few bytes at a time are closed at the header deadline', async () => {
    await expectClosedBy(gw, port, 'http-headers', () =>
      times(5, async () => {
        const h = await tlsSession(port, ['http/1.1']);
        trickle(h.socket, SLOW_HEAD);
        return h;
      }),
    );
  });

  it('a body sent a few bytes at a time is closed at the request deadline', async () => {
    await expectClosedBy(gw, port, 'http-request', () =>
      times(5, async () => {
        const h = await tlsSession(port);
        const [head, body] = slowBody();
        h.socket.write(head);
        trickle(h.socket, body);
        return h;
      }),
    );
  });

  it('a TLS handshake left unfinished after the ClientHello is closed at the handshake deadline', async () => {
    const hello = await clientHello();
    await expectClosedBy(gw, port, 'tls-handshake', () =>
      times(5, async () => {
        const h = await tcp(port);
        h.socket.write(hello);
        return h;
      }),
    );
  });

  it('plain HTTP whose headers trickle is closed at the header deadline', async () => {
    await expectClosedBy(gw, port, 'http-headers', () =>
      times(3, async () => {
        const h = await tcp(port);
        trickle(h.socket, SLOW_HEAD);
        return h;
      }),
    );
  });

  it('SSH on the one port: a version line and a close leave nothing behind', async () => {
    await expectClosedBy(gw, port, undefined, () =>
      times(20, async () => {
        const h = await tcp(port);
        h.socket.end('SSH-2.0-x\r\n');
        return h;
      }),
    );
  });

  it('SSH on the one port: a version line and silence are closed at the SSH handshake deadline', async () => {
    await expectClosedBy(gw, port, 'ssh-handshake', () =>
      times(5, async () => {
        const h = await tcp(port);
        h.socket.write('SSH-2.0-x\r\n');
        return h;
      }),
    );
  });

  it('still serves an ordinary request', async () => {
    expect(await ping(port)).toBe(200);
  });
});

describe('separate listeners and the Auth API', () => {
  let gw: RunningGateway;

  beforeAll(async () => {
    gw = await startGateway(gatewayYaml('separate'));
    expect(await ping(portOf(gw.addresses.web!))).toBe(200);
  });
  afterAll(async () => {
    await gw?.stop();
  });

  it('web port: an idle TLS session and trickled headers are closed at the header deadline', async () => {
    const port = portOf(gw.addresses.web!);
    await expectClosedBy(gw, port, 'http-headers', async () => [
      ...(await times(5, () => tlsSession(port))),
      ...(await times(5, async () => {
        const h = await tlsSession(port);
        trickle(h.socket, SLOW_HEAD);
        return h;
      })),
    ]);
  });

  it.each([
    ['tunnel', 'proxy_tunnel'],
    ['SSH', 'proxy_ssh'],
  ])('%s port: 20 clients that send a version line and close leave no CLOSE-WAIT and no descriptor', async (_name, key) => {
    const port = portOf(gw.addresses[key]!);
    await expectClosedBy(gw, port, undefined, () =>
      times(20, async () => {
        const h = await tcp(port);
        h.socket.end('SSH-2.0-x\r\n');
        return h;
      }),
    );
  });

  it.each([
    ['tunnel', 'proxy_tunnel'],
    ['SSH', 'proxy_ssh'],
  ])('%s port: a version line and silence are closed at the SSH handshake deadline', async (_name, key) => {
    const port = portOf(gw.addresses[key]!);
    await expectClosedBy(gw, port, 'ssh-handshake', () =>
      times(5, async () => {
        const h = await tcp(port);
        h.socket.write('SSH-2.0-x\r\n');
        return h;
      }),
    );
  });

  it('Auth API: an idle TLS session, trickled headers and a trickled body are closed by their deadlines', async () => {
    const port = portOf(gw.addresses.auth!);
    await expectClosedBy(gw, port, 'http-headers', async () => [
      ...(await times(3, () => tlsSession(port))),
      ...(await times(3, async () => {
        const h = await tlsSession(port);
        trickle(h.socket, SLOW_HEAD);
        return h;
      })),
    ]);
    await expectClosedBy(gw, port, 'http-request', () =>
      times(3, async () => {
        const h = await tlsSession(port);
        const [head, body] = slowBody();
        h.socket.write(head);
        trickle(h.socket, body);
        return h;
      }),
    );
  });

  it('Auth API: a TLS handshake left unfinished is closed at the handshake deadline', async () => {
    const port = portOf(gw.addresses.auth!);
    const hello = await clientHello();
    await expectClosedBy(gw, port, 'tls-handshake', () =>
      times(3, async () => {
        const h = await tcp(port);
        h.socket.write(hello);
        return h;
      }),
    );
  });
});
