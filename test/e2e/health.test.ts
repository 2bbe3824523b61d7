/**
 * Health that proves the path (docs/operations.md, "Health" and "Probing the path"), end to end with the real
 * binaries and real peers: a cluster (auth + proxy) on PostgreSQL and an agent serving that PostgreSQL as a
 * database, an HTTP app whose server this test opens and closes, and its SSH Service, each with --diag-addr.
 *
 *   /readyz names each check; stopping PostgreSQL turns the cluster unready with "backend" failing (and the
 *   agent's "db pg"), starting it again turns both ready; stopping the cluster cuts the agent's tunnel ("tunnel"
 *   fails) and takes the Auth Service from a Proxy running in its own process ("auth" fails), starting it again
 *   brings both back.
 *   gwctl probe: each hop's time, text and json; a resource the caller cannot reach is "not found" exactly as
 *   one that does not exist; a resource that does not answer fails naming the resource hop.
 * Waits use eventually(): nothing here asserts how fast anything happens.
 */
import http from 'node:http';
import net from 'node:net';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { runCli, startGateway, startGatewayExpectingFailure, type RunningGateway } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { eventually } from '../helpers/wait.js';

const PASSWORD = 'correct horse battery';
let dir: string;
let pg: PostgresServer;
let cluster: RunningGateway;
let agent: RunningGateway;
let clusterDiag: string;
let agentDiag: string;
let proxyAddr: string;
let clusterData: string;
let authPort: number;
let splitProxy: RunningGateway;
let splitDiag: string;
let appPort: number;
let app: net.Server | undefined;

interface Ready {
  status: number;
  body: { status: string; checks: Array<{ name: string; ok: boolean; detail: string; since: string }> };
}

function readyz(addr: string): Promise<Ready> {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];
  return new Promise((resolve, reject) => {
    http
      .get({ host, port, path: '/readyz', agent: false, timeout: 5_000 }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(body) as Ready['body'] }));
      })
      .on('error', reject);
  });
}

/** Resolves once /readyz answers `status` and `check` is in the state wanted. */
function readyzUntil(addr: string, status: number, check: string, ok: boolean): Promise<Ready> {
  return eventually(`${addr}/readyz ${status} with ${check} ${ok ? 'ok' : 'failing'}`, async () => {
    const r = await readyz(addr);
    if (r.status !== status || r.body.checks.find((c) => c.name === check)?.ok !== ok) throw new Error(JSON.stringify(r));
    return r;
  }, 60_000, 500);
}

const clusterConfig = (webPort: number) =>
  ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', '  storage:', '    type: postgres', `    conn_string: "${pg.url()}"`,
    'auth_service:', '  cluster_name: health.example', `  listen_addr: 127.0.0.1:${authPort}`, '  keep_alive_interval: 1s',
    'proxy_service:', `  web_listen_addr: 127.0.0.1:${webPort}`, `  public_addr: 127.0.0.1:${webPort}`, ''].join('\n');

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', clusterData, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const envOf = (user: string) => ({ HOME: dir, GWSH_HOME: join(dir, `gwsh-${user}`) });

function openApp(): Promise<void> {
  app = net.createServer((s) => s.end());
  return new Promise((resolve) => app!.listen(appPort, '127.0.0.1', () => resolve()));
}

let webPort: number;
let clusterDiagPort: number;

