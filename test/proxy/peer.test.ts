/**
 * Proxy peering (src/proxy/peer.ts, router.ts): two Proxies of one cluster in this process, an agent whose only
 * tunnel is to B, and a client that reaches the agent's app through A: A's router finds the agent in the cluster
 * view and carries the stream over B's peering listener. Bytes are checked end to end (a large transfer, many
 * concurrent streams, half-close), through A and with a PeerClient on each transport (HTTP/2, gateway-peer; a TLS
 * connection per stream, gateway-peer-tls). Hostile cases on B's 3021: a
 * user certificate, an agent's host certificate, one from another cluster, one of a host that is not a live
 * Proxy, none, another ALPN, garbage bytes, slowloris (before TLS, silence after it, half a request line), a
 * request line over the cap, malformed requests; all are closed or answered GW_ERR_PEER_PROTOCOL, the
 * deadlines counted, on both transports. A resumed TLS session is served with the identity checked again. The link is cut and restored; an agent B no longer holds gets a
 * clear error, never a loop.
 */
import { randomBytes } from 'node:crypto';
import http2 from 'node:http2';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert } from '../../src/auth/pki.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { PEER_ALPN, PEER_ALPN_TLS, PEER_MAX_REQUEST_BYTES, PEER_PATH, PeerClient, parsePeerRequest } from '../../src/proxy/peer.js';
import { Dialer } from '../../src/dial/dialer.js';
import { readLine } from '../../src/stream/lines.js';
import { Router } from '../../src/proxy/router.js';
import { waitUntil } from '../helpers/wait.js';
import { enableMetrics } from '../../src/metrics/define.js';
import { registry } from '../../src/metrics/registry.js';
import { parseExposition, sampleValue } from '../helpers/metrics.js';
import { echoDigest, sha256, splitAddr, startPeerCluster, type PeerCluster } from './peering-harness.js';

setRootLogger(createLogger({ level: process.env.PEER_LOG === 'debug' ? 'debug' : 'silent' }));

let c: PeerCluster;
const DIAL = { service: 'app', resource: 'echo', client_src: '192.0.2.1:1', client_dst: '192.0.2.2:443' } as const;

beforeAll(async () => {
  c = await startPeerCluster({ limits: ['tls_handshake_timeout: 1s', 'header_timeout: 1s', 'idle_timeout: 3s'] });
  // A learns from the cluster view that B holds the agent's tunnel.
  await waitUntil('A sees the agent at B', () => c.a.cluster.locations(c.agentIdentity.hostId).includes(c.b.id) && !!c.a.cluster.proxy(c.b.id)?.peer_addr);
}, 60_000);

afterAll(async () => {
  await c?.stop();
});

type Attempt = { answer?: { ok: boolean; error?: { code: string; message: string } }; closed: boolean; reused?: boolean; session?: Buffer };

/** A TLS connection on B's peering listener (gateway-peer-tls) with the certificate given (or none): the request line, then the answer line. */
async function peerAttempt(cred: { key: string; cert: string } | undefined, request: object | string = { hostId: c.agentIdentity.hostId, request: DIAL }, session?: Buffer): Promise<Attempt> {
  const { host, port } = splitAddr(c.b.peer.address()!);
  const socket = tls.connect({ host, port, ca: c.auth.auth.host.tls.certPem, ALPNProtocols: [PEER_ALPN_TLS], checkServerIdentity: () => undefined, ...(cred ?? {}), ...(session ? { session } : {}) });
  socket.on('error', () => undefined);
  let ticket: Buffer | undefined;
  socket.on('session', (s: Buffer) => (ticket = s));
  const secure = await new Promise<boolean>((resolve) => {
    socket.once('secureConnect', () => resolve(true));
    socket.once('close', () => resolve(false));
  });
  if (!secure) return { closed: true };
  const reused = socket.isSessionReused();
  socket.write(typeof request === 'string' ? request : `${JSON.stringify(request)}\n`);
  const out = await readLine(socket, { timeoutMs: 10_000 }).then(
    (line) => ({ answer: JSON.parse(line) as Attempt['answer'], closed: false, reused }),
    () => ({ closed: true, reused }),
  );
  // The ticket comes after the handshake; give it a moment when the answer did not carry it along.
  if (!ticket && !out.closed) await new Promise((r) => setTimeout(r, 50));
  socket.destroy();
  return { ...out, ...(ticket ? { session: ticket } : {}) };
}

