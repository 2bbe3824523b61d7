/**
 * SshEndpoint (src/net/ssh.ts) when ssh2 no longer lets src/internals.ts find a connection's stream (as after an
 * upgrade that drops Connection._sock; mocked here): the connection is ended at once, before authentication, and
 * the endpoint's user never sees it. Without the fallback it would be served without its deadlines or its origin.
 * In its own file because the mock replaces the accessor for the whole file.
 */
import net from 'node:net';
import ssh2 from 'ssh2';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { generateKeyPair, sshPrivateKeyPem } from '../../src/auth/pki.js';
import { SshEndpoint } from '../../src/net/ssh.js';

vi.mock('../../src/internals.js', async (importOriginal) => ({
  ...(await importOriginal<typeof import('../../src/internals.js')>()),
  sshConnectionStream: () => undefined,
}));

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('SshEndpoint without a way to find the stream', () => {
  it('ends the connection before authentication, and does not hand it on', async () => {
    const seen: unknown[] = [];
    const endpoint = new SshEndpoint<string>({
      hostKeys: [sshPrivateKeyPem(generateKeyPair().privateKeyPem)],
      ident: 'test',
      deadlines: { sshHandshakeMs: 60_000, idleMs: 60_000 },
      onConnection: (conn, meta) => {
        seen.push(meta);
        conn.on('authentication', (ctx) => ctx.accept());
      },
    });
    const tcp = net.createServer((socket) => endpoint.inject(socket, 'meta'));
    await new Promise<void>((resolve) => tcp.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise((resolve) => tcp.close(resolve)));
    const client = new ssh2.Client();
    cleanups.push(() => client.end());
    const outcome = new Promise<string>((resolve) => {
      client.on('ready', () => resolve('ready'));
      client.on('error', () => undefined);
      client.on('close', () => resolve('closed'));
    });
    client.connect({ host: '127.0.0.1', port: (tcp.address() as net.AddressInfo).port, username: 'u', password: 'p', hostVerifier: () => true });
    expect(await outcome).toBe('closed');
    expect(seen).toEqual([]);
  });
});
