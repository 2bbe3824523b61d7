/**
 * bench:cluster — BENCH_AGENTS simulated agents (10 000 by default) across 2 Proxies on one PostgreSQL, on this
 * machine:
 *
 *   PostgreSQL (Debian's server, started like the tests start it)
 *     ▲                     ▲
 *   daemon A (auth+proxy)  daemon B (auth+proxy)   tunnel_strategy proxy_peering, agent_connection_count 1
 *     ▲ half the agents      ▲ the other half       peering on their own 3021-style listeners
 *   this process: BENCH_AGENTS TunnelAgent links (direct, one tunnel each: the lightweight simulated agents)
 *
 *   memory per agent     each daemon's VmRSS before the agents connect and once all are connected and idle,
 *                        divided by the agents it holds (the daemon also runs an Auth Service: what it adds is
 *                        the same before and after)
 *   location reaches     for BENCH_PROBES more agents, one at a time, connecting to A: from the agent's
 *   every Proxy          "connected" (the welcome) until a cluster watch in this process on the same database has
 *                        its presence — the very watch (AuthService.watchCluster) every Proxy's ClusterView runs
 *                        (p50, p99); the path is: A writes the presence record, PostgreSQL commits and notifies,
 *                        the watcher reads the change log
 *   connect through      a client (openResource with a gwsh profile, ALPN gateway-tcp) to an echo app on an agent
 *   a peer               held by A only: through B (B → 3021 → A → tunnel) against through A, time to the first
 *                        echoed byte, BENCH_CONNECTS each (p50, p99)
 *
 * Settings (environment): BENCH_AGENTS (10000), BENCH_PROBES (200), BENCH_CONNECTS (200), BENCH_RECORD (0: print
 * only). Writes the section "cluster" of bench/RESULTS.md with the machine and the load average.
 */
import dns from 'node:dns';
import { mkdtemp, rm } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import type { HostIdentity } from '../src/agent/identity.js';
import { TunnelAgent } from '../src/agent/tunnel.js';
import { generateKeyPair, identityFromCert } from '../src/auth/pki.js';
import { AuthService, type CertBundle } from '../src/auth/service.js';
import { openPostgresBackend } from '../src/backend/index.js';
import { ApiClient, fetchPinnedCas } from '../src/client/api.js';
import { loadProfile } from '../src/client/profile.js';
import { openResource } from '../src/client/resources.js';
import { Dialer } from '../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../src/log.js';
import { startPostgres } from '../test/helpers/databases.js';
import { runCli, startGateway, type RunningGateway } from '../test/helpers/gateway.js';
import { startEchoServer } from '../test/helpers/servers.js';
import { envNumber, percentile, sleep } from './common.js';
import { recordSection } from './record.js';

const AGENTS = envNumber('BENCH_AGENTS', 10_000);
const PROBES = envNumber('BENCH_PROBES', 200);
const CONNECTS = envNumber('BENCH_CONNECTS', 200);
const IPS = { a: '127.0.0.5', b: '127.0.0.6' } as const;
const NAMES = { a: 'proxy-a.gw.test', b: 'proxy-b.gw.test' } as const;
const PASSWORD = 'bench password, long enough';

setRootLogger(createLogger({ level: 'error' }));

const now = (): number => Number(process.hrtime.bigint()) / 1e6;
const say = (line: string) => process.stderr.write(`${line}\n`);

function percentiles(values: number[]): { p50: number; p99: number } {
  const s = [...values].sort((x, y) => x - y);
  return { p50: percentile(s, 50), p99: percentile(s, 99) };
}

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? NaN);
}

const lookup: net.LookupFunction = (hostname, options, callback) => {
  const ip = hostname === NAMES.a ? IPS.a : hostname === NAMES.b ? IPS.b : undefined;
  if (!ip) return dns.lookup(hostname, options, callback);
  if (options.all) callback(null, [{ address: ip, family: 4 }]);
  else callback(null, ip, 4);
};