/** The same on the HTTP/2 transport (ALPN gateway-peer). */
async function h2Attempt(cred: { key: string; cert: string } | undefined, headers: http2.OutgoingHttpHeaders = {}): Promise<{ status?: number; error?: string; closed: boolean }> {
  const { host, port } = splitAddr(c.b.peer.address()!);
  const socket = tls.connect({ host, port, ca: c.auth.auth.host.tls.certPem, ALPNProtocols: [PEER_ALPN], checkServerIdentity: () => undefined, ...(cred ?? {}) });
  socket.on('error', () => undefined);
  const secure = await new Promise<boolean>((resolve) => {
    socket.once('secureConnect', () => resolve(true));
    socket.once('close', () => resolve(false));
  });
  if (!secure) return { closed: true };
  const session = http2.connect(`https://${host}`, { createConnection: () => socket });
  session.on('error', () => undefined);
  const req = session.request({ ':method': 'POST', ':path': PEER_PATH, 'x-gateway-host': c.agentIdentity.hostId, 'x-gateway-dial': JSON.stringify(DIAL), ...headers });
  req.on('error', () => undefined);
  const out = await new Promise<{ status?: number; error?: string; closed: boolean }>((resolve) => {
    req.once('response', (h) => resolve({ status: Number(h[':status']), ...(typeof h['x-gateway-error'] === 'string' ? { error: h['x-gateway-error'] } : {}), closed: false }));
    req.once('close', () => resolve({ closed: true }));
    session.once('close', () => resolve({ closed: true }));
  });
  session.destroy();
  return out;
}

async function hostCert(name: string, roles: string[], ca = c.auth.auth.host): Promise<{ key: string; cert: string }> {
  const keys = generateKeyPair();
  const cert = await issueTlsCert(ca as never, { publicKeyPem: keys.publicKeyPem, identity: { kind: 'host', name, cluster: ca.clusterName ?? 'peering.example', roles }, dnsNames: ['localhost'], ttlMs: 3600_000, usage: 'both' });
  return { key: keys.privateKeyPem, cert };
}

/** A's own peering credentials: a live Proxy's host certificate, as B must accept. */
async function liveProxyCert(): Promise<{ key: string; cert: string }> {
  const keys = generateKeyPair();
  return { key: keys.privateKeyPem, cert: await c.auth.auth.issueServerCert(keys.publicKeyPem, ['localhost'], c.a.id) };
}

