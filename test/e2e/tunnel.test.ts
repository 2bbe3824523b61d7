/**
 * Reverse tunnels behind a real firewall, with the real binaries and real databases.
 *
 * Topology (test/helpers/firewall.ts): the agent daemon and its databases run in one network namespace, the
 * Proxy (auth + proxy) in another, and the root namespace, which joins them, does not forward packets: the
 * agent cannot reach the Proxy's address at all (a test proves it). Its only way out is a real squid in the
 * root namespace, which knows the Proxy as proxy.gw.test (its hosts_file). Clients (gwsh, psql, mysql,
 * redis-cli) run in the root namespace and reach the Proxy's address directly.
 *
 * Covered: joining through squid with a token and the CA pin; psql, mysql and redis-cli through
 * `gwsh proxy db`; `gwsh db ls`, `gwctl get nodes`; 1 GiB byte-exact through `gwsh proxy app` and 100
 * concurrent streams; after kill -9 of the agent, a Proxy restart, a squid restart and a cut link the tunnel
 * comes back by itself and new connections work; agents with a wrong token, a wrong pin or another cluster's
 * identity are refused and say why. Nothing here asserts how fast anything happens: recoveries are polled
 * with a generous deadline.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { cpSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BULK_SERVER_SOURCE, expectedDownloadSha256, transfer, type BulkReport } from '../helpers/bulk.js';
import { startMariadb, startPostgres, startRedis, type DatabaseServer } from '../helpers/databases.js';
import { createFirewall, startGatewayIn, startRestartableSquid, type Firewall, type NsGateway, type RestartableSquid } from '../helpers/firewall.js';
import { BIN, runCli, runProgram, startGateway, type RunResult } from '../helpers/gateway.js';
import { parseAccessLogLine } from '../helpers/squid.js';
import { runCleanup } from '../helpers/cleanup.js';
import { rootSuite } from '../helpers/root.js';
import { eventually } from '../helpers/wait.js';

// Every suite here runs in the firewall's network namespaces, with the Proxy on port 443, and the databases as
// their system users: as any user but root they are skipped, with that reason.
const describeAsRoot = rootSuite(['netns', 'port443', 'dbUsers']);

const PROXY_NAME = 'proxy.gw.test';
const WEB_PORT = 443;
const PASSWORD = 'correct horse battery';
const GiB = 1024 ** 3;
const BACK_WITHIN_MS = 30_000;
const PORTS = { postgres: 5432, mysql: 3306, redis: 6379, bulk: 7000 };

let fw: Firewall;
let dir: string;
let squid: RestartableSquid;
let proxy: NsGateway;
let agent: NsGateway | undefined;
const dbs = {} as { pg: DatabaseServer; maria: DatabaseServer; redis: DatabaseServer };
let bulkServer: ChildProcess;
let bulkOutput = '';
let pin: string;
let proxyAddr: string;
let aliceEnv: Record<string, string>;
const local: Record<'pg' | 'maria' | 'cache' | 'bulk', number> = { pg: 0, maria: 0, cache: 0, bulk: 0 };
const gwshProxies: Array<{ child: ChildProcess; output: () => string }> = [];
const extraAgents: NsGateway[] = [];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const gwctl = (args: string[]) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir } });
const gwsh = (args: string[], input?: string) => runCli('gwsh', args, { env: aliceEnv, ...(input === undefined ? {} : { input }) });

/** Runs a client program (psql, mysql, redis-cli) in the root namespace. */
const client = (command: string, args: string[], env: Record<string, string> = {}, timeoutMs = 30_000): Promise<RunResult> =>
  runProgram(command, args, { env: { HOME: dir, ...env }, timeoutMs });

const psql = (sql: string) =>
  client('psql', [`host=127.0.0.1 port=${local.pg} user=${dbs.pg.user} dbname=${dbs.pg.database} sslmode=disable connect_timeout=10`, '-X', '-At', '-v', 'ON_ERROR_STOP=1', '-c', sql], {
    PGPASSWORD: dbs.pg.password,
  });
const mysql = (sql: string) =>
  client('mysql', ['--no-defaults', '-h', '127.0.0.1', '-P', String(local.maria), '-u', dbs.maria.user, `-p${dbs.maria.password}`, '--connect-timeout=10', '-N', '-s', dbs.maria.database, '-e', sql]);
const redis = (...args: string[]) => client('redis-cli', ['-h', '127.0.0.1', '-p', String(local.cache), '-a', dbs.redis.password, '--no-auth-warning', ...args]);


