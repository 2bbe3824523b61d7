/**
 * End-to-end streams over Proxy peering (src/proxy/e2erelay.ts forward, peer.ts accept; docs/tunnels.md "End-to-end
 * streams over Proxy peering"): two Proxies of one cluster in this process, an agent whose only tunnel is to B and
 * which keeps data connections (peering-harness.ts). The test plays gwsh by the contract (src/tunnel/e2e.ts): a
 * grant session on A, the stream line and TLS with the agent on A's one port.
 *
 *   - A grants for the agent (B's presence says its tunnel offers end-to-end streams), and a stream through A
 *     reaches the agent byte for byte: A logs `end-to-end stream forwarded` naming B, B logs it routed, the metric
 *     counts one forwarded and one opened; A relays it raw: B served A no TLS peering stream for it
 *   - B's peering listener takes a stream line straight (the relay's route, its own checks) and still peers over TLS
 *   - hostile on 3021: a line that is not one, a line over the cap, a slow line (header_timeout), silence
 *     (tls-handshake), a first byte that is neither: closed; a grant used once at B is refused there again
 *   - a stream that came in on A's 3021 for the agent A holds no tunnel of is refused (TLS alert internal_error),
 *     never relayed again
 *   - a peer's agent of the version before (its capability without `peered`: it would refuse a grant of a Proxy
 *     it holds no tunnel to, inside the TLS, where the client cannot fall back) is answered classic
 *   - the relay alone (fakes around it): the stream line and the client's bytes reach the peer as they were sent,
 *     past a peer that cannot be reached; no peer reachable: internal_error; `peered`: never relayed
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { Writable } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agentServerIdentity } from '../../src/client/e2e.js';
import type { DataConnections } from '../../src/proxy/e2edata.js';
import { peeredCapability } from '../../src/proxy/e2egrants.js';
import { createE2ERelay, INTERNAL_ERROR_ALERT, type RelayContext } from '../../src/proxy/e2erelay.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { enableMetrics } from '../../src/metrics/define.js';
import { registry } from '../../src/metrics/registry.js';
import { FramedStream } from '../../src/stream/framed.js';
import { readJsonLine } from '../../src/stream/lines.js';
import { E2E_ALPN, E2E_LINE_MAX_BYTES, e2eLine, GRANT_ALPN, GRANT_TTL_MS, type E2EGrant, type GrantAnswer } from '../../src/tunnel/e2e.js';
import type { DialAnswer } from '../../src/tunnel/protocol.js';
import { parseExposition, sampleValue } from '../helpers/metrics.js';
import { waitUntil } from '../helpers/wait.js';
import { splitAddr, startPeerCluster, type PeerCluster } from './peering-harness.js';

const logs: Array<Record<string, unknown>> = [];
setRootLogger(
  createLogger({
    level: 'info',
    format: 'json',
    destination: new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const line of chunk.toString('utf8').split('\n')) if (line) logs.push(JSON.parse(line) as Record<string, unknown>);
        done();
      },
    }),
  }),
);

let c: PeerCluster;

beforeAll(async () => {
  enableMetrics();
  c = await startPeerCluster({ e2ePool: 2, limits: ['tls_handshake_timeout: 1s', 'header_timeout: 1s', 'idle_timeout: 3s'] });
  // A learns from the cluster view that B holds the agent's tunnel, and that it offers end-to-end streams.
  await waitUntil('A sees the agent at B with e2e', () => c.a.cluster.presenceOf(c.agentIdentity.hostId, c.b.id)?.e2e !== undefined && !!c.a.cluster.proxy(c.b.id)?.peer_addr, 20_000);
}, 60_000);

afterAll(async () => {
  await c?.stop();
});

/** A grant for the app `resource` from the grant session of the Proxy at `web`. */
async function grantAt(web: string, resource = 'echo'): Promise<GrantAnswer> {
  const { host, port } = splitAddr(web);
  const socket = tls.connect({ host, port, servername: 'localhost', ca: c.auth.auth.host.tls.certPem, key: c.user.key, cert: c.user.cert, ALPNProtocols: [GRANT_ALPN] });
  socket.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => socket.once('secureConnect', () => resolve()).once('error', reject));
  socket.write(`${JSON.stringify({ id: 1, resource, route: 'gateway-tcp', kind: 'app' })}\n`);
  const answer = await readJsonLine<GrantAnswer>(socket, { what: 'grant answer', timeoutMs: 20_000 });
  socket.destroy();
  return answer;
}

