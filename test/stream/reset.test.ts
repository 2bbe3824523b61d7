/**
 * A broken stream is reset, never ended (src/stream/splice.ts, src/stream/reset.ts, src/net/sshchannel.ts): the
 * relays of a real path, in one process, on real loopback TCP connections, and what the client sees when a hop
 * breaks. Each chain is built as the daemons build it:
 *
 *   v2 tunnel  client ⇄ TLS ⇄ [splice] ⇄ Proxy's TunnelStream ~ tunnel ~ agent's TunnelStream ⇄ [splice] ⇄ resource
 *   HTTP/2     client's HTTP/2 stream ~ session ~ server's stream ⇄ [splice] ⇄ resource   (peering, gateway-peer)
 *   v1 tunnel  client ⇄ [splice] ⇄ SSH channel ~ SSH connection ~ SSH channel ⇄ [splice] ⇄ resource
 *
 * A break (the resource's RST, the tunnel's connection lost, the client's RST) must reach the far end as an error
 * (ECONNRESET, an aborted HTTP/2 stream), and a real end as an end with every byte. Before the change the
 * breaks arrived as clean ends (a FIN, an SSH CLOSE turned into an end), which is what these tests catch.
 */
import { once } from 'node:events';
import http2 from 'node:http2';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import ssh2 from 'ssh2';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { relayChannel } from '../../src/net/sshchannel.js';
import { FramedStream } from '../../src/stream/framed.js';
import { splice } from '../../src/stream/splice.js';
import { TunnelSession, type TunnelStream } from '../../src/tunnel/session.js';
import { makeTestPki, type ServerCert, type TestPki } from '../helpers/tls.js';

const cleanups: Array<() => void> = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

async function socketPair(allowHalfOpen = true): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer({ allowHalfOpen });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const client = net.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', allowHalfOpen });
  const [accepted] = (await once(server, 'connection')) as [net.Socket];
  await once(client, 'connect');
  server.close();
  cleanups.push(() => {
    client.destroy();
    accepted.destroy();
  });
  return [client, accepted];
}

/**
 * How a reader's stream ended, and how many bytes it got before: 'end' (a clean end), 'reset' (an error, or a TCP
 * end that was an RST), 'close' (destroyed without an end: a break on a framed or tunnel stream).
 */
interface Outcome {
  how: 'end' | 'reset' | 'close';
  code?: string;
  bytes: number;
}

/**
 * Watches a reader. A plain TCP socket's 'end' is checked with one byte written back: libuv reports an RST that
 * arrives right behind data as an end (a short read, then the hang-up), but the kernel's socket is closed then and
 * the write fails with EPIPE, where after a real FIN it succeeds.
 */
function watch(stream: Duplex): { bytes: () => number; outcome: Promise<Outcome> } {
  let bytes = 0;
  stream.on('data', (d: Buffer) => (bytes += d.length));
  stream.on('error', () => undefined);
  const outcome = new Promise<Outcome>((resolve) => {
    stream.once('end', () => {
      if (!(stream instanceof net.Socket) || stream instanceof tls.TLSSocket || stream.writableEnded) return resolve({ how: 'end', bytes });
      stream.write(Buffer.from([0]), (err?: Error | null) => resolve(err ? { how: 'reset', code: (err as NodeJS.ErrnoException).code ?? err.message, bytes } : { how: 'end', bytes }));
    });
    stream.once('error', (err: NodeJS.ErrnoException) => resolve({ how: 'reset', code: err.code ?? err.message, bytes }));
    stream.once('close', () => setImmediate(() => resolve({ how: 'close', bytes })));
  });
  return { bytes: () => bytes, outcome };
}

/** Writes `total` bytes (0x5a) with back-pressure; then ends when `end`. */
function feed(stream: Duplex, total: number, end: boolean): void {
  const chunk = Buffer.alloc(64 * 1024, 0x5a);
  let sent = 0;
  const pump = () => {
    while (sent < total && !stream.destroyed) {
      const n = Math.min(chunk.length, total - sent);
      sent += n;
      if (!stream.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return void stream.once('drain', pump);
    }
    if (end && sent >= total && !stream.destroyed) stream.end();
  };
  pump();
}

async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 10));
}

let pki: TestPki;
let serverCert: ServerCert;
beforeAll(async () => {
  pki = await makeTestPki();
  serverCert = await pki.serverCert({ names: ['proxy.test'], ips: [] });
});

/**
 * The v2 chain, with the client's hop framed as gwsh and the Proxy frame it (src/stream/framed.ts); returns the
 * client's stream, the resource's socket, the tunnel's sockets and the TCP socket under the Proxy's TLS.
 */