interface NodeResource {
  metadata: { name: string };
  spec: { hostname: string; roles: string[]; status: string; connected_since?: string; proxy?: string; services?: string[] };
}

async function agentNode(): Promise<NodeResource> {
  const r = await gwctl(['get', 'nodes', '--format', 'json']);
  if (r.status !== 0) throw new Error(`gwctl get nodes: ${r.stderr}`);
  const node = (JSON.parse(r.stdout) as NodeResource[]).find((n) => n.metadata.name === agent!.hostId);
  if (!node) throw new Error(`gwctl get nodes does not list ${agent!.hostId}:\n${r.stdout}`);
  return node;
}

/** One small transfer through the app tunnel, byte-exact both ways. */
async function smallTransfer(id: number): Promise<void> {
  const r = await transfer('127.0.0.1', local.bulk, { id, upload: 64 * 1024, download: 64 * 1024, seed: id, timeoutMs: 15_000 });
  if (r.server.received.sha256 !== r.sent.sha256 || r.received.sha256 !== expectedDownloadSha256(64 * 1024, id)) throw new Error(`transfer ${id} was not byte-exact`);
}

let probeId = 1000;
/**
 * "The tunnel comes back by itself": gwctl shows the agent online on a tunnel opened after `since`, and new
 * connections to a database and the app work.
 */
async function expectBack(since: number): Promise<void> {
  try {
    await expectBackInner(since);
  } catch (err) {
    const tail = (text: string) => text.trimEnd().split('\n').slice(-25).join('\n');
    throw new Error(`${(err as Error).message}\n--- agent log ---\n${tail(agent!.logs())}\n--- proxy log ---\n${tail(proxy.logs())}\n--- squid access log ---\n${tail((await squid.readAccessLog()).join('\n'))}`);
  }
}

async function expectBackInner(since: number): Promise<void> {
  await eventually('the agent is online again on a new tunnel', async () => {
    const node = await agentNode();
    if (node.spec.status !== 'online' || Date.parse(node.spec.connected_since ?? '') < since) throw new Error(JSON.stringify(node.spec));
  });
  await eventually('psql works again', async () => {
    const r = await psql('select 42');
    if (r.stdout.trim() !== '42') throw new Error(r.stderr);
  });
  await eventually('the app works again', () => smallTransfer(probeId++));
}

/** `gwsh proxy db|app NAME --port PORT` as a long-running process; resolves once it listens. */
async function gwshProxy(kind: 'db' | 'app', name: string, port: number): Promise<void> {
  const child = spawn(process.execPath, [BIN('gwsh'), 'proxy', kind, name, '--port', String(port)], { env: { PATH: process.env.PATH ?? '', ...aliceEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  gwshProxies.push({ child, output: () => output });
  process.once('exit', () => child.kill('SIGKILL'));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`gwsh proxy ${kind} ${name} did not start:\n${output}`)), 20_000);
    const check = () => {
      if (output.includes(`Started a local proxy for`) && output.includes(`127.0.0.1:${port}`)) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout.on('data', check);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`gwsh proxy ${kind} ${name} exited with ${code}:\n${output}`));
    });
  });
}

