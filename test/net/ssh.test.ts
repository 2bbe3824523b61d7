/**
 * src/net/ssh.ts in-process: an SshEndpoint behind a guarded loopback listener, driven by raw sockets (a version
 * line and nothing else, or a version line and a FIN) and by a real ssh2 client. No timing is asserted: what
 * closed a connection is read from the listener's counters.
 */
import { generateKeyPair, sshPrivateKeyPem } from '../../src/auth/pki.js';
import net from 'node:net';
import ssh2 from 'ssh2';
import type { Connection } from 'ssh2';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/log.js';
import { ConnectionLimits, type LimitSettings } from '../../src/net/deadlines.js';
import { closeServer, guardedServer, listenOn } from '../../src/net/listen.js';
import { SshEndpoint } from '../../src/net/ssh.js';

const BOUND_MS = 10_000;
// The product's own host keys (ECDSA P-256, as the Proxy makes them): ssh2's ed25519 generator gives a key its
// own parser refuses about once in 200 runs.
const hostKey = sshPrivateKeyPem(generateKeyPair().privateKeyPem);

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function endpoint(settings: Partial<LimitSettings> = {}) {
  const limits = new ConnectionLimits(
    { tlsHandshakeMs: 300, headerMs: 300, requestMs: 300, idleMs: 300, sshHandshakeMs: 300, halfCloseLingerMs: 30_000, maxConnections: 100, maxConnectionsPerSource: 100, ...settings },
    { openFiles: null, log: createLogger({ level: 'silent' }) },
  );
  const metas: string[] = [];
  const ssh: SshEndpoint<string> = new SshEndpoint<string>({
    hostKeys: [hostKey],
    ident: 'test',
    deadlines: limits.settings,
    onConnection(conn: Connection, meta) {
      metas.push(meta);
      conn.on('authentication', (ctx) => ctx.accept());
      conn.on('ready', () => {
        conn.on('session', (accept) => {
          const session = accept();
          ssh.channelOpened(conn, session);
          session.on('exec', (acceptExec) => acceptExec()); // a channel that stays open, silent
        });
      });
    },
  });
  const server = guardedServer(limits.listener('ssh'), (socket) => ssh.inject(socket, `meta-${socket.remotePort}`));
  const port = Number((await listenOn(server, { host: '127.0.0.1', port: 0 }, 'test')).split(':').pop());
  cleanups.push(() => closeServer(server));
  return { port, metas, stats: () => limits.stats().ssh! };
}

/** A raw TCP client; closed: true when the server closed it within the bound. */
function raw(port: number): { socket: net.Socket; closed: Promise<boolean> } {
  const socket = net.connect({ port, host: '127.0.0.1' });
  cleanups.push(() => socket.destroy());
  socket.on('error', () => undefined);
  socket.resume();
  const closed = new Promise<boolean>((resolve) => {
    const t = setTimeout(() => resolve(false), BOUND_MS);
    socket.once('close', () => {
      clearTimeout(t);
      resolve(true);
    });
  });
  return { socket, closed };
}

function client(port: number): Promise<ssh2.Client> {
  return new Promise((resolve, reject) => {
    const c = new ssh2.Client();
    cleanups.push(() => c.end());
    c.on('error', reject);
    c.on('ready', () => resolve(c));
    c.connect({ host: '127.0.0.1', port, username: 'u', password: 'p', hostVerifier: () => true });
  });
}

const closedWithin = (c: ssh2.Client): Promise<boolean> =>
  new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), BOUND_MS);
    c.once('close', () => {
      clearTimeout(t);
      resolve(true);
    });
  });

describe('SshEndpoint', () => {
  it('ends its side when a client sends its version line and closes: nothing stays half-open', async () => {
    const e = await endpoint({ sshHandshakeMs: 60_000 });
    const clients = Array.from({ length: 20 }, () => raw(e.port));
    for (const c of clients) c.socket.end('SSH-2.0-x\r\n');
    expect(await Promise.all(clients.map((c) => c.closed))).toEqual(new Array(20).fill(true));
    await expect.poll(() => e.stats().open, { timeout: BOUND_MS }).toBe(0);
    // Closed by the end of SSH, not by a deadline or the half-close linger.
    expect(e.stats().deadlines).toEqual({});
    expect(e.metas.length).toBe(20);
  });

  it('closes a client that sends its version line and stalls, at the handshake deadline', async () => {
    const e = await endpoint();
    const c = raw(e.port);
    c.socket.write('SSH-2.0-x\r\n');
    expect(await c.closed).toBe(true);
    expect(e.stats().deadlines).toEqual({ 'ssh-handshake': 1 });
  });

  it('closes an authenticated connection with no channel open, at the idle deadline', async () => {
    const e = await endpoint();
    const c = await client(e.port);
    expect(await closedWithin(c)).toBe(true);
    expect(e.stats().deadlines).toEqual({ 'ssh-idle': 1 });
  });

  it('keeps an authenticated connection while a channel is open, and closes it once idle again', async () => {
    const e = await endpoint();
    const c = await client(e.port);
    const closed = closedWithin(c);
    const channel = await new Promise<ssh2.ClientChannel>((resolve, reject) => c.exec('true', (err, ch) => (err ? reject(err) : resolve(ch))).on('error', reject));
    await new Promise((r) => setTimeout(r, 1_000)); // more than three idle deadlines with the channel open
    expect(e.stats().deadlines).toEqual({});
    channel.close();
    expect(await closed).toBe(true);
    expect(e.stats().deadlines).toEqual({ 'ssh-idle': 1 });
  });
});
