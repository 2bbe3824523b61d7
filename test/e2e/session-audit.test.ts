/**
 * Every session the Proxy carries reaches the audit log (issue 23, item 6): a real psql session through
 * `gwsh proxy db`, a TCP app and a desktop through `gwsh proxy`, an HTTP app and a Kubernetes connection by
 * certificate, a connection the client resets, and the Proxy stopping with a session open. Real daemons on
 * loopback; the agent and gwsh reach the Proxy through squid, as in apps-kube.test.ts.
 *
 * No Kubernetes API server can run here: an HTTPS server with its own CA stands in for it (it answers every
 * request with its path), reached by the agent as k8s-api.gw.test through squid.
 *
 * The hostile case: a user who opens and drops many connections gets at most USER_BUDGET sessions recorded one by
 * one a minute; the others are counted in one coalesced record per user and kind (written each minute, and when the
 * Proxy stops), so the log stays bounded and every session is still counted.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { USER_BUDGET } from '../../src/proxy/sessionaudit.js';
import { startMariadb, startPostgres, type DatabaseServer, type PostgresServer } from '../helpers/databases.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startEchoServer, startHttpsServer, type EchoServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { waitUntil } from '../helpers/wait.js';
import { curl } from '../helpers/curl.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'proxy.gw.test';
const RESOURCE_IP = '127.0.0.6';
const PASSWORD = 'correct horse battery';

let dir: string;
let squid: Squid;
let pki: TestPki;
let cluster: RunningGateway;
let clusterConfig: string;
let agent: RunningGateway;
let webPort: number;
let app: http.Server;
let apiServer: HttpTestServer;
let echo: EchoServer;
let pg: PostgresServer;
let maria: DatabaseServer;
let userEnv: Record<string, string>;
const children: ChildProcess[] = [];

type Event = Record<string, unknown> & { event: string };

const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });

async function events(): Promise<Event[]> {
  const r = await admin(['get', 'events', '--format', 'json']);
  expect(r.status, r.stderr).toBe(0);
  return (JSON.parse(r.stdout) as Array<{ spec: Event }>).map((e) => e.spec);
}

/** The start and end records of the one session matching match (waits for the end: it is written as the connection closes). */
async function sessionOf(kind: string, match: (e: Event) => boolean): Promise<{ start: Event; end: Event }> {
  let found: { start: Event; end: Event } | undefined;
  await waitUntil(`${kind}.session.end`, async () => {
    const all = await events();
    const end = all.find((e) => e.event === `${kind}.session.end` && e.session !== undefined && match(e));
    const start = end && all.find((e) => e.event === `${kind}.session.start` && e.session === end.session);
    if (end && start) found = { start, end };
    return found !== undefined;
  }, 30_000);
  return found!;
}

/** `gwsh proxy ...` as a long-running process; resolves with its local port once it listens. */
async function localProxy(args: string[]): Promise<number> {
  return (await startGwshProxy(args, userEnv, children)).port;
}