async function okGrant(web: string): Promise<Extract<GrantAnswer, { ok: true }>> {
  const answer = await grantAt(web);
  if (!answer.ok) throw new Error(`no grant: ${JSON.stringify(answer)}`);
  return answer;
}

/** The stream line and TLS with the agent over a raw connection to `addr`; the TLS socket, or the error that ended it. */
async function streamTo(addr: string, grant: Extract<GrantAnswer, { ok: true }>): Promise<{ ok: true; socket: tls.TLSSocket } | { ok: false; error: string }> {
  const { host, port } = splitAddr(addr);
  const raw = net.connect(port, host);
  raw.on('error', () => undefined);
  raw.write(e2eLine(grant.grant));
  const socket = tls.connect({
    socket: raw,
    servername: grant.server_name,
    ALPNProtocols: [E2E_ALPN],
    ca: c.auth.auth.host.tls.certPem,
    key: c.user.key,
    cert: c.user.cert,
    checkServerIdentity: agentServerIdentity({ cluster: 'peering.example', agent: grant.agent, service: 'app' }),
  });
  return new Promise((resolve) => {
    socket.once('secureConnect', () => resolve({ ok: true, socket }));
    socket.once('error', (err) => resolve({ ok: false, error: err.message }));
    socket.once('close', () => resolve({ ok: false, error: 'closed' }));
  });
}

async function echoes(stream: FramedStream, bytes: Buffer): Promise<Buffer> {
  const got: Buffer[] = [];
  let n = 0;
  const done = new Promise<void>((resolve, reject) => {
    stream.on('data', (chunk: Buffer) => {
      got.push(chunk);
      n += chunk.length;
      if (n >= bytes.length) resolve();
    });
    stream.once('close', () => reject(new Error(`closed after ${n} bytes`)));
  });
  stream.write(bytes);
  await done;
  return Buffer.concat(got);
}

async function streamsTotal(outcome: string): Promise<number> {
  return sampleValue(parseExposition(await registry.metrics()), 'gateway_e2e_streams_total', { outcome }) ?? 0;
}

/** The classic peering streams (TLS) B served for Proxy `peer`. */
async function peerStreams(peer: string): Promise<number> {
  return sampleValue(parseExposition(await registry.metrics()), 'gateway_peer_streams_served_total', { peer, outcome: 'ok' }) ?? 0;
}

/** Opens a raw connection to B's (or A's) peering listener, writes `bytes`, and resolves once it is closed. */
async function closedAfter(addr: string, bytes?: Buffer): Promise<void> {
  const { host, port } = splitAddr(addr);
  const s = net.connect(port, host);
  s.on('error', () => undefined);
  s.resume();
  if (bytes) s.write(bytes);
  await new Promise((r) => s.once('close', r));
}

describe('an end-to-end stream through A to the agent whose tunnel B holds', () => {
  it('A grants it, relays it raw to B on 3021, and the bytes come back byte for byte; A logs forwarded, B routed', async () => {
    const grant = await okGrant(c.a.addresses.web!);
    expect(grant.agent).toBe(c.agentIdentity.hostId);
    const [forwardedBefore, openedBefore] = [await streamsTotal('forwarded'), await streamsTotal('opened')];
    const peeredBefore = await peerStreams(c.a.id);
    const from = logs.length;
    const opened = await streamTo(c.a.addresses.web!, grant);
    if (!opened.ok) throw new Error(opened.error)
    expect(await readJsonLine<DialAnswer>(opened.socket, { what: 'dial answer', timeoutMs: 20_000 })).toEqual({ ok: true, framed: true });
    const framed = new FramedStream(opened.socket);
    const bytes = randomBytes(512 * 1024);
    expect((await echoes(framed, bytes)).equals(bytes)).toBe(true);
    framed.destroy();
    const since = logs.slice(from);
    expect(since.find((l) => l.msg === 'end-to-end stream forwarded')).toMatchObject({ peer: c.b.id, agent: c.agentIdentity.hostId, user: 'alice' });
    expect(since.find((l) => l.msg === 'end-to-end stream routed')).toMatchObject({ user: 'alice', resource: 'echo' });
    expect(await streamsTotal('forwarded')).toBe(forwardedBefore + 1);
    expect(await streamsTotal('opened')).toBe(openedBefore + 1);
    // Raw: no classic peering stream (TLS, a dial request) went from A to B for it.
    expect(await peerStreams(c.a.id)).toBe(peeredBefore);
  });
});