async function tunnelChain(): Promise<{ client: FramedStream; clientRaw: net.Socket; resource: net.Socket; proxyRaw: net.Socket; tunnel: { proxy: net.Socket; agent: net.Socket } }> {
  const [tunnelProxy, tunnelAgent] = await socketPair(false);
  tunnelProxy.on('error', () => undefined);
  tunnelAgent.on('error', () => undefined);
  const [resourceSide, resource] = await socketPair();
  const agent = new TunnelSession(tunnelAgent, { role: 'agent', onStream: (s: TunnelStream) => splice(s, resourceSide) });
  const proxy = new TunnelSession(tunnelProxy, { role: 'proxy' });
  cleanups.push(() => {
    agent.destroy();
    proxy.destroy();
  });
  // The client's hop: TLS, terminated on a socket the Proxy wrapped (src/net/tls.ts does the same).
  const [clientRaw, accepted] = await socketPair();
  clientRaw.on('error', () => undefined);
  accepted.on('error', () => undefined);
  const serverTls = new tls.TLSSocket(accepted, { isServer: true, key: serverCert.keyPem, cert: serverCert.certPem });
  serverTls.on('error', () => undefined);
  const clientTls = tls.connect({ socket: clientRaw, ca: pki.caPem, servername: 'proxy.test' });
  clientTls.on('error', () => undefined);
  await once(clientTls, 'secureConnect');
  splice(new FramedStream(serverTls), proxy.openStream());
  return { client: new FramedStream(clientTls), clientRaw, resource, proxyRaw: accepted, tunnel: { proxy: tunnelProxy, agent: tunnelAgent } };
}

describe('through a v2 tunnel and a framed TLS client hop (gwsh to the Proxy)', () => {
  it('a clean end of the resource reaches the client as an end, with every byte (no false reset)', async () => {
    const { client, resource } = await tunnelChain();
    const seen = watch(client);
    resource.on('error', () => undefined);
    feed(resource, 8 * 1024 * 1024, true);
    expect(await seen.outcome).toEqual({ how: 'end', bytes: 8 * 1024 * 1024 });
    // The other direction still works after the half-close, and ends cleanly too.
    const atResource = watch(resource);
    client.end('last words');
    expect(await atResource.outcome).toEqual({ how: 'end', bytes: 'last words'.length });
  });

  it('HOSTILE: the resource resets mid-transfer: the client sees a break, not an end', async () => {
    const { client, resource } = await tunnelChain();
    const seen = watch(client);
    resource.on('error', () => undefined);
    feed(resource, 64 * 1024 * 1024, false);
    await until(() => seen.bytes() >= 1024 * 1024);
    resource.resetAndDestroy();
    expect((await seen.outcome).how).toBe('close');
  });

  it("HOSTILE: the tunnel's connection is lost mid-transfer (the agent or squid killed: a FIN): the client sees a break", async () => {
    const { client, resource, tunnel } = await tunnelChain();
    const seen = watch(client);
    resource.on('error', () => undefined);
    feed(resource, 64 * 1024 * 1024, false);
    await until(() => seen.bytes() >= 1024 * 1024);
    // What the kernel of a killed agent or squid sends when nothing is left unread: a plain FIN.
    tunnel.agent.destroy();
    expect((await seen.outcome).how).toBe('close');
  });

  it('HOSTILE: the Proxy dies mid-transfer (its kernel closes the TLS connection with a FIN, no close_notify): the client sees a break', async () => {
    const { client, resource, proxyRaw } = await tunnelChain();
    const seen = watch(client);
    resource.on('error', () => undefined);
    feed(resource, 64 * 1024 * 1024, false);
    await until(() => seen.bytes() >= 1024 * 1024);
    proxyRaw.destroy();
    expect((await seen.outcome).how).toBe('close');
  });

  it('HOSTILE: the client (gwsh) dies mid-upload: the resource sees a reset, not an end of the upload', async () => {
    const { client, clientRaw, resource } = await tunnelChain();
    const atResource = watch(resource);
    client.on('error', () => undefined);
    feed(client, 64 * 1024 * 1024, false);
    await until(() => atResource.bytes() >= 1024 * 1024);
    clientRaw.destroy();
    const outcome = await atResource.outcome;
    expect(outcome.how).toBe('reset');
  });
});