describe('a client through A reaches the agent whose tunnel B holds', () => {
  it('the router plans peering to B, with its reason', () => {
    expect(c.a.tunnels.get(c.agentIdentity.hostId)).toBeUndefined();
    const plan = c.a.router.plan(c.agentIdentity.hostId);
    expect(plan.map((d) => d.via)).toEqual(['peer', 'none']);
    expect(plan[0]).toMatchObject({ proxyId: c.b.id, peerAddr: c.b.peer.address() });
    expect(plan[0]!.reason).toContain(`Proxy ${c.b.id} holds a tunnel`);
    expect(c.b.router.plan(c.agentIdentity.hostId)[0]).toMatchObject({ via: 'local' });
    // Lookups see the agent on A too (from B's presence record).
    expect(c.a.router.agents().map((a) => a.nodename)).toContain('agent-b');
  });

  it('a large transfer through A → 3021 → B → agent comes back byte for byte', async () => {
    const data = randomBytes(24 * 1024 * 1024);
    const stream = await c.open(c.a.addresses.web!);
    expect(await echoDigest(stream, data)).toBe(sha256(data));
  });

  it('many concurrent streams through A, each with its own bytes', async () => {
    const results = await Promise.all(
      Array.from({ length: 40 }, async (_, i) => {
        const data = randomBytes(64 * 1024 + i);
        const stream = await c.open(c.a.addresses.web!);
        return (await echoDigest(stream, data)) === sha256(data);
      }),
    );
    expect(results.every(Boolean)).toBe(true);
    expect(c.limits.stats().peer?.accepted).toBeGreaterThanOrEqual(1);
  });

  it("half-close passes through to the agent's resource: a sink sees the client's end and ends its own", async () => {
    const stream = await c.open(c.a.addresses.web!, 'sink');
    stream.resume();
    const ended = new Promise((r) => stream.once('end', r));
    stream.end(randomBytes(1024 * 1024));
    await ended;
  });
});

describe.each(['http2', 'tls'] as const)('a PeerClient on the %s transport', (transport) => {
  let client: PeerClient;
  beforeAll(async () => {
    client = new PeerClient({ tls: { ...(await liveProxyCert()), ca: c.auth.auth.host.tls.certPem }, clusterName: 'peering.example', dialer: new Dialer({ env: {} }), tlsHandshakeMs: 5000, dialTimeoutMs: 10_000, idleMs: 30_000, transport });
  });
  afterAll(() => client?.close());
  const dial = (resource = 'echo') => client.dial(c.a.cluster.proxy(c.b.id)!, c.agentIdentity.hostId, { ...DIAL, resource });

  it('carries a large transfer through B to the agent and back', async () => {
    const data = randomBytes(16 * 1024 * 1024);
    expect(await echoDigest(await dial(), data)).toBe(sha256(data));
  });

  it('carries concurrent streams, each with its own bytes', async () => {
    const ok = await Promise.all(
      Array.from({ length: 30 }, async (_, i) => {
        const data = randomBytes(32 * 1024 + i);
        return (await echoDigest(await dial(), data)) === sha256(data);
      }),
    );
    expect(ok.every(Boolean)).toBe(true);
  });

  it('passes a half-close through: the sink sees the end and ends its own side', async () => {
    const stream = await dial('sink');
    stream.resume();
    const ended = new Promise((r) => stream.once('end', r));
    stream.end(randomBytes(512 * 1024));
    await ended;
  });

  it('the database grant reaches the agent through B as the Proxy sent it', async () => {
    const db_access = { users: { allow: ['orders_app'], deny: ['postgres'] }, names: { allow: ['orders'], deny: [] } };
    const stream = await client.dial(c.a.cluster.proxy(c.b.id)!, c.agentIdentity.hostId, { ...DIAL, user: 'alice', db_access });
    stream.destroy();
    expect(c.dials.at(-1)).toEqual({ ...DIAL, user: 'alice', db_access });
  });

  it('a probe (gwctl probe) through B: B writes its own hop line before the agent\'s report, and the agent dials nothing', async () => {
    const before = c.dials.length;
    const stream = await client.dial(c.a.cluster.proxy(c.b.id)!, c.agentIdentity.hostId, { ...DIAL, probe: true });
    const peerLine = JSON.parse(await readLine(stream, { timeoutMs: 10_000 })) as { hop: string; ms: number };
    const agentLine = JSON.parse(await readLine(stream, { timeoutMs: 10_000 })) as { hop: string; ms: number };
    stream.destroy();
    expect(peerLine.hop).toBe('peer-tunnel');
    expect(peerLine.ms).toBeGreaterThanOrEqual(0);
    expect(agentLine).toEqual({ hop: 'resource', ms: 0.5 });
    expect(c.dials.length).toBe(before);
  });

  it("reports B's answer for an agent B does not hold", async () => {
    await expect(client.dial(c.a.cluster.proxy(c.b.id)!, 'ghost-host', DIAL)).rejects.toMatchObject({ code: 'GW_ERR_TUNNEL_NOT_FOUND', message: expect.stringContaining(`through Proxy ${c.b.id}: Proxy ${c.b.id} holds no tunnel of agent ghost-host`) });
  });

  it('hostile: the streams it carries through a Proxy that left the cluster (a lock takes its record out) are reset; the others go on (issue 23)', async () => {
    const through = await dial();
    const closed = new Promise((r) => through.once('close', r));
    through.on('error', () => undefined);
    client.dropDeparted((id) => id === c.b.id);
    const data = randomBytes(1024);
    expect(await echoDigest(through, data)).toBe(sha256(data));
    client.dropDeparted((id) => id !== c.b.id);
    await closed;
    expect(through.destroyed).toBe(true);
    // A new stream opens a new connection once B is live again.
    const again = await dial();
    expect(await echoDigest(again, data)).toBe(sha256(data));
  });
});

