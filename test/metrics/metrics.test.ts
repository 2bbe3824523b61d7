/**
 * The metrics' own rules (src/metrics/): label values outside their declared set become `other` (a list, or a
 * pattern with a cap), the label-bound check of test/helpers/metrics.ts catches a metric registered without
 * bounds, the listener and route names cover the protocol table, and the hooks record what happened on real
 * sockets (a listener's accepted, refused, open and bytes; a dial's scheme and outcome). Values are read from the
 * one registry as the diagnostics listener renders it.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Counter } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AttemptLimiter, loginKey, reserveOrRefuse } from '../../src/auth/ratelimit.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger } from '../../src/log.js';
import { watchCertificate } from '../../src/metrics/certs.js';
import { counter, enableMetrics, HOST_ID, OTHER } from '../../src/metrics/define.js';
import { LISTENERS, refusalKind, ROUTES } from '../../src/metrics/listeners.js';
import { recordPeerStream } from '../../src/metrics/peering.js';
import { registry } from '../../src/metrics/registry.js';
import { guardedServer, closeServer, listenOn } from '../../src/net/listen.js';
import { ConnectionLimits } from '../../src/net/deadlines.js';
import { Multiplexer } from '../../src/mux/multiplexer.js';
import { PROTOCOLS } from '../../src/proxy/protocols.js';
import { formatLastRun, LAST_RUN_MAX_BYTES, parseLastRun, readLastRun, recordingLastRun } from '../../src/upgrade/lastrun.js';
import { waitUntil } from '../helpers/wait.js';
import { makeTestPki } from '../helpers/tls.js';
import { labelBoundViolations, parseExposition, sampleValue } from '../helpers/metrics.js';

// This process records, as a daemon with a diagnostics listener does.
enableMetrics();

async function scrape(name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
  return sampleValue(parseExposition(await registry.metrics()), name, labels);
}

describe('label bounds (define.ts)', () => {
  const test = counter({ name: 'gateway_test_bounds_total', help: 'test', area: 'test', labels: { kind: ['a', 'b'], peer: { ...HOST_ID, max: 2 } } });
  afterAll(() => registry.removeSingleMetric('gateway_test_bounds_total'));

  it('a value outside a list, or not matching a pattern, is recorded as other; a pattern keeps at most max values', async () => {
    const ids = ['0b6f1a52-2a3c-4d6e-8f00-0123456789ab', '1b6f1a52-2a3c-4d6e-8f00-0123456789ab', '2b6f1a52-2a3c-4d6e-8f00-0123456789ab'];
    test.inc({ kind: 'a', peer: ids[0]! });
    test.inc({ kind: 'alice@example.com', peer: '10.0.0.7:3021' });
    test.inc({ kind: 'b', peer: ids[1]! });
    test.inc({ kind: 'b', peer: ids[2]! }); // past the cap of 2
    const samples = parseExposition(await registry.metrics()).filter((s) => s.name === 'gateway_test_bounds_total');
    expect(samples.map((s) => s.labels).sort((x, y) => JSON.stringify(x).localeCompare(JSON.stringify(y)))).toEqual([
      { kind: 'a', peer: ids[0] },
      { kind: 'b', peer: ids[1] },
      { kind: 'b', peer: OTHER },
      { kind: OTHER, peer: OTHER },
    ]);
    expect(labelBoundViolations(samples)).toEqual([]);
  });

  it('records nothing while recording is off (a process without a diagnostics listener)', async () => {
    enableMetrics(false);
    try {
      test.inc({ kind: 'a', peer: OTHER });
      test.with({ kind: 'a', peer: OTHER }).inc();
    } finally {
      enableMetrics();
    }
    const samples = parseExposition(await registry.metrics()).filter((s) => s.name === 'gateway_test_bounds_total');
    expect(sampleValue(samples, 'gateway_test_bounds_total', { kind: 'a', peer: OTHER })).toBeUndefined();
  });

  it('the label-bound check fails on a metric registered without a declaration (an unbounded label)', async () => {
    const rogue = new Counter({ name: 'gateway_rogue_logins_total', help: 'test', labelNames: ['user'], registers: [registry] });
    rogue.inc({ user: 'alice' });
    try {
      expect(labelBoundViolations(parseExposition(await registry.metrics()))).toContain('gateway_rogue_logins_total: not declared in src/metrics/ (define.ts) and not a default process metric');
    } finally {
      registry.removeSingleMetric('gateway_rogue_logins_total');
    }
  });

  it('the listener and route names cover the protocol table', () => {
    for (const p of PROTOCOLS) {
      expect(ROUTES).toContain(p.name);
      if (p.ping) expect(ROUTES).toContain(`${p.name}-ping`);
      if ('listener' in p && p.listener) expect(LISTENERS).toContain(p.listener.name);
    }
  });

  it("the multiplexer's refusal reasons map onto the kinds an operator alerts on", () => {
    expect(['no-application-protocol', 'bad-proxy-header', 'proxy-protocol-untrusted-source', 'detect-timeout', 'hello-too-large', 'tls-not-served'].map(refusalKind)).toEqual([
      'alpn', 'proxy_header', 'proxy_header', 'deadline', 'bad_hello', 'not_served',
    ]);
  });
});

describe('listener hooks (src/net/deadlines.ts)', () => {
  const limits = new ConnectionLimits({ tlsHandshakeMs: 5000, headerMs: 5000, requestMs: 5000, idleMs: 5000, sshHandshakeMs: 5000, halfCloseLingerMs: 5000, maxConnections: 1, maxConnectionsPerSource: 10 }, { openFiles: null });
  let server: net.Server;
  let port: number;
  beforeAll(async () => {
    server = guardedServer(limits.listener('auth'), (socket) => {
      socket.on('data', (c: Buffer) => socket.write(c));
      socket.on('end', () => socket.end());
    });
    port = Number((await listenOn(server, { host: '127.0.0.1', port: 0 }, 'test')).split(':').pop());
  });
  afterAll(async () => {
    await closeServer(server);
    limits.close();
  });

  it('counts accepted and open connections, refusals at the cap, and bytes of an open connection at each scrape', async () => {
    const before = { accepted: (await scrape('gateway_connections_accepted_total', { listener: 'auth' })) ?? 0, refused: (await scrape('gateway_connections_refused_total', { listener: 'auth', reason: 'cap' })) ?? 0 };
    const a = net.connect(port, '127.0.0.1');
    a.write('x'.repeat(1000));
    await new Promise<void>((resolve) => a.once('data', () => resolve()));
    expect(await scrape('gateway_connections_open', { listener: 'auth' })).toBe(1);
    expect(await scrape('gateway_connections_accepted_total', { listener: 'auth' })).toBe(before.accepted + 1);
    // Still open: its bytes show at this scrape all the same.
    expect(await scrape('gateway_connection_bytes_total', { listener: 'auth', direction: 'received' })).toBeGreaterThanOrEqual(1000);
    // The cap is one connection: a second is refused.
    const b = net.connect(port, '127.0.0.1');
    b.on('error', () => undefined);
    await new Promise((resolve) => b.once('close', resolve));
    expect(await scrape('gateway_connections_refused_total', { listener: 'auth', reason: 'cap' })).toBe(before.refused + 1);
    a.end();
    await waitUntil('the connection released', async () => (await scrape('gateway_connections_open', { listener: 'auth' })) === 0);
  });
});

describe('route hooks (src/mux/multiplexer.ts through src/net/deadlines.ts)', () => {
  const limits = new ConnectionLimits({ tlsHandshakeMs: 5000, headerMs: 5000, requestMs: 5000, idleMs: 5000, sshHandshakeMs: 5000, halfCloseLingerMs: 5000, maxConnections: 10, maxConnectionsPerSource: 10 }, { openFiles: null });
  const mux = new Multiplexer({
    routes: [{ name: 'ssh', match: { sniffed: 'ssh' }, handler: (stream) => stream.on('data', (c: Buffer) => stream.write(c)).on('end', () => stream.end()) }],
    proxyProtocol: false,
    detectTimeoutMs: 5_000,
  });
  let server: net.Server;
  let port: number;
  beforeAll(async () => {
    server = guardedServer(limits.listener('web'), mux.handleSocket);
    port = Number((await listenOn(server, { host: '127.0.0.1', port: 0 }, 'test')).split(':').pop());
  });
  afterAll(async () => {
    await closeServer(server);
    limits.close();
  });

  it("counts a route's connections routed and open, and its bytes read from the socket (open, then closed)", async () => {
    const route = { route: 'ssh' };
    const before = { routed: (await scrape('gateway_connections_routed_total', route)) ?? 0, received: (await scrape('gateway_route_bytes_total', { ...route, direction: 'received' })) ?? 0 };
    const a = net.connect(port, '127.0.0.1');
    a.write('SSH-2.0-test\r\n');
    await new Promise<void>((resolve) => a.once('data', () => resolve()));
    a.write('y'.repeat(5000));
    let echoed = 0;
    await new Promise<void>((resolve) => a.on('data', (c: Buffer) => (echoed += c.length) >= 5000 && resolve()));
    expect(await scrape('gateway_connections_routed_total', route)).toBe(before.routed + 1);
    expect(await scrape('gateway_route_connections_open', route)).toBe(1);
    // Still open: its bytes show at this scrape, both ways.
    expect(await scrape('gateway_route_bytes_total', { ...route, direction: 'received' })).toBeGreaterThanOrEqual(before.received + 5000);
    expect(await scrape('gateway_route_bytes_total', { ...route, direction: 'sent' })).toBeGreaterThanOrEqual(5000);
    a.write('z'.repeat(3000));
    a.end();
    await waitUntil('the routed connection released', async () => (await scrape('gateway_route_connections_open', route)) === 0);
    // What it sent after the scrape is counted at its close.
    expect(await scrape('gateway_route_bytes_total', { ...route, direction: 'received' })).toBeGreaterThanOrEqual(before.received + 8000);
  });
});

describe('dial hooks (src/dial/dialer.ts)', () => {
  it('a direct dial that nothing answers is counted with its error code and timed', async () => {
    const free = net.createServer();
    await new Promise<void>((r) => free.listen(0, '127.0.0.1', r));
    const port = (free.address() as net.AddressInfo).port;
    await new Promise((r) => free.close(r));
    const labels = { scheme: 'direct', outcome: 'GW_ERR_DIAL_UNREACHABLE', auth: 'none' };
    const before = (await scrape('gateway_dials_total', labels)) ?? 0;
    await expect(new Dialer({ env: {} }).dial(`127.0.0.1:${port}`)).rejects.toThrow();
    expect(await scrape('gateway_dials_total', labels)).toBe(before + 1);
    expect(await scrape('gateway_dial_duration_seconds_count', { scheme: 'direct', result: 'error' })).toBeGreaterThanOrEqual(1);
  });
});

describe("the upgrader's last run (src/upgrade/lastrun.ts)", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-lastrun-'));
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  it('records a failed run with its code and the versions it compared, and reads it back', async () => {
    await expect(
      recordingLastRun(dir, async (versions) => {
        versions('17.0.0', '17.1.0');
        throw new GatewayError('GW_ERR_UPGRADE_HEALTH', 'boom');
      }, () => 1_767_578_400_000),
    ).rejects.toThrow('boom');
    expect(readLastRun(dir)).toEqual({ at: 1_767_578_400, result: 'failed', code: 'GW_ERR_UPGRADE_HEALTH', current: '17.0.0', target: '17.1.0' });
    await recordingLastRun(dir, async () => 'up-to-date' as const, () => 1_767_578_460_000);
    expect(readLastRun(dir)).toEqual({ at: 1_767_578_460, result: 'up-to-date' });
  });

  it('hostile files are no last run: not JSON, another shape, a free string as a version, oversized, a FIFO', async () => {
    const good = { version: 'v1', at: 1, result: 'upgraded' };
    for (const text of ['not json', '[]', JSON.stringify({ ...good, result: 'pwned' }), JSON.stringify({ ...good, target: 'alice <script>' }), JSON.stringify({ ...good, code: 'NOT_A_CODE' }), formatLastRun({ at: 1, result: 'waiting' }) + ' '.repeat(LAST_RUN_MAX_BYTES)]) {
      expect(parseLastRun(text)).toBeUndefined();
    }
    await writeFile(join(dir, 'last-run'), 'x'.repeat(LAST_RUN_MAX_BYTES * 4));
    expect(readLastRun(dir)).toBeUndefined();
    const fifoDir = await mkdtemp(join(tmpdir(), 'gw-lastrun-fifo-'));
    try {
      execFileSync('mkfifo', [join(fifoDir, 'last-run')]);
      // Read at every scrape: a FIFO must not block the agent (nothing ever writes to this one).
      expect(readLastRun(fifoDir)).toBeUndefined();
    } finally {
      await rm(fifoDir, { recursive: true, force: true });
    }
  });
});

describe('state read at the scrape, and the other hooks', () => {
  it('a rate-limit refusal is counted by limit, the user and the address left out', async () => {
    const before = (await scrape('gateway_rate_limit_hits_total', { limit: 'login' })) ?? 0;
    const limiter = new AttemptLimiter({ maxFailures: 1 });
    reserveOrRefuse(limiter, loginKey('alice', '10.0.0.7'), 'login', {}, createLogger({ level: 'silent' })).fail();
    expect(() => reserveOrRefuse(limiter, loginKey('alice', '10.0.0.7'), 'login', {}, createLogger({ level: 'silent' }))).toThrow();
    expect(await scrape('gateway_rate_limit_hits_total', { limit: 'login' })).toBe(before + 1);
    expect(await registry.metrics()).not.toMatch(/alice|10\.0\.0\.7/);
  });

  it("a certificate's expiry is read from the one in use at each scrape (a renewed one shows at the next)", async () => {
    const pki = await makeTestPki();
    let pem: string | undefined = pki.caPem;
    const stop = watchCertificate('agent_host', () => pem);
    try {
      const expected = Math.floor(Date.parse(new X509Certificate(pki.caPem).validTo) / 1000);
      expect(await scrape('gateway_certificate_expiry_timestamp_seconds', { role: 'agent_host' })).toBe(expected);
      pem = (await pki.serverCert({ names: ['node-1'], ips: [] })).certPem;
      expect(await scrape('gateway_certificate_expiry_timestamp_seconds', { role: 'agent_host' })).toBe(Math.floor(Date.parse(new X509Certificate(pem).validTo) / 1000));
      pem = 'not a certificate';
      expect(await scrape('gateway_certificate_expiry_timestamp_seconds', { role: 'agent_host' })).toBeUndefined();
    } finally {
      stop();
    }
    expect(await scrape('gateway_certificate_expiry_timestamp_seconds', { role: 'agent_host' })).toBeUndefined();
  });

  it('a peer is named by its host ID; an address given in its place is other', async () => {
    const id = '3b6f1a52-2a3c-4d6e-8f00-0123456789ab';
    recordPeerStream(id, 'GW_ERR_PEER_UNREACHABLE');
    recordPeerStream('10.0.0.9:3021', 'ok');
    expect(await scrape('gateway_peer_streams_total', { peer: id, outcome: 'GW_ERR_PEER_UNREACHABLE' })).toBe(1);
    expect(await scrape('gateway_peer_streams_total', { peer: OTHER, outcome: 'ok' })).toBeGreaterThanOrEqual(1);
    expect(await registry.metrics()).not.toContain('10.0.0.9');
  });
});
