/**
 * The agent pool (src/agent/pool.ts).
 *
 * Behind a real HAProxy: three, then four Proxies (startProxyRole, each its own host ID and web port) on one
 * in-process Auth Service, HAProxy in TCP mode with round robin in front of them, and an agent that knows only
 * HAProxy's address. It ends with one tunnel to each Proxy (each Proxy sees it come from HAProxy's source
 * address), adds one for a Proxy that joins, drops the one to a Proxy that leaves gracefully and does not dial
 * for it again, and keeps exactly agent_connection_count tunnels under proxy_peering. The cluster's presence
 * lists the agent on each Proxy it holds, and `gwctl get nodes` (the built CLI) shows it once, with them all.
 *
 * Against a fake Proxy that says what no real one says (hostile): a discovery of 10 000 Proxies, a count of a
 * billion, garbage; the pool keeps at most MAX_POOL_LINKS tunnels. And the duplicate answer, step by step.
 */
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import https from 'node:https';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { AgentPool, DialGate, MAX_POOL_LINKS, desiredLinks, type PoolView } from '../../src/agent/pool.js';
import { TunnelAgent } from '../../src/agent/tunnel.js';
import { generateKeyPair } from '../../src/auth/pki.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole, type ProxyRole } from '../../src/roles/proxy.js';
import { BIN, runCli } from '../helpers/gateway.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { waitUntil } from '../helpers/wait.js';
import { startBalancer, type Balancer } from '../helpers/haproxy.js';
import type { ControlMessage } from '../../src/tunnel/protocol.js';
import { FakeProxy, fakeIdentity, type ControlSession } from './fakeproxy.js';

// POOL_LOG=debug shows the pool's, the tunnels' and the Proxies' logs (JSON lines on standard error).
setRootLogger(createLogger({ level: (process.env.POOL_LOG as 'debug' | undefined) ?? 'silent' }));

const LB_IP = '127.0.0.4';
/** HAProxy connects to the Proxies from here: a tunnel that came through it shows this address. */
const LB_SOURCE = '127.0.0.5';

let echo: net.Server;
const echoPort = () => (echo.address() as net.AddressInfo).port;

beforeAll(async () => {
  // A tunnel torn down resets its streams' resources (src/stream/splice.ts): the echo hears an RST, not a FIN.
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
});
afterAll(() => void echo.close());