function run(cmd: string, args: string[], env: Record<string, string> = {}): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((done) => {
    const child = spawn(cmd, args, { env: { PATH: process.env.PATH ?? '', ...env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('close', (status) => done({ status, stdout, stderr }));
  });
}

const tcps = new WeakMap<tls.TLSSocket, net.Socket>();

/** A TLS connection of alice's straight to the Proxy's web port on a resource route, past its route header. */
async function rawResource(alpn: string, header: Record<string, unknown>): Promise<tls.TLSSocket> {
  const home = userEnv.GWSH_HOME!;
  const [cert, key, ca] = await Promise.all(['cert.pem', 'key.pem', 'host-ca.pem'].map((f) => readFile(join(home, f), 'utf8')));
  const tcp = net.connect({ host: PROXY_IP, port: webPort });
  const socket = tls.connect({ socket: tcp, servername: PROXY_NAME, ALPNProtocols: [alpn], cert, key, ca });
  socket.once('close', () => tcp.destroy());
  tcps.set(socket, tcp);
  await new Promise<void>((ok, fail) => socket.once('secureConnect', ok).once('error', fail));
  socket.write(`${JSON.stringify(header)}\n`);
  const answer = await new Promise<string>((ok, fail) => {
    let got = '';
    const onData = (c: Buffer) => {
      got += c.toString();
      if (!got.includes('\n')) return;
      socket.off('data', onData);
      ok(got);
    };
    socket.on('data', onData).once('error', fail);
  });
  expect(JSON.parse(answer.split('\n')[0]!)).toEqual({ ok: true });
  return socket;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-audit-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n${RESOURCE_IP} k8s-api.gw.test\n`, { mode: 0o644 });
  const [pgPort, mariaPort] = [await getPort({ host: '127.0.0.1' }), await getPort({ host: '127.0.0.1' })];
  [squid, pki, pg, maria] = await Promise.all([startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] }), makeTestPki(), startPostgres({ port: pgPort }), startMariadb({ port: mariaPort, user: 'shop_app', database: 'shop' })]);
  app = http.createServer((req, res) => res.end(JSON.stringify({ app: 'grafana', path: req.url })));
  await new Promise<void>((r) => app.listen(0, RESOURCE_IP, r));
  const apiCert = await pki.serverCert({ names: ['k8s-api.gw.test'], ips: [] });
  apiServer = await startHttpsServer({ cert: apiCert.certPem, key: apiCert.keyPem }, (req, res) => res.end(JSON.stringify({ path: req.url })), RESOURCE_IP);
  echo = await startEchoServer(RESOURCE_IP);

  webPort = await getPort({ host: PROXY_IP });
  clusterConfig = ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: audit.example', '  listen_addr: 127.0.0.1:0', '  keep_alive_interval: 1s', 'proxy_service:', `  web_listen_addr: ${PROXY_IP}:${webPort}`, `  public_addr: ${PROXY_NAME}:${webPort}`, ''].join('\n');
  // Its own data directory, kept when it stops: the last test starts it again on the same data.
  cluster = await startGateway(clusterConfig, { dataDir: join(dir, 'cluster-data') });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  const role = ['kind: role', 'version: v7', 'metadata: {name: everything}', 'spec:', '  allow:', '    app_labels: {"*": "*"}', '    kubernetes_labels: {"*": "*"}', '    kubernetes_groups: [viewers]', '    windows_desktop_labels: {"*": "*"}', '    db_labels: {"*": "*"}', `    db_users: [${pg.user}, ${maria.user}]`, `    db_names: [${pg.database}, ${maria.database}]`, ''];
  await writeFile(join(dir, 'role.yaml'), role.join('\n'));
  expect((await admin(['create', join(dir, 'role.yaml')])).status).toBe(0);
  await admin(['users', 'add', 'alice', '--roles=everything'], `${PASSWORD}\n`);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=app,kube,desktop,db', '--format', 'json'])).stdout) as { token: string }).token;
  const caFile = join(dir, 'k8s-ca.pem');
  await writeFile(caFile, pki.caPem);
  const appPort = (app.address() as net.AddressInfo).port;
  agent = await startGateway(
    [
      'gateway:', '  nodename: agent-all', '  data_dir: DATA_DIR', '  log: { format: json }',
      'app_service:', '  enabled: yes', '  apps:',
      `    - { name: grafana, uri: "http://${RESOURCE_IP}:${appPort}", public_addr: grafana.${PROXY_NAME} }`,
      `    - { name: echo-tcp, uri: "tcp://${RESOURCE_IP}:${echo.port}" }`,
      'kube_service:', '  enabled: yes', '  clusters:',
      `    - { name: dev, api_server: "https://k8s-api.gw.test:${apiServer.port}", ca_file: ${caFile} }`,
      'windows_desktop_service:', '  enabled: yes', '  desktops:', `    - { name: win-1, addr: "${RESOURCE_IP}:${echo.port}" }`,
      'db_service:', '  enabled: yes', '  databases:', `    - { name: pg, protocol: postgres, uri: 127.0.0.1:${pgPort} }`,
      `    - { name: maria, protocol: mysql, uri: 127.0.0.1:${mariaPort} }`,
      '',
    ].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`], env: { HTTPS_PROXY: squid.url } },
  );
  await agent.waitForLog('reverse tunnel ready');
  // This file is the Proxy's audit of the classic route (the database user and name from the protocol's startup,
  // the plaintext bytes both ways), so gwsh takes that route here; end-to-end streams, which the Proxy cannot read,
  // are audited at both ends: test/e2e/e2e-streams.test.ts and test/agent/e2e.test.ts.
  userEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice'), HTTPS_PROXY: squid.url, GWSH_E2E: 'off' };
  const login = await runCli('gwsh', ['login', `--proxy=${PROXY_NAME}:${webPort}`, '--user=alice', `--ca-pin=${pin}`], { env: userEnv, input: `${PASSWORD}\n` });
  expect(login.status, login.stderr).toBe(0);
}, 120_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGTERM');
  await agent?.stop();
  await cluster?.stop();
  await squid?.stop();
  app?.close();
  await apiServer?.close();
  await echo?.close();
  await pg?.stop();
  await maria?.stop();
  await pki?.cleanup();
  await rm(dir, { recursive: true, force: true });
});