function daemonConfig(which: 'a' | 'b', pgUrl: string, web: number, peer: number, auth: number): string {
  return [
    'gateway:',
    `  nodename: proxy-${which}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json }',
    `  storage: { type: postgres, conn_string: "${pgUrl}" }`,
    // Every simulated agent comes from 127.0.0.1: the per-source cap must let them all in.
    '  limits: { max_connections: 19000, max_connections_per_source: 19000 }',
    'auth_service:',
    '  cluster_name: bench.example',
    `  listen_addr: ${IPS[which]}:${auth}`,
    '  tunnel_strategy: { type: proxy_peering, agent_connection_count: 1 }',
    'proxy_service:',
    `  web_listen_addr: ${IPS[which]}:${web}`,
    `  peer_listen_addr: ${IPS[which]}:${peer}`,
    `  peer_public_addr: ${IPS[which]}:${peer}`,
    `  public_addr: ${NAMES[which]}:${web}`,
    '',
  ].join('\n');
}

interface Joined {
  identities: HostIdentity[];
}

/** count host identities joined through `server` with one multi-use token, 8 at a time (a source may have 10 joins in flight). */
async function joinMany(server: string, token: string, pin: string, count: number, prefix: string, dialer: Dialer): Promise<Joined> {
  const cas = await fetchPinnedCas(server, pin, dialer);
  const identities: HostIdentity[] = new Array(count);
  let next = 0;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      for (let i = next++; i < count; i = next++) {
        const keys = generateKeyPair();
        const nodename = `${prefix}-${i}`;
        const bundle = await new ApiClient({ address: server, dialer, ca: cas.host_ca }).call<CertBundle & { hostId: string }>('POST', '/webapi/join', {
          token, roles: ['app'], nodename, public_addrs: [], public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey,
        }).catch((err: Error) => {
          throw new Error(`join ${nodename} through ${server}: ${err.message}`);
        });
        identities[i] = {
          hostId: bundle.hostId, cluster: bundle.clusterName, roles: ['app'], nodename, server, joinedVia: 'proxy', key: keys.privateKeyPem,
          cert: bundle.tlsCert, sshCert: bundle.sshCert, hostCa: bundle.hostCaPem, userCa: bundle.userCaPem, sshUserCa: bundle.sshUserCa, identity: identityFromCert(bundle.tlsCert),
        };
      }
    }),
  );
  return { identities };
}

function simulatedAgent(identity: HostIdentity, dialer: Dialer, echoPort: number): TunnelAgent {
  return new TunnelAgent({
    identity,
    dialer,
    services: ['app'],
    resources: { databases: [], apps: [{ name: `app-${identity.nodename}`, kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] },
    connectResource: () => new Promise((resolve, reject) => {
      const s = net.connect(echoPort, '127.0.0.1', () => resolve(s));
      s.once('error', reject);
    }),
  });
}

/** Starts agents in batches of 50 and resolves once each has its tunnel. */
async function connectAll(agents: TunnelAgent[]): Promise<void> {
  for (let i = 0; i < agents.length; i += 50) {
    await Promise.all(agents.slice(i, i + 50).map((a) => {
      const up = new Promise<void>((r) => a.once('connected', () => r()));
      a.start();
      return up;
    }));
  }
}

/** Time to the first echoed byte of a new connection through `address`. */
async function connectOnce(open: () => Promise<import('node:stream').Duplex>): Promise<number> {
  const t0 = now();
  const s = await open();
  await new Promise<void>((resolve, reject) => {
    s.once('data', () => resolve());
    s.once('error', reject);
    s.write('x');
  });
  const ms = now() - t0;
  s.destroy();
  return ms;
}

/**
 * A new agent's location reaching the watch every Proxy runs, on the same database: for each probe identity an
 * agent started (kept in `agents` for the cleanup), ms from its welcome to the presence put the watch sees.
 */
async function measurePropagation(backend: Awaited<ReturnType<typeof openPostgresBackend>>, identities: HostIdentity[], dialer: Dialer, echoPort: number, agents: TunnelAgent[]): Promise<{ p50: number; p99: number }> {
  const observer = await AuthService.open({ backend, clusterName: 'bench.example' });
  const seen = new Map<string, () => void>();
  const unwatch = observer.watchCluster({
    presence: (e) => {
      if (e.type === 'put') seen.get(e.presence.hostId)?.();
    },
    proxies: () => undefined,
    resync: () => undefined,
  });
  const propagation: number[] = [];
  for (const identity of identities) {
    const agent = simulatedAgent(identity, dialer, echoPort);
    agents.push(agent);
    const arrived = new Promise<number>((r) => seen.set(identity.hostId, () => r(now())));
    const connected = new Promise<number>((r) => agent.once('connected', () => r(now())));
    agent.start();
    const [tc, ts] = await Promise.all([connected, arrived]);
    propagation.push(Math.max(0, ts - tc));
  }
  unwatch();
  return percentiles(propagation);
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-cluster-'));
  const pg = await startPostgres({ port: await getPort({ host: '127.0.0.1' }), settings: { max_connections: '100' } });
  const echo = await startEchoServer('127.0.0.1');
  const daemons: Partial<Record<'a' | 'b', RunningGateway>> = {};
  const agents: TunnelAgent[] = [];
  let observerBackend: Awaited<ReturnType<typeof openPostgresBackend>> | undefined;
  try {
    for (const which of ['a', 'b'] as const) {
      const [web, peer, auth] = [await getPort({ host: IPS[which] }), await getPort({ host: IPS[which] }), await getPort({ host: IPS[which] })];
      daemons[which] = await startGateway(daemonConfig(which, pg.url(), web, peer, auth), { dataDir: join(dir, `data-${which}`), timeoutMs: 60_000, openFiles: 20000 });
    }
    const a = daemons.a!;
    const b = daemons.b!;
    const addr = (g: RunningGateway, which: 'a' | 'b') => `${NAMES[which]}:${g.addresses.web!.split(':').pop()}`;
    const gwctl = async (args: string[], input?: string) => {
      const r = await runCli('gwctl', ['--data-dir', a.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
      if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.stderr}`);
      return r.stdout;
    };
    const { token, ca_pin: pin } = JSON.parse(await gwctl(['tokens', 'add', '--type=app', '--uses=0', '--ttl=2h', '--format', 'json'])) as { token: string; ca_pin: string };
    const dialer = new Dialer({ env: {}, lookup });
    const half = Math.floor(AGENTS / 2);
    const t0 = Date.now();
    const onA = await joinMany(addr(a, 'a'), token, pin, half, 'a', dialer);
    const onB = await joinMany(addr(b, 'b'), token, pin, AGENTS - half, 'b', dialer);
    const probes = await joinMany(addr(a, 'a'), token, pin, PROBES, 'probe', dialer);
    say(`${AGENTS + PROBES} identities joined in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    await sleep(2000);
    const before = { a: rssKiB(a.process.pid!), b: rssKiB(b.process.pid!) };
    const t1 = Date.now();
    const all = [...onA.identities, ...onB.identities].map((id) => simulatedAgent(id, dialer, echo.port));
    agents.push(...all);
    await connectAll(all);
    say(`${AGENTS} agents connected in ${((Date.now() - t1) / 1000).toFixed(1)} s`);
    await sleep(5000);
    const after = { a: rssKiB(a.process.pid!), b: rssKiB(b.process.pid!) };
    const perAgent = { a: (after.a - before.a) / half, b: (after.b - before.b) / (AGENTS - half) };
    say(`memory per agent: A ${perAgent.a.toFixed(1)} KiB, B ${perAgent.b.toFixed(1)} KiB`);

    // --- location propagation: the watch every Proxy runs, on the same database ----------------------------------
    observerBackend = await openPostgresBackend({ connString: pg.url() });
    const prop = await measurePropagation(observerBackend, probes.identities, dialer, echo.port, agents);
    say(`location reaches the watch: p50 ${prop.p50.toFixed(2)} ms, p99 ${prop.p99.toFixed(2)} ms`);

    // --- client connect time through a peer ---------------------------------------------------------------------
    await gwctl(['users', 'add', 'bench', '--roles=access'], `${PASSWORD}\n`);
    const gwshHome = join(dir, 'gwsh');
    const login = await runCli('gwsh', ['login', `--proxy=${IPS.a}:${a.addresses.web!.split(':').pop()}`, '--user=bench', `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: gwshHome }, input: `${PASSWORD}\n` });
    if (login.status !== 0) throw new Error(`gwsh login: ${login.stderr}`);
    const profile = loadProfile(gwshHome)!;
    const target = `app-${onA.identities[0]!.nodename}`;
    const open = (via: string) => () => openResource(profile, via, { alpn: 'gateway-tcp', resource: target, kind: 'app' }, dialer);
    const direct: number[] = [];
    const peered: number[] = [];
    for (let i = 0; i < CONNECTS; i++) {
      direct.push(await connectOnce(open(`${IPS.a}:${a.addresses.web!.split(':').pop()}`)));
      peered.push(await connectOnce(open(`${IPS.b}:${b.addresses.web!.split(':').pop()}`)));
    }
    const d = percentiles(direct);
    const p = percentiles(peered);
    say(`connect: through A (holds the agent) p50 ${d.p50.toFixed(2)} ms p99 ${d.p99.toFixed(2)}; through B (peer) p50 ${p.p50.toFixed(2)} p99 ${p.p99.toFixed(2)}`);

    const load = loadavg().map((x) => x.toFixed(2)).join(' ');
    const section = [
      '## cluster',
      '',
      `Run with \`npm run bench:cluster\` (BENCH_AGENTS=${AGENTS}). Machine: ${cpus().length} × ${cpus()[0]?.model ?? '?'}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB; load average (1/5/15 min) at the end: ${load}; Node ${process.version}; ${new Date().toISOString()}.`,
      '',
      `${AGENTS} simulated agents (TunnelAgent links in the bench process, one tunnel each) across 2 Proxies (each a daemon with its Auth Service on one PostgreSQL; proxy_peering, agent_connection_count 1).`,
      '',
      '| measure | figure |',
      '|---|---|',
      `| Proxy memory per agent (VmRSS growth / agents held) | A ${perAgent.a.toFixed(1)} KiB (${half} agents), B ${perAgent.b.toFixed(1)} KiB (${AGENTS - half}) |`,
      `| a new agent's location reaches a Proxy's watch (${PROBES} agents, from its welcome) | p50 ${prop.p50.toFixed(2)} ms, p99 ${prop.p99.toFixed(2)} ms |`,
      `| client connect to first echoed byte, through the Proxy holding the agent (${CONNECTS}) | p50 ${d.p50.toFixed(2)} ms, p99 ${d.p99.toFixed(2)} ms |`,
      `| the same through the other Proxy (over peering) | p50 ${p.p50.toFixed(2)} ms, p99 ${p.p99.toFixed(2)} ms (${(p.p50 / d.p50).toFixed(2)}x at p50) |`,
      '',
      `- Everything above shares the machine with the ${AGENTS} agents' heartbeats: each tunnel heartbeats every keep_alive_interval (20 s) and every heartbeat rewrites the agent's presence record (${(AGENTS / 20).toFixed(0)} PostgreSQL writes a second, each notified to every watcher). With two agents a stream opens in about 5 ms (section peer), so that load, not the route, is most likely most of the connect time and of the p99s; the peered connect costs a few ms more than the direct one. Writing presence less often (its TTL only matters when a Proxy dies, and a dead Proxy's records are ignored once its own record expires) is left for the idle-agent work.`,
      '',
    ].join('\n');
    process.stdout.write(`${section}\n`);
    if (process.env.BENCH_RECORD !== '0') await recordSection('cluster', section);
  } finally {
    for (const agent of agents) agent.stop();
    await observerBackend?.close();
    await Promise.all(Object.values(daemons).map((g) => g?.stop()));
    await echo.close();
    await pg.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