describe('hostile peers on 3021 are refused', () => {
  it('a valid live Proxy certificate is served (the control case), and its TLS session resumes with the identity checked again', async () => {
    const cred = await liveProxyCert();
    const first = await peerAttempt(cred);
    expect(first).toMatchObject({ answer: { ok: true }, reused: false });
    expect(first.session).toBeDefined();
    expect(await peerAttempt(cred, undefined, first.session)).toMatchObject({ answer: { ok: true }, reused: true });
  });

  it('a user certificate', async () => {
    expect(await peerAttempt(c.user)).toMatchObject({ closed: true });
  });

  it("an agent's host certificate (no proxy role)", async () => {
    expect(await peerAttempt({ key: c.agentIdentity.key, cert: c.agentIdentity.cert })).toMatchObject({ closed: true });
  });

  it('a proxy certificate from another cluster', async () => {
    const other = await generateAuthority('host', 'other.example');
    expect(await peerAttempt(await hostCert(c.a.id, ['proxy'], other))).toMatchObject({ closed: true });
  });

  it('a proxy-role host certificate of this cluster whose host is not a live Proxy', async () => {
    const keys = generateKeyPair();
    const cert = await c.auth.auth.issueServerCert(keys.publicKeyPem, ['localhost'], '00000000-dead-4000-8000-000000000000');
    expect(await peerAttempt({ key: keys.privateKeyPem, cert })).toMatchObject({ closed: true });
  });

  it('no certificate', async () => {
    expect(await peerAttempt(undefined)).toMatchObject({ closed: true });
  });

  it('an ALPN that is not peering (or none) is closed', async () => {
    const { host, port } = splitAddr(c.b.peer.address()!);
    const s = tls.connect({ host, port, ca: c.auth.auth.host.tls.certPem, ALPNProtocols: ['h2'], checkServerIdentity: () => undefined, ...(await liveProxyCert()) });
    s.on('error', () => undefined);
    s.resume();
    await new Promise((r) => s.once('close', r));
  });

  it('garbage bytes are closed', async () => {
    const { host, port } = splitAddr(c.b.peer.address()!);
    const s = net.connect(port, host);
    s.on('error', () => undefined);
    s.write(randomBytes(4096));
    await new Promise((r) => s.once('close', r));
  });

  it('slowloris before TLS, silence after it and half a request line are closed by their deadlines', async () => {
    const before = c.limits.stats().peer?.deadlines ?? {};
    const { host, port } = splitAddr(c.b.peer.address()!);
    const slow = net.connect(port, host);
    slow.on('error', () => undefined);
    slow.write(Buffer.from([0x16]));
    // A live Proxy's certificate, TLS done, then silence (idle_timeout) or half a request line (header_timeout).
    const cred = await liveProxyCert();
    const open = () => {
      const s = tls.connect({ host, port, ca: c.auth.auth.host.tls.certPem, ALPNProtocols: [PEER_ALPN_TLS], checkServerIdentity: () => undefined, ...cred });
      s.on('error', () => undefined);
      s.resume();
      return s;
    };
    const silent = open();
    const half = open();
    half.once('secureConnect', () => half.write('{"hostId":"'));
    await Promise.all([slow, silent, half].map((s) => new Promise((r) => s.once('close', r))));
    const after = c.limits.stats().peer!.deadlines;
    expect(after['tls-handshake'] ?? 0).toBeGreaterThan(before['tls-handshake'] ?? 0);
    expect(after['peer-idle'] ?? 0).toBeGreaterThan(before['peer-idle'] ?? 0);
    expect(after['peer-request'] ?? 0).toBeGreaterThan(before['peer-request'] ?? 0);
  });

  it('a request line over the cap is answered GW_ERR_PEER_PROTOCOL and closed', async () => {
    const out = await peerAttempt(await liveProxyCert(), 'x'.repeat(PEER_MAX_REQUEST_BYTES + 1024));
    expect(out.answer).toMatchObject({ ok: false, error: { code: 'GW_ERR_PEER_PROTOCOL' } });
    expect(out.answer!.error!.message).toContain(`longer than ${PEER_MAX_REQUEST_BYTES} bytes`);
  });

  it('a request without a well-formed dial request is answered GW_ERR_PEER_PROTOCOL', async () => {
    for (const bad of [{ hostId: c.agentIdentity.hostId, request: { service: 'nope' } }, { request: DIAL }, 'not json\n', '[1]\n']) {
      const out = await peerAttempt(await liveProxyCert(), bad);
      expect(out.answer).toMatchObject({ ok: false, error: { code: 'GW_ERR_PEER_PROTOCOL' } });
    }
  });

  it('the HTTP/2 transport (gateway-peer) serves a live Proxy, refuses a user certificate and a malformed stream', async () => {
    expect(await h2Attempt(await liveProxyCert())).toMatchObject({ status: 200 });
    expect(await h2Attempt(c.user)).toMatchObject({ closed: true });
    const out = await h2Attempt(await liveProxyCert(), { 'x-gateway-dial': '{"service":"nope"}' });
    expect(out.status).toBe(400);
    expect(JSON.parse(out.error!)).toMatchObject({ code: 'GW_ERR_PEER_PROTOCOL' });
    const ghost = await h2Attempt(await liveProxyCert(), { 'x-gateway-host': 'ghost-host' });
    expect(ghost.status).toBe(404);
  });
  it('hostile: an HTTP/2 session of a Proxy that has since left the cluster serves no more streams', async () => {
    const id = 'peer-that-leaves';
    const now = new Date().toISOString();
    await c.auth.auth.heartbeatProxy({ id, nodename: 'leaving', version: '1', public_addr: 'leaving:443', channels: {}, channels_digest: '', started_at: now, last_heartbeat: now }, 60_000);
    await waitUntil('B sees the Proxy', () => c.b.cluster.proxy(id) !== undefined);
    const cred = await hostCert(id, ['proxy']);
    const { host, port } = splitAddr(c.b.peer.address()!);
    const socket = tls.connect({ host, port, ca: c.auth.auth.host.tls.certPem, ALPNProtocols: [PEER_ALPN], checkServerIdentity: () => undefined, ...cred });
    socket.on('error', () => undefined);
    await new Promise((r) => socket.once('secureConnect', r));
    const session = http2.connect(`https://${host}`, { createConnection: () => socket });
    session.on('error', () => undefined);
    const ask = () =>
      new Promise<number | 'closed'>((resolve) => {
        // B drops a departed peer's connections now: the session may be gone before the next request.
        if (session.destroyed || session.closed) return resolve('closed');
        const req = session.request({ ':method': 'POST', ':path': PEER_PATH, 'x-gateway-host': 'ghost-host', 'x-gateway-dial': JSON.stringify(DIAL) });
        req.on('error', () => resolve('closed'));
        req.once('response', (h) => resolve(Number(h[':status'])));
        req.once('close', () => resolve('closed'));
        req.end();
      });
    expect(await ask()).toBe(404); // served: B holds no tunnel of that agent
    await c.auth.auth.removeProxy(id);
    await waitUntil('B no longer lists the Proxy', () => c.b.cluster.proxy(id) === undefined);
    expect(await ask()).not.toBe(404); // refused (403) or the session closed: nothing is served any more
    session.destroy();
  });
});

