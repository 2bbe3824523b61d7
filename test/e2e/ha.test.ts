/**
 * The high-availability topology of docs/high-availability.md, with the real binaries and real peers:
 *
 *          ns-agent                  root namespace                         ns-proxy
 *   ┌──────────────────┐      ┌──────────────────────┐      ┌───────────────────────────────────────────┐
 *   │ agent (app bulk) │─────►│ squid (agent's only  │─────►│ HAProxy P.2:443 (TCP, round robin,        │
 *   │ HTTPS_PROXY=squid│      │ way out)             │      │   send-proxy-v2) ─► Proxy 1, 2, 3 (4)     │
 *   │ bulk server      │      │ clients: gwsh, gwctl │─────►│   (proxy only, joined with proxy tokens)  │
 *   └──────────────────┘      └──────────────────────┘      │ Auth A :3025, Auth B :3125 ─► PostgreSQL  │
 *                                                           └───────────────────────────────────────────┘
 *
 * Every transfer is byte-exact and an end-to-end stream (a Proxy logged it routed), though gwsh's grant session and
 * its streams land on different Proxies (round robin): any Proxy routes a grant another signed.
 * Faults, each checked with bytes end to end: kill -9 of the Proxy a client streams through (the client's next
 * connection goes through HAProxy to another Proxy, which reaches the agent on its own tunnel); kill -9 of an
 * Auth Service; a PostgreSQL restart (a lock made afterwards still closes a session on every Proxy, so every
 * watch resumed; the event-by-event check against the model is test/backend/postgres-faults.test.ts); a Proxy
 * added and one removed while the agent is connected. Nothing asserts how fast anything happens.
 */