async function startCluster(): Promise<void> {
  cluster = await startGateway(clusterConfig(webPort), { dataDir: clusterData, args: ['--diag-addr', `127.0.0.1:${clusterDiagPort}`] });
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-health-'));
  await chmod(dir, 0o755);
  clusterData = join(dir, 'cluster-data');
  let pgPort: number, agentDiagPort: number, splitWebPort: number, splitDiagPort: number;
  [pgPort, webPort, clusterDiagPort, agentDiagPort, appPort, authPort, splitWebPort, splitDiagPort] = (await Promise.all([getPort(), getPort(), getPort(), getPort(), getPort(), getPort(), getPort(), getPort()])) as [number, number, number, number, number, number, number, number];
  proxyAddr = `127.0.0.1:${webPort}`;
  pg = await startPostgres({ port: pgPort });
  await openApp();
  await startCluster();
  clusterDiag = cluster.addresses.diag!;
  const pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=db,app,node', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(
    ['gateway:', '  nodename: health-agent', '  data_dir: DATA_DIR', '  log: { format: json }', 'db_service:', '  enabled: yes', '  databases:',
      `    - { name: pg, protocol: postgres, uri: 127.0.0.1:${pgPort}, labels: { env: prod } }`,
      'app_service:', '  enabled: yes', '  apps:', `    - { name: echo, uri: "http://127.0.0.1:${appPort}" }`, 'ssh_service:', '  enabled: yes', ''].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr, '--diag-addr', `127.0.0.1:${agentDiagPort}`] },
  );
  agentDiag = agent.addresses.diag!;
  await agent.waitForLog('reverse tunnel ready', 20_000);
  // A Proxy in its own process: its Auth Service is the cluster's Auth API.
  const proxyToken = (JSON.parse((await gwctl(['tokens', 'add', '--type=proxy', '--format', 'json'])).stdout) as { token: string }).token;
  splitProxy = await startGateway(
    ['gateway:', '  nodename: proxy-2', '  data_dir: DATA_DIR', '  log: { format: json }', `  auth_server: [127.0.0.1:${authPort}]`, 'auth_service:', '  enabled: no',
      'proxy_service:', `  web_listen_addr: 127.0.0.1:${splitWebPort}`, `  public_addr: 127.0.0.1:${splitWebPort}`, ''].join('\n'),
    { args: ['--roles=proxy', '--token', proxyToken, '--ca-pin', pin, '--diag-addr', `127.0.0.1:${splitDiagPort}`] },
  );
  splitDiag = splitProxy.addresses.diag!;
  // alice may reach every database; bob's role reaches none.
  expect((await gwctl(['users', 'add', 'alice', '--roles=access', '--db-users=gwtest', '--db-names=gwtest'], `${PASSWORD}\n`)).stderr).toBe('');
  expect((await gwctl(['users', 'add', 'bob', '--roles=auditor'], `${PASSWORD}\n`)).stderr).toBe('');
  for (const user of ['alice', 'bob']) {
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, `--user=${user}`, `--ca-pin=${pin}`], { env: envOf(user), input: `${PASSWORD}\n` });
    expect(login.stderr).toBe('');
  }
}, 180_000);