describe('metrics on the serving side (gateway_peer_streams_served_*)', () => {
  const scrape = async (name: string, labels: Record<string, string>) => sampleValue(parseExposition(await registry.metrics()), name, labels);
  beforeAll(() => enableMetrics());
  afterAll(() => enableMetrics(false));

  it("B counts the streams it served for A by A's host ID and outcome, open while they last; no address in the scrape", async () => {
    const peer = c.a.id;
    const count = async (outcome: string) => (await scrape('gateway_peer_streams_served_total', { peer, outcome })) ?? 0;
    const before = { ok: await count('ok'), bad: await count('GW_ERR_PEER_PROTOCOL'), missing: await count('GW_ERR_TUNNEL_NOT_FOUND'), open: (await scrape('gateway_peer_streams_served_open', { peer })) ?? 0 };
    const cred = await liveProxyCert();
    const client = new PeerClient({ tls: { ...cred, ca: c.auth.auth.host.tls.certPem }, clusterName: 'peering.example', dialer: new Dialer({ env: {} }), tlsHandshakeMs: 5000, dialTimeoutMs: 10_000, idleMs: 30_000, transport: 'tls' });
    try {
      const stream = await client.dial(c.a.cluster.proxy(c.b.id)!, c.agentIdentity.hostId, DIAL);
      expect(await scrape('gateway_peer_streams_served_open', { peer })).toBe(before.open + 1);
      const data = randomBytes(4096);
      expect(await echoDigest(stream, data)).toBe(sha256(data));
      await waitUntil('the served stream closed', async () => (await scrape('gateway_peer_streams_served_open', { peer })) === before.open);
    } finally {
      client.close();
    }
    expect(await peerAttempt(cred, 'not json\n')).toMatchObject({ answer: { ok: false } });
    expect(await peerAttempt(cred, { hostId: 'ghost-host', request: DIAL })).toMatchObject({ answer: { ok: false, error: { code: 'GW_ERR_TUNNEL_NOT_FOUND' } } });
    expect(await h2Attempt(cred)).toMatchObject({ status: 200 });
    expect(await count('ok')).toBe(before.ok + 2);
    expect(await count('GW_ERR_PEER_PROTOCOL')).toBe(before.bad + 1);
    expect(await count('GW_ERR_TUNNEL_NOT_FOUND')).toBe(before.missing + 1);
    expect(await registry.metrics()).not.toContain('127.0.0.1');
  });
});