const agentConfig = (nodename: string) =>
  [
    'gateway:',
    `  nodename: ${nodename}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json }',
    'db_service:',
    '  enabled: yes',
    '  databases:',
    `    - { name: pg, protocol: postgres, uri: 127.0.0.1:${PORTS.postgres}, labels: { env: test, engine: postgres } }`,
    `    - { name: maria, protocol: mysql, uri: 127.0.0.1:${PORTS.mysql}, labels: { env: test, engine: mariadb } }`,
    `    - { name: cache, protocol: redis, uri: 127.0.0.1:${PORTS.redis}, labels: { env: test, engine: redis } }`,
    'app_service:',
    '  enabled: yes',
    '  apps:',
    `    - { name: bulk, uri: tcp://127.0.0.1:${PORTS.bulk}, labels: { env: test, kind: bulk } }`,
    '',
  ].join('\n');

/** An agent started to completion in ns-agent through squid (for the refusals); resolves with its output. */
async function agentOnce(nodename: string, args: string[]): Promise<RunResult & { dataDir: string }> {
  const d = await mkdtemp(join(dir, `agent-${nodename}-`));
  const dataDir = join(d, 'data');
  await writeFile(join(d, 'gateway.yaml'), agentConfig(nodename).replaceAll('DATA_DIR', dataDir));
  const r = await fw.runIn(fw.agentNs, process.execPath, [BIN('gateway'), 'start', '-c', join(d, 'gateway.yaml'), ...args], { env: { HTTPS_PROXY: squid.url }, timeoutMs: 40_000 });
  return { ...r, dataDir };
}

async function newToken(): Promise<string> {
  const r = await gwctl(['tokens', 'add', '--type=db,app', '--ttl=10m', '--format', 'json']);
  expect(r.stderr).toBe('');
  return (JSON.parse(r.stdout) as { token: string }).token;
}

beforeAll(async () => {
  fw = await createFirewall();
  dir = await mkdtemp(join(tmpdir(), 'gwfw-e2e-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${fw.proxyIp} ${PROXY_NAME}\n`, { mode: 0o644 });
  proxyAddr = `${PROXY_NAME}:${WEB_PORT}`;
  squid = await startRestartableSquid({
    host: fw.agentGatewayIp,
    // Only the agent's address may use this squid (besides the helper's loopback probes).
    extraConfig: [`hosts_file ${join(dir, 'hosts')}`, `acl agent_net src ${fw.agentIp}/32`, 'http_access allow agent_net'],
  });
  const bulkScript = join(dir, 'bulk-server.mjs');
  await writeFile(bulkScript, BULK_SERVER_SOURCE);
  const proxyConfig = [
    'gateway:',
    '  nodename: proxy-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json }',
    'auth_service:',
    '  cluster_name: fw.example',
    `  listen_addr: ${fw.proxyIp}:3025`,
    '  keep_alive_interval: 1s',
    '  keep_alive_count_max: 3',
    'proxy_service:',
    `  web_listen_addr: ${fw.proxyIp}:${WEB_PORT}`,
    `  public_addr: ${proxyAddr}`,
    '',
  ].join('\n');
  // Started in parallel; each is recorded as soon as it runs, so that afterAll stops it whatever else fails.
  const started = await Promise.allSettled([
    startPostgres({ netns: fw.agentNs, port: PORTS.postgres }).then((db) => (dbs.pg = db)),
    startMariadb({ netns: fw.agentNs, port: PORTS.mysql }).then((db) => (dbs.maria = db)),
    startRedis({ netns: fw.agentNs, port: PORTS.redis }).then((db) => (dbs.redis = db)),
    startGatewayIn(fw, fw.proxyNs, proxyConfig, { name: 'proxy' }).then((gw) => (proxy = gw)),
    (async () => {
      bulkServer = fw.spawnIn(fw.agentNs, process.execPath, [bulkScript, String(PORTS.bulk), '127.0.0.1']);
      bulkServer.stdout!.on('data', (c: Buffer) => (bulkOutput += c.toString()));
      bulkServer.stderr!.on('data', (c: Buffer) => (bulkOutput += c.toString()));
      await eventually('the bulk server listens', async () => {
        if (!bulkOutput.includes('"listening"')) throw new Error(bulkOutput);
      }, 10_000);
    })(),
  ]);
  const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;

  // The administrator on the auth machine: the CA pin, a user, a join token for the agent.
  const status = await gwctl(['status']);
  expect(status.stderr).toBe('');
  pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;
  expect((await runCli('gwctl', ['--data-dir', proxy.dataDir, 'users', 'add', 'alice', '--roles=access', '--db-users=gwtest,default', '--db-names=gwtest'], { env: { HOME: dir }, input: `${PASSWORD}\n` })).status).toBe(0);
  const token = await newToken();

  // The agent joins through squid: HTTPS_PROXY is its only way to the Proxy.
  agent = await startGatewayIn(fw, fw.agentNs, agentConfig('agent-1'), {
    name: 'agent',
    args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr],
    env: { HTTPS_PROXY: squid.url },
  });
  await agent.waitForLog('reverse tunnel ready', 20_000);

  // alice, in the root namespace, signs in to the Proxy's address directly.
  aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh') };
  const login = await gwsh(['login', `--proxy=${fw.proxyIp}:${WEB_PORT}`, '--user=alice', `--ca-pin=${pin}`], `${PASSWORD}\n`);
  expect(login.stderr).toBe('');
}, 120_000);

afterAll(async () => {
  const steps: Array<() => Promise<unknown> | unknown> = [
    () => gwshProxies.forEach((p) => p.child.kill('SIGTERM')),
    ...extraAgents.map((a) => () => a.stop(true)),
    () => agent?.stop(true),
    () => proxy?.stop(true),
    () => bulkServer?.kill('SIGKILL'),
    () => Promise.all([dbs.pg?.stop(), dbs.maria?.stop(), dbs.redis?.stop()]),
    () => squid?.stop(),
    () => fw?.close(),
    () => dir && rm(dir, { recursive: true, force: true }),
  ];
  await runCleanup(steps);
}, 60_000);

describeAsRoot('the firewall', () => {
  it('the agent cannot reach the Proxy directly: the root namespace does not forward', async () => {
    expect(readFileSync('/proc/sys/net/ipv4/ip_forward', 'utf8').trim()).toBe('0');
    // The agent's network has a route towards the Proxy's address (its default route, into the root namespace)...
    const route = await fw.runIn(fw.agentNs, 'ip', ['route', 'get', fw.proxyIp]);
    expect(route.stdout).toContain(`via ${fw.agentGatewayIp}`);
    // ...but the root namespace does not forward: no connection.
    const direct = await fw.tcpConnectFrom(fw.agentNs, fw.proxyIp, WEB_PORT, 3000);
    expect(direct.ok).toBe(false);
    // ...while squid is reachable from the agent, and the Proxy from the root namespace (the clients' side).
    expect(await fw.tcpConnectFrom(fw.agentNs, squid.host, squid.port)).toEqual({ ok: true });
    expect(await fw.tcpConnectFrom(fw.agentNs, '127.0.0.1', PORTS.postgres)).toEqual({ ok: true });
    const fromRoot = await client(process.execPath, ['-e', `require('net').connect(${WEB_PORT}, '${fw.proxyIp}').on('connect', () => process.exit(0)).on('error', () => process.exit(1))`]);
    expect(fromRoot.status).toBe(0);
  });

  it("the agent joined and opened its tunnel through squid: squid's log shows its CONNECTs to the Proxy", async () => {
    const line = await squid.waitForAccessLog((l) => {
      const e = parseAccessLogLine(l);
      return e.client === fw.agentIp && e.method === 'CONNECT' && e.url === proxyAddr && e.status === 200;
    });
    expect(line).toContain('TCP_TUNNEL');
    expect(agent!.logs()).toContain('"joined the cluster"');
  });
});

describeAsRoot('databases and apps through the tunnel', () => {
  it('gwctl get nodes shows the agent online with its roles', async () => {
    const node = await agentNode();
    expect(node.spec).toMatchObject({ hostname: 'agent-1', roles: ['db', 'app'], status: 'online', services: ['db', 'app'] });
  });

  it('gwsh db ls shows the three databases with their labels and agent', async () => {
    const r = await gwsh(['db', 'ls', '-f', 'json']);
    expect(r.stderr).toBe('');
    const items = JSON.parse(r.stdout) as Array<{ name: string; protocol: string; labels: Record<string, string>; agent: string }>;
    expect(items.map(({ name, protocol, labels, agent: a }) => ({ name, protocol, labels, agent: a }))).toEqual([
      { name: 'cache', protocol: 'redis', labels: { env: 'test', engine: 'redis' }, agent: 'agent-1' },
      { name: 'maria', protocol: 'mysql', labels: { env: 'test', engine: 'mariadb' }, agent: 'agent-1' },
      { name: 'pg', protocol: 'postgres', labels: { env: 'test', engine: 'postgres' }, agent: 'agent-1' },
    ]);
    const text = await gwsh(['db', 'ls']);
    expect(text.stdout).toMatch(/^Name\s+Protocol\s+Labels\s+Agent\s+Connected since/);
    expect(text.stdout).toMatch(/pg\s+postgres\s+env=test,engine=postgres\s+agent-1/);
    const apps = JSON.parse((await gwsh(['apps', 'ls', '-f', 'json'])).stdout) as Array<{ name: string; protocol: string }>;
    expect(apps).toEqual([expect.objectContaining({ name: 'bulk', protocol: 'tcp', agent: 'agent-1' })]);
  });

  it('gwsh proxy db and app listen on the ports asked for', async () => {
    for (const key of Object.keys(local) as Array<keyof typeof local>) local[key] = await getPort({ host: '127.0.0.1' });
    await Promise.all([gwshProxy('db', 'pg', local.pg), gwshProxy('db', 'maria', local.maria), gwshProxy('db', 'cache', local.cache), gwshProxy('app', 'bulk', local.bulk)]);
  });

  it('psql: a real PostgreSQL session (password auth by the database itself)', async () => {
    const r = await psql('select 42');
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('42');
    const session = await psql(
      "create table t (n int, s text); insert into t select g, repeat('x', 100) from generate_series(1, 20000) g; select count(*), sum(n), current_user, inet_server_addr() from t",
    );
    expect(session.stderr).toBe('');
    expect(session.stdout.trim().split('\n').at(-1)).toBe('20000|200010000|gwtest|127.0.0.1');
    const wrong = await client('psql', [`host=127.0.0.1 port=${local.pg} user=gwtest dbname=gwtest sslmode=disable`, '-Atc', 'select 1'], { PGPASSWORD: 'wrong' });
    expect(wrong.status).not.toBe(0);
    expect(wrong.stderr).toContain('password authentication failed');
  });

  it('mysql: a real MariaDB session', async () => {
    const r = await mysql('select 42');
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('42');
    const session = await mysql('create table t (n int); insert into t values (1), (2), (3); select sum(n), current_user() from t');
    expect(session.stderr).toBe('');
    expect(session.stdout.trim()).toBe('6\tgwtest@%');
  });

  it('redis-cli: ping, set, get', async () => {
    expect((await redis('ping')).stdout.trim()).toBe('PONG');
    expect((await redis('set', 'greeting', 'hello through the tunnel')).stdout.trim()).toBe('OK');
    expect((await redis('get', 'greeting')).stdout.trim()).toBe('hello through the tunnel');
    const noAuth = await client('redis-cli', ['-h', '127.0.0.1', '-p', String(local.cache), 'get', 'greeting']);
    expect(noAuth.stdout).toContain('NOAUTH');
  });

  it('1 GiB through the app tunnel, byte-exact (sha256 at both ends)', async () => {
    const r = await transfer('127.0.0.1', local.bulk, { id: 1, upload: GiB, download: 0, seed: 1, timeoutMs: 150_000 });
    expect(r.sent.bytes).toBe(GiB);
    expect(r.server.received).toEqual(r.sent);
    // The far end printed the same report.
    const printed = bulkOutput.split('\n').filter((l) => l.startsWith('{"id":1,')).map((l) => JSON.parse(l) as BulkReport);
    expect(printed).toEqual([r.server]);
  }, 180_000);

  it('100 concurrent streams through one agent, each byte-exact both ways', async () => {
    const size = 512 * 1024;
    const results = await Promise.all(Array.from({ length: 100 }, (_, i) => transfer('127.0.0.1', local.bulk, { id: 100 + i, upload: size, download: size, seed: 100 + i, timeoutMs: 90_000 })));
    for (const [i, r] of results.entries()) {
      expect(r.server.id).toBe(100 + i);
      expect(r.server.received).toEqual(r.sent);
      expect(r.sent.bytes).toBe(size);
      expect(r.received).toEqual(r.server.sent);
      expect(r.received.sha256).toBe(expectedDownloadSha256(size, 100 + i));
    }
  }, 120_000);
});

describeAsRoot('faults: the tunnel comes back by itself', () => {
  it('kill -9 of the agent; started again, it reconnects with its stored identity', async () => {
    const since = Date.now();
    await agent!.kill();
    // squid logs a tunnel when it closes: the agent's tunnel carried the gigabyte above.
    const tunnelLine = await squid.waitForAccessLog((l) => {
      const e = parseAccessLogLine(l);
      return e.client === fw.agentIp && e.method === 'CONNECT' && e.url === proxyAddr && e.bytesToClient > GiB;
    });
    expect(parseAccessLogLine(tunnelLine).status).toBe(200);
    const logFrom = agent!.logs().length;
    await agent!.restart();
    expect(agent!.logs().slice(logFrom)).toContain('using the stored host identity');
    await expectBack(since);
  });

  it('the Proxy daemon restarts (same data directory)', async () => {
    const since = Date.now();
    expect(await proxy.stop()).toBe(0);
    await proxy.restart();
    await expectBack(since);
  });

  it('squid restarts', async () => {
    const since = Date.now();
    await squid.restart();
    await expectBack(since);
  });

  it('the agent is cut off for longer than the heartbeat window: offline while away, online when back', async () => {
    const cut = Date.now();
    fw.setAgentLink(false);
    let offline: NodeResource;
    try {
      offline = await eventually('gwctl get nodes shows the agent offline', async () => {
        const node = await agentNode();
        if (node.spec.status !== 'offline') throw new Error(node.spec.status);
        return node;
      });
      // Away for longer than the heartbeat window (3 x 1 s), whatever the detection took.
      await sleep(Math.max(0, cut + 4000 - Date.now()));
      // A new connection meanwhile is refused with a reason, not left hanging.
      const pgProxy = gwshProxies[0]!;
      const from = pgProxy.output().length;
      const refused = await psql('select 1');
      expect(refused.status).not.toBe(0);
      await eventually('gwsh proxy db says why', async () => {
        if (!pgProxy.output().slice(from).includes('code: GW_ERR_TUNNEL_NOT_FOUND')) throw new Error(pgProxy.output().slice(from));
      }, 5000);
    } finally {
      fw.setAgentLink(true);
    }
    expect(offline.spec.status).toBe('offline');
    await expectBack(Date.now());
    expect(proxy.logs()).toContain('agent missed its heartbeats; marking it offline');
  });
});

describeAsRoot('agents that must be refused say why', () => {
  it('a wrong token', async () => {
    const r = await agentOnce('agent-bad-token', ['--token', 'f'.repeat(32), '--ca-pin', pin, '--proxy', proxyAddr]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_AUTH_TOKEN_UNKNOWN');
    expect(existsSync(join(r.dataDir, 'host', 'cert.pem'))).toBe(false);
  });

  it('a wrong CA pin (refused before the token is sent)', async () => {
    const r = await agentOnce('agent-bad-pin', ['--token', await newToken(), '--ca-pin', `sha256:${'0'.repeat(64)}`, '--proxy', proxyAddr]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_AUTH_PIN_MISMATCH');
    expect(existsSync(join(r.dataDir, 'host', 'cert.pem'))).toBe(false);
  });

  describe('a host identity from another cluster', () => {
    let otherHostDir: string;

    beforeAll(async () => {
      // Another cluster issues a host identity to an agent running next to its Auth Service.
      const other = await startGateway(
        ['gateway:', '  nodename: other-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: other.example', '  listen_addr: 127.0.0.1:0', 'db_service:', '  enabled: yes', ''].join('\n'),
      );
      otherHostDir = join(dir, 'other-host');
      cpSync(join(other.dataDir, 'host'), otherHostDir, { recursive: true });
      await other.stop();
    });

    /** An agent whose data directory holds that identity, pointed at our Proxy (through squid). */
    async function stranger(name: string, trustOurCa: boolean): Promise<NsGateway> {
      const dataDir = join(await mkdtemp(join(dir, `${name}-`)), 'data');
      cpSync(otherHostDir, join(dataDir, 'host'), { recursive: true });
      const identityFile = join(dataDir, 'host', 'identity.json');
      writeFileSync(identityFile, JSON.stringify({ ...(JSON.parse(readFileSync(identityFile, 'utf8')) as object), server: proxyAddr }));
      if (trustOurCa) cpSync(join(proxy.dataDir, 'admin', 'host-ca.pem'), join(dataDir, 'host', 'host-ca.pem'));
      const config = agentConfig(name).replace(/app_service:[\s\S]*/, '').replaceAll('DATA_DIR', dataDir);
      const gw = await startGatewayIn(fw, fw.agentNs, config, { name, env: { HTTPS_PROXY: squid.url } });
      extraAgents.push(gw);
      return gw;
    }

    it('trusting our CA, it is refused by the Proxy, and its log names both clusters', async () => {
      const proxyLogFrom = proxy.logs().length;
      const agentOther = await stranger('agent-other', true);
      const line = JSON.parse(await agentOther.waitForLog('GW_ERR_TUNNEL_AUTH', 20_000)) as { msg: string; err: string; hint: string };
      expect(line.msg).toBe('the Proxy refused this agent');
      expect(line.err).toContain('(cluster "fw.example") refused this agent');
      expect(line.err).toContain('belongs to cluster "other.example"');
      expect(line.hint).toMatch(/join this cluster again/);
      const refusal = JSON.parse(await proxy.waitForLog('agent refused', 5000, proxyLogFrom)) as { why: string };
      expect(refusal.why).toMatch(/not signed by this cluster|unknown host ID/);
      expect(agentOther.logs()).not.toContain('reverse tunnel ready');
      await agentOther.stop(true);
    });

    it('trusting its own CA, it refuses our Proxy (whose certificate that CA did not sign) and says so', async () => {
      const agentOther = await stranger('agent-other-ca', false);
      const line = JSON.parse(await agentOther.waitForLog('"cannot reach the Proxy"', 20_000)) as { code: string; err: string };
      expect(line.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
      expect(line.err).toContain('not trusted');
      expect(agentOther.logs()).not.toContain('reverse tunnel ready');
      await agentOther.stop(true);
    });
  });
});