describe("B's peering listener", () => {
  it('takes a stream line straight (routed by B itself), and takes each grant once', async () => {
    const grant = await okGrant(c.b.addresses.web!);
    const opened = await streamTo(c.b.peer.address()!, grant);
    if (!opened.ok) throw new Error(opened.error)
    expect(await readJsonLine<DialAnswer>(opened.socket, { what: 'dial answer', timeoutMs: 20_000 })).toEqual({ ok: true, framed: true });
    const framed = new FramedStream(opened.socket);
    const bytes = randomBytes(4096);
    expect((await echoes(framed, bytes)).equals(bytes)).toBe(true);
    framed.destroy();
    // The same grant again, on the same listener: B routed it before (access_denied before any certificate).
    const again = await streamTo(c.b.peer.address()!, grant);
    expect(again.ok).toBe(false);
    if (!again.ok) expect(again.error).toMatch(/access denied/i);
  });

  it('hostile: a line that is not one, a line over the cap, a slow line, silence, another first byte: each closed', async () => {
    const peer = c.b.peer.address()!;
    const before = c.limits.stats().peer?.deadlines ?? {};
    await closedAfter(peer, Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    await closedAfter(peer, Buffer.concat([Buffer.from('GWE2E1 '), Buffer.alloc(E2E_LINE_MAX_BYTES + 16, 0x61)]));
    await closedAfter(peer, Buffer.from('GWE2E1 abc'));
    await closedAfter(peer);
    await closedAfter(peer, randomBytes(64).fill(0x00, 0, 1));
    const after = c.limits.stats().peer!.deadlines;
    expect(after['peer-request'] ?? 0).toBeGreaterThan(before['peer-request'] ?? 0);
    expect(after['tls-handshake'] ?? 0).toBeGreaterThan(before['tls-handshake'] ?? 0);
    // And peering over TLS still works on the same listener.
    const peered = await c.open(c.a.addresses.web!);
    peered.destroy();
  });

  it("a stream that came in on A's 3021 for the agent A holds no tunnel of is refused, never relayed again", async () => {
    const grant = await okGrant(c.a.addresses.web!);
    const [forwardedBefore, noTunnelBefore] = [await streamsTotal('forwarded'), await streamsTotal('no-tunnel')];
    const from = logs.length;
    const opened = await streamTo(c.a.peer.address()!, grant);
    expect(opened.ok).toBe(false);
    if (!opened.ok) expect(opened.error).toMatch(/internal error/i);
    expect(await streamsTotal('forwarded')).toBe(forwardedBefore);
    expect(await streamsTotal('no-tunnel')).toBe(noTunnelBefore + 1);
    expect(logs.slice(from).some((l) => l.msg === 'end-to-end stream forwarded' || l.msg === 'end-to-end stream routed')).toBe(false);
  });
});

describe('the relay to a peer, alone', () => {
  const grant: E2EGrant = { v: 1, id: 'cd'.repeat(16), iss: 'proxy-x', sub: 'alice', key: 'k', roles: ['access'], service: 'app', resource: 'echo', agent: 'agent-1', iat: Date.now(), exp: Date.now() + GRANT_TTL_MS };
  const token = 'eyJ2IjoxfQ.c2ln';

  /** A relay with no tunnel of the agent here, whose peers are `peers`; `dial` refuses the address "down:1". */
  function relay(peers: Array<{ proxyId: string; peerAddr: string }>, dialed: string[]) {
    const ctx: RelayContext = {
      auth: { sessions: { track: () => () => undefined } as never, resolveCaller: async (id) => id as never, clusterName: 'peering.example' },
      issuers: { check: () => ({ ok: true, grant }) },
      data: { tunnelOf: () => undefined } as unknown as DataConnections,
      forward: {
        peers: () => peers,
        dial: async (addr) => {
          dialed.push(addr);
          if (addr === 'down:1') throw new Error('connection refused');
          const { host, port } = splitAddr(addr);
          return net.connect(port, host);
        },
      },
      lineTimeoutMs: 1_000,
    };
    return createE2ERelay(ctx);
  }

  /** Serves one connection with `handler` and sends it `bytes`; resolves with what the client read until the close. */
  async function through(handler: (s: net.Socket, info: never) => void, bytes: Buffer): Promise<Buffer> {
    const server = net.createServer((s) => handler(s, { remoteAddress: '192.0.2.9', remotePort: 4000, localAddress: '127.0.0.1', localPort: 443, route: 'gateway-e2e' } as never));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    client.on('error', () => undefined);
    client.write(bytes);
    const got: Buffer[] = [];
    client.on('data', (c: Buffer) => {
      got.push(c);
      if (Buffer.concat(got).includes('PEER-END')) client.end();
    });
    await new Promise((r) => client.once('close', r));
    server.close();
    return Buffer.concat(got);
  }

  it('relays the line and the bytes after it as sent, to the first peer that takes the connection', async () => {
    const received: Buffer[] = [];
    const peer = net.createServer((s) => {
      s.on('data', (c: Buffer) => {
        received.push(c);
        if (Buffer.concat(received).includes('CLIENT-HELLO')) s.end('PEER-END');
      });
    });
    await new Promise<void>((r) => peer.listen(0, '127.0.0.1', r));
    const dialed: string[] = [];
    const addr = `127.0.0.1:${(peer.address() as net.AddressInfo).port}`;
    const sent = Buffer.concat([e2eLine(token), Buffer.from('CLIENT-HELLO')]);
    const answer = await through(relay([{ proxyId: 'p-down', peerAddr: 'down:1' }, { proxyId: 'p-up', peerAddr: addr }], dialed), sent);
    peer.close();
    expect(dialed).toEqual(['down:1', addr]);
    expect(Buffer.concat(received).equals(sent)).toBe(true);
    expect(answer.toString()).toBe('PEER-END');
  });

  it('hostile: no peer reachable is the TLS alert internal_error; a stream that came over peering is never relayed', async () => {
    const sent = Buffer.concat([e2eLine(token), Buffer.from('CLIENT-HELLO')]);
    const dialed: string[] = [];
    expect((await through(relay([{ proxyId: 'p-down', peerAddr: 'down:1' }], dialed), sent)).equals(INTERNAL_ERROR_ALERT)).toBe(true);
    expect(dialed).toEqual(['down:1']);
    const never: string[] = [];
    expect((await through(relay([{ proxyId: 'p-down', peerAddr: 'down:1' }], never).peered, sent)).equals(INTERNAL_ERROR_ALERT)).toBe(true);
    expect(never).toEqual([]);
  });
});

describe('the grant for an agent reached over peering', () => {
  const via = (capability: { v: 1; pool: number; peered?: true }) => ({ peering: { e2ePeers: () => ({ peers: [{ proxyId: 'p-b', peerAddr: 'b:3021', capability }], reason: 'Proxy p-b holds its tunnel' }) } });

  it('is given when the agent takes grants of Proxies it holds no tunnel to, and classic for an agent of the version before', () => {
    expect(peeredCapability(via({ v: 1, pool: 2, peered: true }), 'h', 'agent-b')).toEqual({ v: 1, pool: 2, peered: true });
    expect(peeredCapability(via({ v: 1, pool: 2 }), 'h', 'agent-b')).toContain('an earlier version');
    expect(peeredCapability({}, 'h', 'agent-b')).toContain('this Proxy does not peer');
  });
});