describe('a locked Proxy loses its peering streams (issue 23)', () => {
  it('hostile: a stream a Proxy opened on B before it was locked is closed, and it cannot open another', async () => {
    const id = 'peer-that-is-locked';
    const now = new Date().toISOString();
    await c.auth.auth.heartbeatProxy({ id, nodename: 'locked', version: '1', public_addr: 'locked:443', channels: {}, channels_digest: '', started_at: now, last_heartbeat: now }, 600_000);
    await waitUntil('B sees the Proxy', () => c.b.cluster.proxy(id) !== undefined);
    const cred = await hostCert(id, ['proxy']);
    const { host, port } = splitAddr(c.b.peer.address()!);
    const socket = tls.connect({ host, port, ca: c.auth.auth.host.tls.certPem, ALPNProtocols: [PEER_ALPN_TLS], checkServerIdentity: () => undefined, ...cred });
    socket.on('error', () => undefined);
    let closed = false;
    socket.once('close', () => (closed = true));
    await new Promise((r) => socket.once('secureConnect', r));
    socket.write(`${JSON.stringify({ hostId: c.agentIdentity.hostId, request: DIAL })}\n`);
    expect(JSON.parse(await readLine(socket, { timeoutMs: 10_000 }))).toMatchObject({ ok: true });
    // The stream carries bytes to the agent's echo app and back.
    socket.write('ping');
    await new Promise<void>((resolve) => socket.once('data', (d: Buffer) => (expect(d.toString()).toBe('ping'), resolve())));
    await c.auth.auth.createLock(c.auth.auth.adminIdentity(), { target: { node: id } });
    await waitUntil('the locked Proxy\'s peering stream closed', () => closed);
    expect(c.b.cluster.proxy(id)).toBeUndefined();
    expect(await peerAttempt(cred)).toMatchObject({ closed: true });
  });
});