/** The fields every session record carries, as SSH session records do (session, user, node, client, time). */
function expectSession(s: { start: Event; end: Event }, resource: string): void {
  for (const e of [s.start, s.end]) {
    expect(e).toMatchObject({ user: 'alice', resource, node: 'agent-all', reported_by: { proxy_id: expect.any(String) } });
    expect(e.client).toMatch(/^[\d.]+:\d+$/);
  }
  expect(Date.parse(s.end.time as string)).toBeGreaterThanOrEqual(Date.parse(s.start.time as string));
  expect(s.end.start).toBe(s.start.time);
  expect(s.end.duration_ms).toBeGreaterThanOrEqual(0);
}

describe('session audit', () => {
  it('a real psql session through gwsh proxy db: db.session.start and .end with the database user, name and bytes', async () => {
    const port = await localProxy(['db', 'pg']);
    const r = await run('psql', [`host=127.0.0.1 port=${port} user=${pg.user} dbname=${pg.database} sslmode=disable connect_timeout=10`, '-X', '-At', '-c', "select repeat('x', 5000)"], { PGPASSWORD: pg.password });
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('x'.repeat(5000));
    const s = await sessionOf('db', (e) => e.resource === 'pg');
    expectSession(s, 'pg');
    for (const e of [s.start, s.end]) expect(e).toMatchObject({ protocol: 'postgres', db_user: pg.user, db_name: pg.database });
    // psql's startup, password and query went in; the 5000-character answer came out.
    expect(s.end.bytes_in).toBeGreaterThan(50);
    expect(s.end.bytes_out).toBeGreaterThan(5000);
    expect(s.end.error).toBeUndefined();
  });

  it('a real MariaDB client (the mariadb command) session through gwsh proxy db: the database user and name from its handshake', async () => {
    const port = await localProxy(['db', 'maria']);
    const r = await run('mariadb', ['--no-defaults', '-h', '127.0.0.1', '-P', String(port), '-u', maria.user, `-p${maria.password}`, '--connect-timeout=10', '-N', '-s', maria.database, '-e', "select repeat('y', 3000)"]);
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('y'.repeat(3000));
    const s = await sessionOf('db', (e) => e.resource === 'maria');
    expectSession(s, 'maria');
    for (const e of [s.start, s.end]) expect(e).toMatchObject({ protocol: 'mysql', db_user: 'shop_app', db_name: 'shop' });
    expect(s.end.bytes_out).toBeGreaterThan(3000);
  });

  it('a TCP app and a desktop through gwsh proxy: app.session.* and desktop.session.* with bytes both ways', async () => {
    for (const [args, kind, name] of [[['app', 'echo-tcp'], 'app', 'echo-tcp'], [['desktop', 'win-1'], 'desktop', 'win-1']] as const) {
      const port = await localProxy([...args]);
      const message = `${name} `.repeat(300);
      await new Promise<void>((done, fail) => {
        const s = net.connect({ port, host: '127.0.0.1' }, () => s.write(message));
        let got = '';
        s.on('data', (c: Buffer) => {
          got += c.toString();
          if (got.length >= message.length) s.end();
        });
        s.on('close', () => done()).on('error', fail);
      });
      const session = await sessionOf(kind, (e) => e.resource === name);
      expectSession(session, name);
      expect(session.end.bytes_in).toBe(message.length);
      expect(session.end.bytes_out).toBe(message.length);
    }
  });

  it('an HTTP app by certificate: one session for the connection, not one per request', async () => {
    const userCert = ['--cert', join(userEnv.GWSH_HOME!, 'cert.pem'), '--key', join(userEnv.GWSH_HOME!, 'key.pem'), '--cacert', join(userEnv.GWSH_HOME!, 'host-ca.pem')];
    const url = `https://grafana.${PROXY_NAME}:${webPort}`;
    // Three requests on one connection (curl reuses it for URLs of one host).
    const r = await curl([...userCert, '--resolve', `grafana.${PROXY_NAME}:${webPort}:${PROXY_IP}`, `${url}/a`, `${url}/b`, `${url}/c`]);
    expect(r.stderr).toBe('');
    const s = await sessionOf('app', (e) => e.resource === 'grafana');
    expectSession(s, 'grafana');
    expect(s.end.requests).toBe(3);
    expect(s.end.bytes_out).toBeGreaterThan(3 * 20);
    expect((await events()).filter((e) => e.event === 'app.session.start' && e.resource === 'grafana')).toHaveLength(1);
  });

  it('Kubernetes (a stand-in API server): kube.session.* per user connection and cluster', async () => {
    const kubeHost = `kube-gateway-proxy-alpn.${PROXY_NAME}`;
    const userCert = ['--cert', join(userEnv.GWSH_HOME!, 'cert.pem'), '--key', join(userEnv.GWSH_HOME!, 'key.pem'), '--cacert', join(userEnv.GWSH_HOME!, 'host-ca.pem')];
    const r = await curl([...userCert, '--resolve', `${kubeHost}:${webPort}:${PROXY_IP}`, `https://${kubeHost}:${webPort}/k8s/dev/api/v1/pods`, `https://${kubeHost}:${webPort}/k8s/dev/api/v1/nodes`]);
    expect(r.stderr).toBe('');
    const s = await sessionOf('kube', (e) => e.resource === 'dev');
    expectSession(s, 'dev');
    expect(s.end.requests).toBe(2);
    expect(s.end.bytes_out).toBeGreaterThan(20);
  });

  it('hostile: a connection the client resets still gets its end, with an error', async () => {
    const socket = await rawResource('gateway-tcp', { resource: 'echo-tcp', kind: 'app' });
    socket.write('before the reset');
    await new Promise((r) => socket.once('data', r));
    const tcp = tcps.get(socket)!;
    const port = tcp.localPort;
    // A RST from the client's kernel: no TLS close_notify, no FIN.
    tcp.resetAndDestroy();
    const s = await sessionOf('app', (e) => e.resource === 'echo-tcp' && typeof e.client === 'string' && e.client.endsWith(`:${port}`));
    expect(s.end.error).toEqual(expect.any(String));
    expect(s.end.bytes_in).toBe('before the reset'.length);
  });

  it('hostile: kill -9 of the agent mid-session: the Proxy still records the end, with an error', async () => {
    const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
    const token = (JSON.parse((await admin(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
    const doomed = await startGateway(
      ['gateway:', '  nodename: agent-doomed', '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: echo-doomed, uri: "tcp://${RESOURCE_IP}:${echo.port}" }`, ''].join('\n'),
      { args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`], env: { HTTPS_PROXY: squid.url } },
    );
    try {
      await doomed.waitForLog('reverse tunnel ready');
      const socket = await rawResource('gateway-tcp', { resource: 'echo-doomed', kind: 'app' });
      socket.on('error', () => undefined);
      socket.write('x'.repeat(1000));
      await new Promise((r) => socket.once('data', r));
      doomed.process.kill('SIGKILL');
      const s = await sessionOf('app', (e) => e.resource === 'echo-doomed');
      expect(s.end).toMatchObject({ user: 'alice', node: 'agent-doomed', bytes_in: 1000, error: expect.any(String) });
    } finally {
      // stop() waits for an exit that a kill -9 already gave.
      if (doomed.process.signalCode === null) await doomed.stop();
      else await rm(doomed.dir, { recursive: true, force: true });
    }
  }, 120_000);

  it('gwctl get events -f text: a row per event with user, resource, bytes and duration', async () => {
    const r = await admin(['get', 'events', '-f', 'text']);
    expect(r.status, r.stderr).toBe(0);
    const lines = r.stdout.split('\n');
    expect(lines[0]).toMatch(/^TIME\s+EVENT\s+USER\s+RESOURCE\s+CLIENT\s+BYTES IN\/OUT\s+DURATION/);
    const dbEnd = lines.find((l) => / db\.session\.end /.test(l));
    expect(dbEnd).toMatch(/alice\s+pg \(postgres, gwtest@gwtest\)/);
    expect(dbEnd).toMatch(/\d+(\.\d)? ?[kM]?B\/\d+(\.\d)? ?[kM]?B/);
  });

  it('hostile: opening and dropping many connections is bounded and coalesced; the Proxy stopping ends what is open', async () => {
    const appEnds = (all: Event[]) => all.filter((e) => e.user === 'alice' && e.event === 'app.session.end');
    const endsBefore = appEnds(await events()).length;
    const FLOOD = 3 * USER_BUDGET;
    for (let i = 0; i < FLOOD; i += 20) {
      await Promise.all(Array.from({ length: Math.min(20, FLOOD - i) }, async () => (await rawResource('gateway-tcp', { resource: 'echo-tcp', kind: 'app' })).destroy()));
    }
    // A psql session left open while the Proxy stops.
    const port = await localProxy(['db', 'pg']);
    const held = spawn('psql', [`host=127.0.0.1 port=${port} user=${pg.user} dbname=${pg.database} sslmode=disable`, '-X', '-At', '-c', 'select pg_sleep(120)'], { env: { PATH: process.env.PATH ?? '', PGPASSWORD: pg.password } });
    children.push(held);
    const open = (all: Event[]) => all.filter((e) => e.event === 'db.session.start' && !all.some((x) => x.event === 'db.session.end' && x.session === e.session));
    await waitUntil('the held psql session to start', async () => open(await events()).length === 1, 30_000);
    await cluster.stop();
    cluster = await startGateway(clusterConfig, { dataDir: cluster.dataDir });
    const all = await events();
    const stopped = all.filter((e) => e.event === 'db.session.end' && e.error === 'proxy stopping');
    expect(stopped).toHaveLength(1);
    expect(stopped[0]).toMatchObject({ user: 'alice', resource: 'pg', db_user: pg.user, db_name: pg.database });
    expect(open(all)).toHaveLength(0);
    const ends = appEnds(all).slice(endsBefore);
    const coalesced = ends.filter((e) => typeof e.coalesced === 'number');
    // Coalesced records (one a minute: written as the Proxy stopped, or by its minute's flush if it came during
    // the flood) for what went over alice's budget...
    expect(coalesced.length).toBeGreaterThanOrEqual(1);
    for (const c of coalesced) expect(c).toMatchObject({ resources: ['echo-tcp'], reported_by: { proxy_id: expect.any(String) } });
    // ...and every session of the flood counted exactly once: on its own record or in a coalesced count.
    const own = ends.length - coalesced.length;
    expect(own + coalesced.reduce((n, c) => n + (c.coalesced as number), 0)).toBe(FLOOD);
    expect(own).toBeLessThan(FLOOD);
  }, 180_000);
});