/** A pool for identity whose one resource is the echo server (db "pg"); quick retries for a test. */
function newPool(identity: HostIdentity, extra: Partial<ConstructorParameters<typeof AgentPool>[0]> = {}): AgentPool {
  return new AgentPool({
    identity,
    dialer: new Dialer({ env: {} }),
    services: ['db'],
    resources: { databases: [{ name: 'pg', protocol: 'postgres', labels: {} }], apps: [], desktops: [], kube_clusters: [] },
    connectResource: async (request) => {
      if (request.resource !== 'pg') throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no db "${request.resource}"`);
      return net.connect(echoPort(), '127.0.0.1');
    },
    backoff: { firstMs: 20, maxMs: 300 },
    dialsPerSecond: 20,
    dialBurst: 8,
    ...extra,
  });
}

describe('desiredLinks and DialGate', () => {
  const view = (n: number, strategy: PoolView['strategy']): PoolView => ({
    ids: new Set(Array.from({ length: n }, (_, i) => `p-${i}`)),
    strategy,
  });

  it('one before any discovery; every Proxy listed (agent_mesh); the count, no more than listed (proxy_peering); never over the cap', () => {
    expect(desiredLinks(undefined)).toBe(1);
    expect(desiredLinks(view(3, { type: 'agent_mesh' }))).toBe(3);
    expect(desiredLinks(view(0, { type: 'agent_mesh' }))).toBe(1);
    expect(desiredLinks(view(3, { type: 'proxy_peering', agent_connection_count: 2 }))).toBe(2);
    expect(desiredLinks(view(1, { type: 'proxy_peering', agent_connection_count: 2 }))).toBe(1);
    // Hostile: ten thousand Proxies, a count of a billion, a cap below one.
    expect(desiredLinks(view(10_000, { type: 'agent_mesh' }))).toBe(MAX_POOL_LINKS);
    expect(desiredLinks(view(10_000, { type: 'proxy_peering', agent_connection_count: 1e9 }))).toBe(MAX_POOL_LINKS);
    expect(desiredLinks(view(3, { type: 'agent_mesh' }), 0)).toBe(1);
  });

  it('the gate lets a burst through, then one dial per token; close() lets every waiter go', async () => {
    const gate = new DialGate(1000, 2);
    let passed = 0;
    const waits = Array.from({ length: 5 }, () => gate.wait().then(() => passed++));
    await waits[0];
    await waits[1];
    await Promise.all(waits);
    expect(passed).toBe(5);
    const slow = new DialGate(0.001, 1);
    await slow.wait(); // the burst
    const stuck = slow.wait();
    slow.close();
    await stuck;
    expect(() => new DialGate(0, 1)).toThrow(GatewayError);
  });
});

describe('several Proxies behind HAProxy (TCP, round robin)', () => {
  let dir: string;
  let base: GatewayConfig;
  let limits: ConnectionLimits;
  const authLife = new Lifecycle();
  let auth: AuthRole;
  let balancer: Balancer | undefined;
  let lbAddr: string;
  const ports: number[] = [];
  const proxies = new Map<string, { role: ProxyRole; life: Lifecycle }>();
  let identity: HostIdentity;
  let pool: AgentPool;

  const configFor = (webPort: number): GatewayConfig =>
    parseConfig(
      [
        'gateway:',
        '  nodename: localhost',
        `  data_dir: ${join(dir, 'data')}`,
        'auth_service:',
        '  cluster_name: pool.example',
        '  listen_addr: 127.0.0.1:0',
        'proxy_service:',
        `  web_listen_addr: 127.0.0.1:${webPort}`,
        `  public_addr: ${lbAddr}`,
        '',
      ].join('\n'),
      'pool test',
    );

  async function startProxy(n: number): Promise<string> {
    const id = `00000000-0000-4000-8000-00000000000${n}`;
    const life = new Lifecycle();
    const role = await startProxyRole({ config: configFor(ports[n - 1]!), auth: auth.auth, api: auth.api, limits, dialer: new Dialer({ env: {} }), lifecycle: life, proxyId: id });
    proxies.set(id, { role, life });
    return id;
  }

  const held = () => pool.links().join(',');
  const live = () => [...proxies.keys()].sort().join(',');

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-pool-'));
    lbAddr = `${LB_IP}:${await getPort({ host: LB_IP })}`;
    for (let i = 0; i < 4; i++) ports.push(await getPort({ host: '127.0.0.1' }));
    base = configFor(0);
    limits = new ConnectionLimits(limitSettings(base));
    authLife.onStop('backend', () => limits.close());
    auth = await startAuthRole({ config: base, limits, lifecycle: authLife });
    // Four servers from the start: the fourth refuses until its Proxy runs, and HAProxy sends that dial elsewhere.
    balancer = await startBalancer({
      dir,
      bind: { host: LB_IP, port: Number(lbAddr.split(':')[1]) },
      servers: Object.fromEntries(ports.map((p, i) => [`p${i + 1}`, `127.0.0.1:${p}`])),
      source: LB_SOURCE,
      idleTimeout: '120s',
    });
    for (const n of [1, 2, 3]) await startProxy(n);
    // The agent's identity, issued by the Auth Service; its server is the balancer, nothing else.
    const keys = generateKeyPair();
    const bundle = await auth.auth.joinLocal({ roles: ['db'], nodename: 'pool-agent', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
    const agentDir = join(dir, 'agent');
    saveHostIdentity(agentDir, keys.privateKeyPem, bundle, { roles: ['db'], nodename: 'pool-agent', server: lbAddr, joinedVia: 'proxy' });
    identity = loadHostIdentity(agentDir)!;
  });

  afterAll(async () => {
    pool?.stop();
    for (const { life } of proxies.values()) await life.stop().catch(() => undefined);
    await balancer?.stop();
    await authLife.stop().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  });

  it('the agent dials the balancer only and ends with one tunnel to each of the 3 Proxies, each carrying bytes', async () => {
    pool = newPool(identity);
    pool.start();
    await waitUntil('a tunnel to each of the 3 Proxies', () => held() === live() && pool.size === 3);
    expect(pool.getState()).toBe('connected');
    for (const { role } of proxies.values()) {
      const agent = role.tunnels.get(identity.hostId)!;
      expect(agent.remote.startsWith(`${LB_SOURCE}:`)).toBe(true); // through HAProxy, not directly
      const channel = await role.tunnels.dial(identity.hostId, { service: 'app', resource: 'pg', client_src: '127.0.0.1:1', client_dst: '127.0.0.1:2' });
      channel.write(`through ${role.cluster.selfId}`);
      const [echoed] = (await once(channel, 'data')) as [Buffer];
      expect(echoed.toString()).toBe(`through ${role.cluster.selfId}`);
      channel.destroy();
    }
  });

  it('a Proxy that holds the agent answers `duplicate` to a new tunnel whose hello says so, and keeps the one it has', async () => {
    const before = new Map([...proxies].map(([id, { role }]) => [id, role.tunnels.get(identity.hostId)!.connectedAt]));
    // One more tunnel of the same agent, through the balancer, that says it holds every Proxy.
    const extra = new TunnelAgent({
      identity,
      dialer: new Dialer({ env: {} }),
      services: ['db'],
      resources: { databases: [], apps: [], desktops: [], kube_clusters: [] },
      connectResource: () => Promise.reject(new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', 'none')),
      holds: () => [...proxies.keys()],
      backoff: { firstMs: 60_000, maxMs: 60_000 },
    });
    const duplicate = once(extra, 'duplicate');
    const connected: string[] = [];
    extra.on('connected', (id: string) => connected.push(id));
    extra.start();
    try {
      const [id] = (await duplicate) as [string];
      expect(proxies.has(id)).toBe(true);
    } finally {
      extra.stop();
    }
    expect(connected).toEqual([]);
    for (const [id, at] of before) expect(proxies.get(id)!.role.tunnels.get(identity.hostId)!.connectedAt).toBe(at);
    expect(held()).toBe(live());
  });

  it('the cluster lists the agent on each Proxy, /webapi/find lists every Proxy, and `gwctl get nodes` shows the agent once with them all', async () => {
    await waitUntil('presence on each Proxy', async () => {
      const mine = (await auth.auth.listPresence()).filter((p) => p.hostId === identity.hostId);
      return mine.map((p) => p.proxyId).sort().join(',') === live();
    });
    // /webapi/find through the balancer (whichever Proxy answers) names them all.
    const find = await new Promise<{ proxies: Array<{ id: string; public_addr: string }> }>((resolve, reject) => {
      const [host, port] = lbAddr.split(':');
      https
        .get({ host, port: Number(port), path: '/webapi/find', ca: auth.auth.host.tls.certPem, agent: false }, (res) => {
          let text = '';
          res.on('data', (c: Buffer) => (text += c.toString()));
          res.on('end', () => resolve(JSON.parse(text) as { proxies: Array<{ id: string; public_addr: string }> }));
        })
        .once('error', reject);
    });
    expect(find.proxies.map((p) => p.id).sort().join(',')).toBe(live());
    expect(new Set(find.proxies.map((p) => p.public_addr))).toEqual(new Set([lbAddr]));
    if (!existsSync(BIN('gwctl'))) throw new Error('dist/ is missing: run npm run build first (the test runs the built gwctl)');
    const r = await runCli('gwctl', ['--auth-server', auth.address, '--data-dir', join(dir, 'data'), 'get', 'nodes', '--format', 'json']);
    expect(r.stderr).toBe('');
    const nodes = (JSON.parse(r.stdout) as Array<{ metadata: { name: string }; spec: { status: string; proxies: string[] } }>).filter((n) => n.metadata.name === identity.hostId);
    expect(nodes).toHaveLength(1);
    expect(nodes[0]!.spec).toMatchObject({ status: 'online', proxies: [...proxies.keys()].sort() });
  });

  it('a 4th Proxy joins: the agent adds a tunnel to it, and the tunnels it had stay (landing on them again replaced none)', async () => {
    const before = new Map([...proxies].map(([id, { role }]) => [id, role.tunnels.get(identity.hostId)!.connectedAt]));
    const fourth = await startProxy(4);
    await waitUntil('a tunnel to the 4th Proxy', () => held() === live() && pool.size === 4);
    expect(pool.links()).toContain(fourth);
    for (const [id, at] of before) expect(proxies.get(id)!.role.tunnels.get(identity.hostId)!.connectedAt).toBe(at);
  });

  it('a Proxy stops gracefully: its record goes, its tunnel is dropped and the agent does not dial for it again', async () => {
    const leaving = '00000000-0000-4000-8000-000000000002';
    const { life } = proxies.get(leaving)!;
    proxies.delete(leaving);
    await life.stop();
    expect((await auth.auth.listProxies()).map((p) => p.id)).not.toContain(leaving);
    await waitUntil('the tunnels of the 3 Proxies left, and no more', () => held() === live() && pool.size === 3);
    expect(pool.cluster()!.ids.has(leaving)).toBe(false);
    const presence = (await auth.auth.listPresence()).filter((p) => p.hostId === identity.hostId);
    expect(presence.map((p) => p.proxyId)).not.toContain(leaving);
  });

  it('a Proxy that dies without a word (its record no longer refreshed) leaves every list at its TTL, and the pool with it', async () => {
    // What a Proxy killed with SIGKILL leaves behind: its record, until the TTL it was written with runs out.
    const ghost = '00000000-0000-4000-8000-0000000000ff';
    const record = { ...(await auth.auth.listProxies())[0]!, id: ghost, nodename: 'ghost' };
    await auth.auth.heartbeatProxy(record, 1500);
    await waitUntil('the pool wants the ghost too', () => pool.cluster()!.ids.has(ghost) && pool.size === 4);
    expect(pool.links()).not.toContain(ghost); // no Proxy behind the balancer answers as it
    await waitUntil('the ghost gone from the cluster and the pool', () => !pool.cluster()!.ids.has(ghost) && pool.size === 3 && held() === live());
    expect((await auth.auth.listProxies()).map((p) => p.id)).not.toContain(ghost);
  });

  it('proxy_peering with agent_connection_count 2: exactly 2 tunnels; back to agent_mesh: one to each again', async () => {
    await auth.auth.setTunnelStrategy({ type: 'proxy_peering', agent_connection_count: 2 });
    await waitUntil('2 tunnels', () => pool.links().length === 2 && pool.size === 2);
    expect(pool.cluster()!.strategy).toEqual({ type: 'proxy_peering', agent_connection_count: 2 });
    for (const id of pool.links()) expect(proxies.has(id)).toBe(true);
    await auth.auth.setTunnelStrategy({ type: 'agent_mesh' });
    await waitUntil('a tunnel to each Proxy again', () => held() === live() && pool.size === 3);
  });
});

describe('against a fake Proxy', () => {
  let pki: TestPki;
  let cert: { certPem: string; keyPem: string };
  let proxy: FakeProxy;
  let pool: AgentPool | undefined;

  beforeAll(async () => {
    pki = await makeTestPki();
    cert = await pki.serverCert({ names: ['node-1'], ips: [] });
  });
  afterAll(async () => pki.cleanup());
  afterEach(async () => {
    pool?.stop();
    await proxy.stop();
  });

  const welcome = (s: ControlSession, proxyId: string) => s.send({ type: 'welcome', proxyId, heartbeatIntervalMs: 60_000, heartbeatCountMax: 3 });

  it('hostile: a discovery of 10 000 Proxies, a count of a billion, garbage: at most MAX_POOL_LINKS tunnels', async () => {
    proxy = new FakeProxy();
    await proxy.start(pki);
    const many = Array.from({ length: 10_000 }, (_, i) => ({ id: `p-${i}`, addr: proxy.webAddr }));
    // Every connection is "another Proxy" from the list: the most the pool could ever be tempted to hold.
    proxy.arrivals.on('session', (s: ControlSession) => {
      void s.next('hello').then(() => {
        const id = `p-${proxy.sessions.indexOf(s)}`;
        welcome(s, id);
        s.send({ type: 'discovery', proxies: many, strategy: { type: 'agent_mesh' } });
      });
    });
    pool = newPool(fakeIdentity(cert, proxy.webAddr, proxy.hostCa), { dialsPerSecond: 200, dialBurst: 50 });
    pool.start();
    await waitUntil('the pool full', () => pool!.links().length === MAX_POOL_LINKS);
    expect(pool.size).toBe(MAX_POOL_LINKS);
    expect(proxy.sessions.length).toBe(MAX_POOL_LINKS); // every tunnel up, none dialling: no more will come
    const first = proxy.sessions[0]!;
    first.send({ type: 'discovery', proxies: many, strategy: { type: 'proxy_peering', agent_connection_count: 1e9 } });
    first.send({ type: 'discovery', proxies: 'all of them' } as Record<string, unknown>);
    first.send({ type: 'discovery', proxies: [{ id: 7, addr: 'x' }] } as Record<string, unknown>);
    first.send({ type: 'discovery', proxies: [{ id: 'not-the-sender', addr: 'x' }] }); // does not list p-0: ignored
    // A valid one: only p-0 is left. Every other tunnel is dropped and not dialled again.
    first.send({ type: 'discovery', proxies: [{ id: 'p-0', addr: proxy.webAddr }] });
    await waitUntil('one tunnel left', () => pool!.links().join() === 'p-0' && pool!.size === 1);
    expect(proxy.sessions.length).toBe(MAX_POOL_LINKS);
    await waitUntil('the dropped tunnels closed', () => proxy.sessions.filter((s) => !s.closed).length === 1);
  });

  it('asks for a renewal over the next live tunnel when one goes while asking; the Proxy that answers is the one used', async () => {
    proxy = new FakeProxy();
    await proxy.start(pki);
    const two = [{ id: 'p-0', addr: '' }, { id: 'p-1', addr: '' }];
    let asked = 0;
    proxy.arrivals.on('session', (s: ControlSession) => {
      void s.next('hello').then(() => {
        const id = `p-${proxy.sessions.indexOf(s)}`;
        welcome(s, id);
        s.send({ type: 'discovery', proxies: two.map((p) => ({ ...p, addr: proxy.webAddr })), strategy: { type: 'agent_mesh' } });
        // The first Proxy asked closes the tunnel (as a Proxy that goes down); the next one answers.
        s.on('message', (m: ControlMessage) => {
          if (m.type !== 'renew') return;
          if (++asked === 1) s.conn.end();
          else s.send({ type: 'renewal', id: m.id, certs: { tls_cert: `tls from ${id}`, ssh_cert: 'ssh' } });
        });
      });
    });
    pool = newPool(fakeIdentity(cert, proxy.webAddr, proxy.hostCa), { dialsPerSecond: 200, dialBurst: 50 });
    pool.start();
    await waitUntil('two tunnels', () => pool!.links().length === 2);
    const certs = await pool.requestRenewal('the key');
    expect(asked).toBe(2);
    expect(certs.tlsCert).toMatch(/^tls from p-[01]$/);
  });

  it('tells each Proxy what it holds; a `duplicate` closes that tunnel and it dials again; a welcome from a held Proxy replaces the old tunnel', async () => {
    proxy = new FakeProxy();
    await proxy.start(pki);
    pool = newPool(fakeIdentity(cert, proxy.webAddr, proxy.hostCa));
    const duplicates: string[] = [];
    pool.on('duplicate', (id: string) => duplicates.push(id));
    pool.sendEvent({ queued: 'while no tunnel was up' });
    pool.start();
    const s0 = await proxy.session(0);
    expect((await s0.next('hello')).holds).toEqual([]);
    welcome(s0, 'p-a');
    s0.send({ type: 'discovery', proxies: [{ id: 'p-a', addr: 'lb:443' }, { id: 'p-b', addr: 'lb:443' }] });
    expect((await s0.next('event')).event).toEqual({ queued: 'while no tunnel was up' });

    const s1 = await proxy.session(1);
    expect((await s1.next('hello')).holds).toEqual(['p-a']);
    s1.send({ type: 'duplicate', proxyId: 'p-a' });
    await s1.gone();
    expect(duplicates).toEqual(['p-a']);
    expect(pool.links()).toEqual(['p-a']);

    // The Proxy p-a lost the first tunnel without the agent noticing, and took this one as the agent's.
    const s2 = await proxy.session(2);
    expect((await s2.next('hello')).holds).toEqual(['p-a']);
    welcome(s2, 'p-a');
    await s0.gone();
    const s3 = await proxy.session(3);
    expect((await s3.next('hello')).holds).toEqual(['p-a']);
    welcome(s3, 'p-b');
    await waitUntil('p-a and p-b', () => pool!.links().join() === 'p-a,p-b');
    expect(pool.size).toBe(2);
    expect(s2.closed).toBe(false);
  });
});