describe('the dial request across peering', () => {
  const request = { service: 'db', resource: 'orders', client_src: '192.0.2.7:1', client_dst: '192.0.2.1:443', user: 'alice' };
  const grant = { users: { allow: ['orders_app'], deny: ['postgres'] }, names: { allow: ['orders'], deny: [] } };

  it("carries the database grant to the Proxy that holds the agent's tunnel, as it is", () => {
    expect(parsePeerRequest(JSON.stringify({ hostId: 'h', request: { ...request, db_access: grant } }))).toEqual({ hostId: 'h', framed: false, request: { ...request, db_access: grant } });
    expect(parsePeerRequest(JSON.stringify({ hostId: 'h', request })).request.db_access).toBeUndefined();
  });

  it('hostile: a grant that is not one (wrong types, over the caps) is refused, not passed on or dropped', () => {
    for (const bad of [{ users: ['x'] }, { users: { allow: 'x', deny: [] }, names: grant.names }, { users: { allow: [1], deny: [] }, names: grant.names }, { users: { allow: Array(2000).fill('a'), deny: [] }, names: grant.names }, null, 'all']) {
      expect(() => parsePeerRequest(JSON.stringify({ hostId: 'h', request: { ...request, db_access: bad } })), JSON.stringify(bad)?.slice(0, 60)).toThrow(/db_access/);
    }
  });

  it('carries a W3C trace context to the Proxy that holds the tunnel (the agent\'s span is its child)', () => {
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    expect(parsePeerRequest(JSON.stringify({ hostId: 'h', request: { ...request, traceparent, tracestate: 'a=b' } })).request).toEqual({ ...request, traceparent, tracestate: 'a=b' });
  });

  it('hostile: a malformed traceparent is dropped (a new trace starts), a tracestate over 512 bytes dropped alone; the dial goes on', () => {
    const good = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    for (const traceparent of ['00-00000000000000000000000000000000-00f067aa0ba902b7-01', `${good}-00`, good.toUpperCase(), `01${good.slice(2)}`, 'x'.repeat(10_000), 7]) {
      expect(parsePeerRequest(JSON.stringify({ hostId: 'h', request: { ...request, traceparent, tracestate: 'a=b' } })).request, String(traceparent).slice(0, 60)).toEqual(request);
    }
    expect(parsePeerRequest(JSON.stringify({ hostId: 'h', request: { ...request, traceparent: good, tracestate: `a=${'b'.repeat(511)}` } })).request).toEqual({ ...request, traceparent: good });
  });
});