import { type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from "vitest";
import { BULK_SERVER_SOURCE, expectedDownloadSha256, transfer } from '../helpers/bulk.js';
import { runCleanup } from '../helpers/cleanup.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { createFirewall, startGatewayIn, startRestartableSquid, type Firewall, type NsGateway, type RestartableSquid } from '../helpers/firewall.js';
import { BIN, runCli } from '../helpers/gateway.js';
import { startBalancer, type Balancer } from '../helpers/haproxy.js';
import { parseExposition, sampleValue } from '../helpers/metrics.js';
import { rootSuite } from '../helpers/root.js';
import { parseAccessLogLine } from '../helpers/squid.js';
import { eventually } from '../helpers/wait.js';
import { spawn } from 'node:child_process';

const describeAsRoot = rootSuite(['netns', 'port443']);

const PROXY_NAME = 'proxy.gw.test';
const LB_PORT = 443;
const PG_PORT = 5432;
const AUTH_PORTS = { a: 3025, b: 3125 } as const;
const BULK_PORT = 7000;
const PASSWORD = 'correct horse battery';
const KiB = 1024;

let fw: Firewall;
let dir: string;
let squid: RestartableSquid;
let pg: PostgresServer;
const auths: Partial<Record<'a' | 'b', NsGateway>> = {};
const proxies: NsGateway[] = [];
let lb: Balancer;
let agent: NsGateway;
let bulkServer: ChildProcess;
let pin: string;
let aliceEnv: Record<string, string>;
const gwshChildren: ChildProcess[] = [];

const lbAddr = () => `${PROXY_NAME}:${LB_PORT}`;
const gwctlOn = (auth: NsGateway, args: string[]) => runCli('gwctl', ['--data-dir', auth.dataDir, ...args], { env: { HOME: dir } });
const gwctl = (args: string[]) => gwctlOn(auths.a ?? auths.b!, args);

const authConfig = (name: 'a' | 'b') =>
  [
    'gateway:',
    `  nodename: auth-${name}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json }',
    `  storage: { type: postgres, conn_string: "${pg.url()}" }`,
    'auth_service:',
    '  cluster_name: ha.example',
    `  listen_addr: ${fw.proxyIp}:${AUTH_PORTS[name]}`,
    '  keep_alive_interval: 1s',
    '  keep_alive_count_max: 3',
    'proxy_service: { enabled: no }',
    '',
  ].join('\n');

const proxyConfig = (n: number) =>
  [
    'gateway:',
    `  nodename: proxy-${n}`,
    '  data_dir: DATA_DIR',
    `  diag_addr: ${fw.proxyIp}:${9100 + n}`,
    '  log: { format: json }',
    `  auth_server: [${fw.proxyIp}:${AUTH_PORTS.a}, ${fw.proxyIp}:${AUTH_PORTS.b}]`,
    'auth_service: { enabled: no }',
    'proxy_service:',
    '  enabled: yes',
    `  web_listen_addr: ${fw.proxyIp}:${3080 + n}`,
    `  peer_listen_addr: ${fw.proxyIp}:${4020 + n}`,
    `  public_addr: [${lbAddr()}, ${fw.proxyIp}:${LB_PORT}]`,
    '  proxy_protocol: on',
    '',
  ].join('\n');

const agentConfig = [
  'gateway:',
  '  nodename: agent-1',
  '  data_dir: DATA_DIR',
  '  log: { format: json }',
  'app_service:',
  '  enabled: yes',
  '  apps:',
  `    - { name: bulk, uri: tcp://127.0.0.1:${BULK_PORT}, labels: { env: test } }`,
  '',
].join('\n');

async function token(type: string): Promise<string> {
  const r = await gwctl(['tokens', 'add', `--type=${type}`, '--ttl=10m', '--format', 'json']);
  if (r.status !== 0) throw new Error(r.stderr);
  return (JSON.parse(r.stdout) as { token: string }).token;
}

async function startProxy(n: number): Promise<NsGateway> {
  const p = await startGatewayIn(fw, fw.proxyNs, proxyConfig(n), { name: `proxy-${n}`, args: ['--token', await token('proxy'), '--ca-pin', pin] });
  proxies[n - 1] = p;
  return p;
}

interface NodeSpec {
  metadata: { name: string };
  spec: { status: string; proxies?: string[] };
}

/** The Proxies the agent holds a tunnel to, from the cluster's presence records. */
async function agentTunnels(): Promise<string[]> {
  const r = await gwctl(['get', 'nodes', '--format', 'json']);
  if (r.status !== 0) throw new Error(r.stderr);
  const node = (JSON.parse(r.stdout) as NodeSpec[]).find((x) => x.metadata.name === agent.hostId);
  return node?.spec.status === 'online' ? [...(node.spec.proxies ?? [])].sort() : [];
}

async function liveProxies(): Promise<string[]> {
  const r = await gwctl(['get', 'proxies', '--format', 'json']);
  if (r.status !== 0) throw new Error(r.stderr);
  return (JSON.parse(r.stdout) as Array<{ metadata: { name: string } }>).map((p) => p.metadata.name).sort();
}

/** A Proxy's metric (its diag_addr /metrics, from the root namespace, which reaches P.2); 0 when absent. */
async function proxyMetric(p: NsGateway, name: string, labels: Record<string, string> = {}): Promise<number> {
  const n = proxies.indexOf(p) + 1;
  const r = await fetch(`http://${fw.proxyIp}:${9100 + n}/metrics`);
  if (!r.ok) throw new Error(`proxy-${n} /metrics: ${r.status}`);
  return sampleValue(parseExposition(await r.text()), name, labels) ?? 0;
}

const running = () => proxies.filter((p) => p.hostId !== undefined && p.pid > 0 && !stopped.has(p));
const stopped = new Set<NsGateway>();

/** `gwsh proxy app bulk --port PORT`, resolving once it listens. */
async function gwshProxy(port: number): Promise<void> {
  const child = spawn(process.execPath, [BIN('gwsh'), 'proxy', 'app', 'bulk', '--port', String(port)], { env: { PATH: process.env.PATH ?? '', ...aliceEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
  gwshChildren.push(child);
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  await eventually(`gwsh proxy app listens on ${port}`, async () => {
    if (child.exitCode !== null) throw new Error(`gwsh exited: ${output}`);
    if (!output.includes(`127.0.0.1:${port}`)) throw new Error(output);
  }, 20_000);
}

/** The end-to-end streams the running Proxies routed since `since`: which Proxy routed each, and which signed its grant. */
function routedSince(since: Map<NsGateway, number>): Array<{ proxy: string; issuer: string | undefined }> {
  return running().flatMap((p) =>
    p
      .logs()
      .slice(since.get(p) ?? 0)
      .split('\n')
      .filter((line) => line.includes('end-to-end stream routed'))
      .map((line) => ({ proxy: p.hostId!, issuer: /"issuer":"([^"]+)"/.exec(line)?.[1] })),
  );
}

let nextId = 1;
/**
 * One transfer through `gwsh proxy app`, byte-exact both ways, and end to end: some Proxy routed it as an end-to-end
 * stream (gwsh falls back to the classic route silently under --e2e auto, so the bytes alone would not say).
 */
async function byteExact(port: number, size = 256 * KiB): Promise<Array<{ proxy: string; issuer: string | undefined }>> {
  const id = nextId++;
  const since = new Map(running().map((p) => [p, p.logs().length]));
  const r = await transfer('127.0.0.1', port, { id, upload: size, download: size, seed: id, timeoutMs: 20_000 });
  if (r.server.received.sha256 !== r.sent.sha256 || r.received.sha256 !== expectedDownloadSha256(size, id)) throw new Error(`transfer ${id} was not byte-exact`);
  const routed = routedSince(since);
  if (routed.length === 0) {
    const refusals = running().flatMap((p) => p.logs().slice(since.get(p) ?? 0).split('\n').filter((l) => /end-to-end|grant/.test(l)));
    throw new Error(`transfer ${id} was not end to end: no Proxy logged 'end-to-end stream routed' (gwsh took the classic route); the Proxies logged: ${refusals.join('\n').slice(0, 3000)}`);
  }
  return routed;
}

/** Which running Proxy logged the client connection of transfer id (its "connection to a resource opened" line). */
function proxyServing(since: Map<NsGateway, number>): NsGateway | undefined {
  // The classic route's line, or an end-to-end stream's (gwsh's default).
  return running().find((p) => /connection to a resource opened|end-to-end stream routed/.test(p.logs().slice(since.get(p) ?? 0)));
}

beforeAll(async () => {
  fw = await createFirewall();
  dir = await mkdtemp(join(tmpdir(), 'gwfw-ha-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${fw.proxyIp} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startRestartableSquid({
    host: fw.agentGatewayIp,
    extraConfig: [`hosts_file ${join(dir, 'hosts')}`, `acl agent_net src ${fw.agentIp}/32`, 'http_access allow agent_net'],
  });
  pg = await startPostgres({ netns: fw.proxyNs, port: PG_PORT });
  auths.a = await startGatewayIn(fw, fw.proxyNs, authConfig('a'), { name: 'auth-a' });
  auths.b = await startGatewayIn(fw, fw.proxyNs, authConfig('b'), { name: 'auth-b' });
  const status = await gwctl(['status']);
  pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;
  expect((await runCli('gwctl', ['--data-dir', auths.a.dataDir, 'users', 'add', 'alice', '--roles=access'], { env: { HOME: dir }, input: `${PASSWORD}\n` })).status).toBe(0);
  for (const n of [1, 2, 3]) await startProxy(n);
  lb = await startBalancer({
    dir,
    bind: { host: fw.proxyIp, port: LB_PORT },
    servers: Object.fromEntries([1, 2, 3, 4].map((n) => [`p${n}`, `${fw.proxyIp}:${3080 + n}`])),
    disabled: ['p4'],
    sendProxyV2: true,
    spawn: (command, args, options) => fw.spawnIn(fw.proxyNs, command, args, options),
  });
  const script = join(dir, 'bulk-server.mjs');
  await writeFile(script, BULK_SERVER_SOURCE);
  bulkServer = fw.spawnIn(fw.agentNs, process.execPath, [script, String(BULK_PORT), '127.0.0.1']);
  agent = await startGatewayIn(fw, fw.agentNs, agentConfig, { name: 'agent', args: ['--token', await token('app'), '--ca-pin', pin, '--proxy', lbAddr()], env: { HTTPS_PROXY: squid.url } });
  aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh') };
  const login = await runCli('gwsh', ['login', `--proxy=${fw.proxyIp}:${LB_PORT}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
  expect(login.stderr).toBe('');
}, 180_000);

afterAll(async () => {
  await runCleanup([
    () => gwshChildren.forEach((c) => c.kill('SIGKILL')),
    () => agent?.stop(true),
    () => Promise.all(proxies.map((p) => p?.stop(true))),
    () => lb?.stop(),
    () => Promise.all(Object.values(auths).map((a) => a?.stop(true))),
    () => pg?.stop(),
    () => bulkServer?.kill('SIGKILL'),
    () => squid?.stop(),
    () => fw?.close(),
    () => dir && rm(dir, { recursive: true, force: true }),
  ]);
}, 60_000);

describeAsRoot('2 Auth Services on PostgreSQL, 3 Proxies behind HAProxy, an agent behind squid', () => {
  it('every Proxy registers; the agent, dialling only the balancer, ends with a tunnel to each (agent_mesh)', async () => {
    const ids = proxies.map((p) => p.hostId!).sort();
    expect(ids.every((id) => /^[0-9a-f-]{36}$/.test(id))).toBe(true);
    await eventually('gwctl get proxies lists the three', async () => expect(await liveProxies()).toEqual(ids), 30_000);
    await eventually('the agent holds a tunnel to every Proxy', async () => expect(await agentTunnels()).toEqual(ids), 60_000);
    // Every one of them went through squid to the balancer's one address: the agent knows no other.
    const connects = (await squid.readAccessLog()).map(parseAccessLogLine).filter((e) => e.method === 'CONNECT');
    expect(connects.length).toBeGreaterThanOrEqual(3);
    expect(new Set(connects.map((e) => e.url))).toEqual(new Set([lbAddr()]));
  });

  it('a client streams through the balancer, byte-exact and end to end, whichever Proxy signed the grant', async () => {
    await gwshProxy(17001);
    const routed: Array<{ proxy: string; issuer: string | undefined }> = [];
    for (let i = 0; i < 6; i++) routed.push(...(await byteExact(17001)));
    // gwsh's one grant session stays on one Proxy; round robin sends its streams to the others too, which route
    // grants they did not sign (the grant carries its issuer's certificate).
    expect(routed.some((r) => r.issuer !== undefined && r.issuer !== r.proxy)).toBe(true);
  });

  it("every Proxy's pool of the agent's data connections fills through the balancer; a stream meeting its grant's Proxy goes end to end without waiting for one", async () => {
    // The agent's data connections go through squid to the balancer's one address and land on any Proxy: each
    // carries a proof for every tunnel of the agent, so each Proxy keeps those that reach it (src/agent/e2edata.ts).
    await eventually("every Proxy holds the agent's idle data connections (its pool, 2)", async () => {
      for (const p of running()) expect(await proxyMetric(p, 'gateway_e2e_data_idle'), p.hostId).toBeGreaterThanOrEqual(2);
    }, 90_000);
    const noData = async () => (await Promise.all(running().map((p) => proxyMetric(p, 'gateway_e2e_streams_total', { outcome: 'no-data' })))).reduce((a, b) => a + b, 0);
    const before = await noData();
    const since = new Map(running().map((p) => [p, p.logs().length]));
    // gwsh's grant comes from the Proxy of its grant session; a stream the balancer sends to another Proxy finds
    // no grant there and takes the classic route (a grant held by every Proxy is another change): repeat until
    // one meets its grant's Proxy.
    await eventually('a stream routed end to end', async () => {
      await byteExact(17001);
      if (!running().some((p) => p.logs().slice(since.get(p) ?? 0).includes('end-to-end stream routed'))) throw new Error("every stream so far reached another Proxy than its grant's");
    }, 120_000);
    // No stream waited DATA_WAIT_MS for a data connection and gave up.
    expect(await noData()).toBe(before);
   }, 240_000);

  it('kill -9 of the Proxy a client streams through: the next connection reaches the agent through another Proxy', async () => {
    const since = new Map(running().map((p) => [p, p.logs().length]));
    const id = nextId++;
    // Held after its first MiB until the Proxy is killed: under way then, however fast the path.
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    // Settled at once into a value, so that its rejection (expected) is never unhandled meanwhile.
    const big = transfer('127.0.0.1', 17001, { id, upload: 64 * 1024 * KiB, download: 0, seed: id, timeoutMs: 60_000, holdAt: 1024 * KiB, hold }).then(() => 'completed', (err: Error) => err);
    const victim = await eventually('a Proxy carries the stream', async () => {
      const p = proxyServing(since);
      if (!p) throw new Error('no Proxy logged the connection yet');
      return p;
    });
    await victim.kill();
    stopped.add(victim);
    release();
    expect(await big).toBeInstanceOf(Error);
    // Not acknowledged, so lost; what follows must arrive whole, through a survivor.
    await eventually('new connections work through the survivors', () => byteExact(17001), 60_000);
    const after = new Map(running().map((p) => [p, p.logs().length]));
    await byteExact(17001);
    expect(proxyServing(after)).toBeDefined();
    // It comes back (same data directory, same host ID) and the agent gets its tunnel to it again.
    await victim.restart();
    stopped.delete(victim);
    await eventually('the agent holds a tunnel to every Proxy again', async () => expect(await agentTunnels()).toEqual(proxies.map((p) => p.hostId!).sort()), 60_000);
  });

  it('kill -9 of an Auth Service: Proxies go on through the other, gwctl works there, and it comes back', async () => {
    await auths.a!.kill();
    await eventually('new connections work with one Auth Service', () => byteExact(17001), 60_000);
    const r = await gwctlOn(auths.b!, ['get', 'proxies', '--format', 'json']);
    expect(r.status).toBe(0);
    await auths.a!.restart();
    await eventually('both Auth Services serve', async () => expect((await gwctlOn(auths.a!, ['status'])).status).toBe(0));
  });

  it('a PostgreSQL restart: heartbeats and watches resume; a lock made afterwards closes sessions on every Proxy', async () => {
    await pg.halt();
    await pg.resume();
    await eventually('the Proxies are listed again after the restart', async () => expect(await liveProxies()).toEqual(proxies.map((p) => p.hostId!).sort()), 60_000);
    // A connection opened while the Auth Services' database connections are being re-made may be refused (it was
    // never acknowledged); service must come back by itself.
    await eventually('new connections work again after the restart', () => byteExact(17001), 60_000);
    const id = nextId++;
    // Held after its first MiB until the lock is made: the lock closes a stream under way.
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    const open = transfer('127.0.0.1', 17001, { id, upload: 256 * 1024 * KiB, download: 0, seed: id, timeoutMs: 120_000, holdAt: 1024 * KiB, hold }).then(() => 'completed', (err: Error) => err);
    const since = new Map(running().map((p) => [p, p.logs().length]));
    const carrier = await eventually('a Proxy carries the stream', async () => {
      const p = proxyServing(since);
      if (!p) throw new Error('no Proxy logged the connection yet');
      return p;
    });
    // The route the stream took says which line its close writes: an end-to-end stream's, or a classic one's.
    const e2e = carrier.logs().slice(since.get(carrier)).includes('end-to-end stream routed');
    expect((await gwctlOn(auths.b!, ['lock', '--user', 'alice', '--message', 'ha test'])).status).toBe(0);
    try {
      // Closed by the lock (through the Auth Service's event stream to that Proxy), not by anything else, while the
      // upload is held: nothing else could end it.
      await carrier.waitForLog(e2e ? 'end-to-end stream closed: identity revoked' : 'connection closed: identity revoked', 10_000, since.get(carrier));
      expect(await open).toBeInstanceOf(Error);
    } finally {
      release();
      // Whatever failed above, the tests after this one run with alice unlocked.
      expect((await gwctlOn(auths.a!, ['unlock', '--user', 'alice'])).status).toBe(0);
    }
    await eventually('alice works again after the unlock', () => byteExact(17001));
  });

  it('a Proxy added while the agent is connected gets a tunnel; one removed loses it', async () => {
    const fourth = await startProxy(4);
    await lb.setServer('p4', 'enable');
    await eventually('the agent adds a tunnel to the new Proxy', async () => expect(await agentTunnels()).toContain(fourth.hostId!), 60_000);
    const leaving = proxies[1]!;
    await lb.setServer('p2', 'disable');
    await leaving.stop();
    stopped.add(leaving);
    await eventually('the agent drops the tunnel to the Proxy that left', async () => expect(await agentTunnels()).not.toContain(leaving.hostId!), 60_000);
    await eventually('and it is no longer listed', async () => expect(await liveProxies()).not.toContain(leaving.hostId!), 60_000);
    await byteExact(17001);
  });
});