/** The HTTP/2 chain of peering: the asking Proxy's client stream, the serving Proxy's stream spliced to a resource. */
async function h2Chain(): Promise<{ stream: http2.ClientHttp2Stream; resource: net.Socket; session: http2.ClientHttp2Session }> {
  const [resourceSide, resource] = await socketPair();
  const server = http2.createServer();
  server.on('stream', (s) => {
    s.respond({ ':status': 200 });
    splice(s, resourceSide);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const session = http2.connect(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}`);
  session.on('error', () => undefined);
  cleanups.push(() => {
    session.destroy();
    server.close();
  });
  const stream = session.request({ ':method': 'POST', ':path': '/' });
  await once(stream, 'response');
  return { stream, resource, session };
}

describe('through an HTTP/2 stream (peering over gateway-peer)', () => {
  it('a clean end of the resource is END_STREAM, with every byte', async () => {
    const { stream, resource } = await h2Chain();
    const seen = watch(stream);
    resource.on('error', () => undefined);
    feed(resource, 4 * 1024 * 1024, true);
    stream.end();
    expect(await seen.outcome).toEqual({ how: 'end', bytes: 4 * 1024 * 1024 });
  });

  it('HOSTILE: the resource resets mid-transfer: the stream gets RST_STREAM (INTERNAL_ERROR), never an end', async () => {
    const { stream, resource } = await h2Chain();
    const seen = watch(stream);
    resource.on('error', () => undefined);
    feed(resource, 64 * 1024 * 1024, false);
    await until(() => seen.bytes() >= 512 * 1024);
    resource.resetAndDestroy();
    const outcome = await seen.outcome;
    expect(outcome.how).not.toBe('end');
    expect(stream.rstCode).toBe(http2.constants.NGHTTP2_INTERNAL_ERROR);
  });

  it("HOSTILE: the client's stream is cancelled mid-upload: the resource sees a reset", async () => {
    const { stream, resource } = await h2Chain();
    const atResource = watch(resource);
    stream.on('error', () => undefined);
    feed(stream, 64 * 1024 * 1024, false);
    await until(() => atResource.bytes() >= 512 * 1024);
    stream.close(http2.constants.NGHTTP2_CANCEL);
    expect((await atResource.outcome).how).toBe('reset');
  });
});

/** The v1 chain: an ssh2 server (the Proxy) opens a forwarded-tcpip channel to an ssh2 client (the agent). */
async function sshChain(): Promise<{ client: net.Socket; resource: net.Socket; transport: net.Socket }> {
  const hostKey = ssh2.utils.generateKeyPairSync('ed25519').private;
  const [clientSide, client] = await socketPair();
  const [resourceSide, resource] = await socketPair();
  const [serverTransport, agentTransport] = await socketPair(false);
  serverTransport.on('error', () => undefined);
  agentTransport.on('error', () => undefined);
  const server = new ssh2.Server({ hostKeys: [hostKey] }, (conn) => {
    conn.on('error', () => undefined);
    conn.on('authentication', (ctx) => ctx.accept());
    conn.on('request', (accept, _reject, name) => {
      if (name !== 'tcpip-forward') return;
      accept?.();
      conn.forwardOut('127.0.0.1', 1, '127.0.0.1', 2, (err, channel) => {
        if (err) throw err;
        splice(clientSide, relayChannel(channel));
      });
    });
  });
  server.injectSocket(serverTransport as never);
  const agent = new ssh2.Client();
  agent.on('error', () => undefined);
  agent.on('tcp connection', (_info, accept) => splice(relayChannel(accept()), resourceSide));
  agent.on('ready', () => agent.forwardIn('127.0.0.1', 1, () => undefined));
  agent.connect({ sock: agentTransport, username: 'agent', hostVerifier: () => true } as ssh2.ConnectConfig);
  cleanups.push(() => {
    agent.end();
    server.close();
  });
  return { client, resource, transport: agentTransport };
}

describe('through a v1 tunnel (SSH channels)', () => {
  it('a clean end of the resource is an EOF, and reaches the client as an end with every byte', async () => {
    const { client, resource } = await sshChain();
    const seen = watch(client);
    resource.on('error', () => undefined);
    feed(resource, 4 * 1024 * 1024, true);
    expect(await seen.outcome).toEqual({ how: 'end', bytes: 4 * 1024 * 1024 });
  });

  it('HOSTILE: the resource resets mid-transfer: the channel closes without EOF and the client sees a reset', async () => {
    const { client, resource } = await sshChain();
    const seen = watch(client);
    resource.on('error', () => undefined);
    feed(resource, 64 * 1024 * 1024, false);
    await until(() => seen.bytes() >= 512 * 1024);
    resource.resetAndDestroy();
    expect((await seen.outcome).how).toBe('reset');
  });

  it("HOSTILE: the SSH connection is lost mid-transfer: ssh2 closes the channel, and the client sees a reset", async () => {
    const { client, resource, transport } = await sshChain();
    const seen = watch(client);
    resource.on('error', () => undefined);
    feed(resource, 64 * 1024 * 1024, false);
    await until(() => seen.bytes() >= 512 * 1024);
    transport.destroy();
    expect((await seen.outcome).how).toBe('reset');
  });
});