describe('the link and the agent change', () => {
  it('an agent B does not hold: B answers a clear error and forwards nowhere (no loop)', async () => {
    const out = await peerAttempt(await liveProxyCert(), { hostId: 'ghost-host', request: DIAL });
    expect(out.answer).toMatchObject({ ok: false, error: { code: 'GW_ERR_TUNNEL_NOT_FOUND' } });
    expect(out.answer!.error!.message).toContain(`Proxy ${c.b.id} holds no tunnel of agent ghost-host`);
  });

  it("A's router, told by a stale presence that B holds an agent, reports B's answer", async () => {
    const now = new Date().toISOString();
    await c.auth.auth.setPresence({ hostId: 'ghost-host', nodename: 'ghost', proxyId: c.b.id, services: ['app'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] }, connectedAt: now, lastHeartbeat: now }, 60_000);
    await waitUntil('A sees the ghost at B', () => c.a.cluster.locations('ghost-host').includes(c.b.id));
    const err = await c.a.router.dial('ghost-host', DIAL).then(() => undefined, (e: unknown) => e as { code: string; message: string });
    expect(err).toMatchObject({ code: 'GW_ERR_TUNNEL_NOT_FOUND' });
    expect(err!.message).toContain(`through Proxy ${c.b.id}: Proxy ${c.b.id} holds no tunnel of agent ghost-host`);
    await c.auth.auth.clearPresence('ghost-host', c.b.id);
  });

  it('an agent nobody holds: GW_ERR_TUNNEL_NOT_FOUND naming it and why', async () => {
    const r = new Router({ tunnels: c.a.tunnels, cluster: c.a.cluster });
    await expect(r.dial('nobody', DIAL)).rejects.toMatchObject({ code: 'GW_ERR_TUNNEL_NOT_FOUND', message: expect.stringContaining('agent nobody is not reachable from this Proxy: no tunnel to this Proxy') });
  });

  it("cut (B's peering listener stops) and restored: new client connections work again", async () => {
    await c.b.peer.stop();
    const refused = await c.refusal(c.a.addresses.web!);
    expect(['GW_ERR_PEER_UNREACHABLE', 'GW_ERR_TUNNEL_NOT_FOUND']).toContain(refused.code);
    await c.b.peer.start();
    // B publishes its new peering address with its next heartbeat; A picks it up from the cluster view.
    await waitUntil("A sees B's new peering address", () => c.a.cluster.proxy(c.b.id)?.peer_addr === c.b.peer.address());
    const data = randomBytes(256 * 1024);
    const stream = await c.open(c.a.addresses.web!);
    expect(await echoDigest(stream, data)).toBe(sha256(data));
  });
});

describe('gwctl probe through A (GET /v1/probe on its web port) reaches the agent B holds', () => {
  const probe = (cred: { key: string; cert: string }, query: string) => {
    const { host, port } = splitAddr(c.a.addresses.web!);
    return new Promise<{ status: number; body: Record<string, unknown> }>((resolve, reject) => {
      https
        .get({ host, port, path: `/v1/probe?${query}`, servername: 'localhost', ca: c.auth.auth.host.tls.certPem, ...cred, agent: false }, (res) => {
          let body = '';
          res.on('data', (d: Buffer) => (body += d.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(body) as Record<string, unknown> }));
        })
        .on('error', reject);
    });
  };

  it('each hop, the peer among them, for a user whose roles reach the app', async () => {
    const before = c.dials.length;
    const r = await probe(c.user, 'kind=app&name=echo');
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ kind: 'app', resource: 'echo', agent: 'agent-b', via: 'peer' });
    expect((r.body.hops as Array<{ hop: string }>).map((h) => h.hop)).toEqual(['find', 'peer', 'tunnel', 'resource']);
    expect(c.dials.length).toBe(before);
  });

  it('hostile: a host certificate may not probe; an absent resource is not found', async () => {
    expect((await probe(await hostCert('some-host', ['node']), 'kind=app&name=echo')).status).toBe(403);
    const absent = await probe(c.user, 'kind=app&name=nosuch');
    expect(absent.status).toBe(404);
    expect((absent.body.error as { code: string }).code).toBe('GW_ERR_TUNNEL_NOT_FOUND');
  });
});