afterAll(async () => {
  app?.close();
  await splitProxy?.stop();
  await agent?.stop();
  await cluster?.stop();
  await pg?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

rootSuite(['dbUsers'])('readiness and the probe, with PostgreSQL and an agent', () => {
  it('/readyz names each check: the cluster its backend, its Auth Service and its listeners; the agent its tunnel and resources', async () => {
    const c = await readyzUntil(clusterDiag, 200, 'backend', true);
    expect(c.body.status).toBe('ready');
    expect(c.body.checks.map((x) => x.name)).toEqual(expect.arrayContaining(['backend', 'auth', 'listener web']));
    const a = await readyzUntil(agentDiag, 200, 'tunnel', true);
    expect(a.body.checks.map((x) => x.name).sort()).toEqual(['app echo', 'db pg', 'tunnel']);
  }, 90_000);

  it('PostgreSQL stopped: the cluster is unready naming the backend (the agent: its database); started again: ready', async () => {
    await pg.halt();
    try {
      const down = await readyzUntil(clusterDiag, 503, 'backend', false);
      expect(down.body.status).toBe('not ready');
      expect(down.body.checks.filter((x) => !x.ok).map((x) => x.name)).toEqual(['backend']);
      // What the check saw, without the connection string's password: /readyz answers without credentials.
      expect(down.body.checks[0]!.detail).toContain('PostgreSQL');
      expect(JSON.stringify(down.body)).not.toContain(pg.password);
      await readyzUntil(agentDiag, 503, 'db pg', false);
    } finally {
      await pg.resume();
    }
    await readyzUntil(clusterDiag, 200, 'backend', true);
    await readyzUntil(agentDiag, 200, 'db pg', true);
  }, 150_000);

  it('gwctl probe: each hop, in text and json; the admin identity starts at the Proxy given with --proxy', async () => {
    const text = await gwctl(['probe', 'db', 'pg', '--proxy', proxyAddr]);
    expect(text.stderr).toBe('');
    expect(text.stdout).toMatch(/^db "pg" answered through agent "health-agent" \(local\)/);
    for (const hop of ['find', 'tunnel', 'resource']) expect(text.stdout).toMatch(new RegExp(`^${hop}\\s+\\d`, 'm'));
    const json = JSON.parse((await gwctl(['probe', 'app', 'echo', '--proxy', proxyAddr, '-f', 'json'])).stdout) as { via: string; hops: Array<{ hop: string; ms: number }> };
    expect(json.via).toBe('local');
    expect(json.hops.map((h) => h.hop)).toEqual(['find', 'tunnel', 'resource']);
    for (const h of json.hops) expect(h.ms).toBeGreaterThanOrEqual(0);
    // A node: its SSH Service runs in the agent, which answers for it.
    const node = JSON.parse((await gwctl(['probe', 'node', 'health-agent', '--proxy', proxyAddr, '-f', 'json'])).stdout) as { hops: Array<{ hop: string; detail?: string }> };
    expect(node.hops.at(-1)).toMatchObject({ hop: 'resource', detail: 'the SSH Service runs in the agent' });
    // Without --proxy the admin identity names only the Auth API: a usage error saying what to give.
    const noProxy = await gwctl(['probe', 'db', 'pg']);
    expect(noProxy.stderr).toContain('code: GW_ERR_USAGE');
  }, 60_000);

  it('a signed-in user probes what their roles reach; another resource is "not found" exactly as one that does not exist', async () => {
    const alice = await runCli('gwctl', ['probe', 'db', 'pg'], { env: envOf('alice') });
    expect(alice.stderr).toBe('');
    const bobHidden = await runCli('gwctl', ['probe', 'db', 'pg'], { env: envOf('bob') });
    const bobAbsent = await runCli('gwctl', ['probe', 'db', 'nosuch'], { env: envOf('bob') });
    expect(bobHidden.stderr).toContain('code: GW_ERR_TUNNEL_NOT_FOUND');
    // The same answer but for the name the caller gave: nothing tells an existing resource from an absent one.
    expect(bobHidden.stderr.replaceAll('"pg"', '"X"')).toBe(bobAbsent.stderr.replaceAll('"nosuch"', '"X"'));
  }, 60_000);

  it('a resource that does not answer: the probe fails naming the resource hop, and /readyz names the app', async () => {
    await new Promise((r) => app!.close(r));
    try {
      const r = await gwctl(['probe', 'app', 'echo', '--proxy', proxyAddr]);
      expect(r.stderr).toContain('code: GW_ERR_PROBE_FAILED');
      expect(r.stderr).toContain('failed at the resource hop');
      await readyzUntil(agentDiag, 503, 'app echo', false);
    } finally {
      await openApp();
    }
    await readyzUntil(agentDiag, 200, 'app echo', true);
  }, 90_000);

  it('a Proxy in its own process checks its Auth Service (the Auth API) and its listeners, not a backend of its own', async () => {
    const r = await readyzUntil(splitDiag, 200, 'auth', true);
    expect(r.body.checks.map((c) => c.name)).toEqual(['auth', 'listener web']);
  }, 60_000);

  it('the cluster stopped: the agent is unready naming its tunnel, the other Proxy naming its Auth Service; the cluster back: both ready', async () => {
    await cluster.stop();
    await readyzUntil(agentDiag, 503, 'tunnel', false);
    const split = await readyzUntil(splitDiag, 503, 'auth', false);
    expect(split.body.checks.filter((c) => !c.ok).map((c) => c.name)).toEqual(['auth']);
    await startCluster();
    await readyzUntil(agentDiag, 200, 'tunnel', true);
    await readyzUntil(splitDiag, 200, 'auth', true);
    await readyzUntil(cluster.addresses.diag!, 200, 'backend', true);
  }, 150_000);

  it('--diag-addr on the address of a public listener is refused before anything starts: never on the public port', async () => {
    const port = await getPort();
    const r = await startGatewayExpectingFailure(
      ['gateway:', '  data_dir: DATA_DIR', 'auth_service:', '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 0.0.0.0:${port}`, ''].join('\n'),
      ['--diag-addr', `127.0.0.1:${port}`],
    );
    expect(r.stderr).toContain('GW_ERR_DIAG_ADDR_PUBLIC');
    expect(r.stderr).toContain('never on the public port');
  }, 60_000);
});
