/**
 * The Auth Service and the Proxy as separate processes, with the real binaries: PostgreSQL shared by TWO Auth
 * Services (`gateway start --roles=auth`, each its own data directory), and one Proxy-only process
 * (`--roles=proxy`, gateway.auth_server listing both) joined once with a token of type proxy at the first.
 * An agent joins through the Proxy and serves a TCP app; a user signs in through the Proxy and reaches the app
 * byte-exact; gwctl with the user's certificate works through the Proxy's web port. kill -9 of the Auth
 * Service the Proxy talks to: what is open stays open, and new connections work through the other one. A lock
 * created on either Auth Service closes a session on the Proxy. And join tokens stay single-use across both. A lock
 * on the Proxy's own host ID cuts its event stream and takes it, and the presence it wrote, out of the cluster.
 *
 * Nothing here asserts how fast: every wait has a generous bound.
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { generateKeyPair } from '../../src/auth/pki.js';
import { ApiClient, fetchPinnedCas } from '../../src/client/api.js';
import { Dialer } from '../../src/dial/dialer.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { runCli, startGateway, startGatewayExpectingFailure, type RunningGateway } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { pseudoRandomBytes, startEchoServer, type EchoServer } from '../helpers/servers.js';
import { waitUntil } from '../helpers/wait.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';

const PROXY_IP = '127.0.0.3';
const PASSWORD = 'correct horse battery';

let dir: string;
let pg: PostgresServer;
let authA: RunningGateway;
let authB: RunningGateway;
let proxy: RunningGateway;
let agent: RunningGateway;
let echo: EchoServer;
let proxyAddr: string;
let pin: string;
const children: ChildProcess[] = [];

const gwctlAt = (auth: RunningGateway, args: string[], input?: string) => runCli('gwctl', ['--data-dir', auth.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const envOf = (user: string) => ({ HOME: dir, GWSH_HOME: join(dir, `gwsh-${user}`) });
const gwsh = (user: string, args: string[], input?: string) => runCli('gwsh', args, { env: envOf(user), ...(input === undefined ? {} : { input }) });

function authConfig(name: string): string {
  return [
    'gateway:',
    `  nodename: ${name}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json }',
    '  storage:',
    '    type: postgres',
    `    conn_string: "${pg.url()}"`,
    'auth_service:',
    '  cluster_name: split.example',
    '  listen_addr: 127.0.0.1:0',
    '  keep_alive_interval: 1s',
    '',
  ].join('\n');
}

/** `gwsh proxy app echo-tcp` for a user; resolves with its local port and its output. */
async function appProxy(user: string) {
  return startGwshProxy(['app', 'echo-tcp'], envOf(user), children, { stdin: 'pipe' });
}

/** A TCP stream through the local proxy; `echoes` sends bytes and resolves with what came back (as many bytes). */
async function openStream(port: number) {
  const socket = net.connect({ port, host: '127.0.0.1' });
  socket.on('error', () => undefined);
  let got = Buffer.alloc(0);
  socket.on('data', (c: Buffer) => (got = Buffer.concat([got, c])));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  const echoes = async (bytes: Buffer) => {
    const before = got.length;
    socket.write(bytes);
    await waitUntil('the echo', () => got.length >= before + bytes.length, 30_000);
    return got.subarray(before, before + bytes.length);
  };
  return { socket, closed, echoes };
}

async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const result = await Promise.race([p.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms)))]);
  clearTimeout(timer);
  return result;
}

rootSuite(['dbUsers'])('Auth Services and a Proxy in separate processes', () => {
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-e2e-split-'));
    await chmod(dir, 0o755);
    pg = await startPostgres({ port: await getPort({ host: '127.0.0.1' }) });
    echo = await startEchoServer('127.0.0.1');
    authA = await startGateway(authConfig('auth-a'), { args: ['--roles=auth'] });
    authB = await startGateway(authConfig('auth-b'), { args: ['--roles=auth'] });
    pin = /CA pin:\s+(\S+)/.exec((await gwctlAt(authA, ['status'])).stdout)![1]!;
    expect(/CA pin:\s+(\S+)/.exec((await gwctlAt(authB, ['status'])).stdout)![1]).toBe(pin);
    const proxyToken = JSON.parse((await gwctlAt(authA, ['tokens', 'add', '--type=proxy', '--format', 'json'])).stdout) as { token: string; command: string };
    expect(proxyToken.command).toContain('--roles=proxy');
    expect(proxyToken.command).toContain(`--ca-pin=${pin}`);
    proxyAddr = `${PROXY_IP}:${await getPort({ host: PROXY_IP })}`;
    proxy = await startGateway(
      [
        'gateway:',
        '  nodename: proxy-1',
        '  data_dir: DATA_DIR',
        '  log: { format: json }',
        `  auth_server: [${authA.addresses.auth}, ${authB.addresses.auth}]`,
        'auth_service:',
        '  enabled: no',
        '  keep_alive_interval: 1s',
        'proxy_service:',
        `  web_listen_addr: ${proxyAddr}`,
        `  public_addr: ${proxyAddr}`,
        '',
      ].join('\n'),
      { args: ['--roles=proxy', '--token', proxyToken.token, '--ca-pin', pin] },
    );
    for (const user of ['bob', 'dave']) expect((await gwctlAt(authB, ['users', 'add', user, '--roles=access,editor'], `${PASSWORD}\n`)).status).toBe(0);
    const token = (JSON.parse((await gwctlAt(authB, ['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
    agent = await startGateway(
      ['gateway:', '  nodename: split-agent', '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: echo-tcp, uri: "tcp://127.0.0.1:${echo.port}" }`, ''].join('\n'),
      { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr] },
    );
    await agent.waitForLog('reverse tunnel ready', 30_000);
    for (const user of ['bob', 'dave']) {
      const login = await gwsh(user, ['login', `--proxy=${proxyAddr}`, `--user=${user}`, `--ca-pin=${pin}`], `${PASSWORD}\n`);
      expect(login.status, login.stderr).toBe(0);
    }
  }, 180_000);

  afterAll(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await agent?.stop();
    await proxy?.stop();
    await authB?.stop();
    // stop() waits for an exit that a kill -9 already gave.
    if (authA && authA.process.signalCode === null) await authA.stop();
    else if (authA) await rm(authA.dir, { recursive: true, force: true });
    await echo?.close();
    await pg?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('the Proxy runs without the Auth Service: its own host identity, the banner names the Auth Services', () => {
    expect(proxy.addresses.auth).toBeUndefined();
    expect(proxy.logs()).toContain('no Auth Service in this process');
    expect(proxy.logs()).toContain(authA.addresses.auth);
  });

  it('gwctl with a user certificate works through the Proxy web port', async () => {
    const status = await runCli('gwctl', ['status'], { env: envOf('bob') });
    expect(status.stderr).toBe('');
    expect(status.stdout).toContain(pin);
    const proxies = await runCli('gwctl', ['get', 'proxies', '--format', 'json'], { env: envOf('bob') });
    expect(proxies.status, proxies.stderr).toBe(0);
    expect(proxies.stdout).toContain(proxy.hostId!);
  });

  it('over HTTP/2 too: a request with the user certificate is forwarded to the Auth API, without its pseudo-headers', () => {
    const home = envOf('bob').GWSH_HOME;
    const r = spawnSync(
      'curl',
      ['-sS', '--max-time', '20', '--http2', '-w', '\n%{http_version}', '--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem'), `https://${proxyAddr}/v1/status`],
      { encoding: 'utf8' },
    );
    expect(r.stderr).toBe('');
    const [body, version] = r.stdout.split('\n');
    expect(version).toBe('2');
    // A pseudo-header (:method, :path) forwarded to the Auth API's HTTP/1.1 request would fail it.
    expect(JSON.parse(body!)).toMatchObject({ ca_pin: expect.any(String) });
  });

  it('a single-use token joins exactly once across both Auth Services (20 concurrent joins, half at each)', async () => {
    const token = (JSON.parse((await gwctlAt(authB, ['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
    const addresses = [authA.addresses.auth!, authB.addresses.auth!];
    const dialer = new Dialer({ env: {} });
    const cas = await fetchPinnedCas(addresses[0]!, pin, dialer);
    // Keys first, so that the 20 requests leave together.
    const keyPairs = Array.from({ length: 20 }, () => generateKeyPair());
    const results = await Promise.all(
      keyPairs.map((keys, i) => {
        const client = new ApiClient({ address: addresses[i % 2]!, dialer, ca: cas.host_ca, server: 'auth' });
        return client
          .call('POST', '/webapi/join', { token, roles: ['node'], nodename: `race-${i}`, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey })
          .then(() => 'joined', (err: { code?: string }) => err.code ?? 'error');
      }),
    );
    expect(results.filter((r) => r === 'joined')).toHaveLength(1);
    expect(results.filter((r) => r !== 'joined')).toEqual(Array(19).fill('GW_ERR_AUTH_TOKEN_USED'));
  }, 120_000);

  it('an app through the Proxy byte-exact; a lock on the other Auth closes it; kill -9 of the Auth in use keeps what is open and new connections work through the other', async () => {
    const bob = await appProxy('bob');
    const bobStream = await openStream(bob.port);
    const payload = pseudoRandomBytes(256 * 1024, 7);
    expect((await bobStream.echoes(payload)).equals(payload)).toBe(true);
    // The Proxy talks to auth-a (the first address): a lock created on auth-b reaches it through the shared Backend.
    expect((await gwctlAt(authB, ['lock', '--user', 'bob', '--name', 'split-bob'])).status).toBe(0);
    expect(await within(bobStream.closed, 30_000)).toBe(true);
    // The session's end, reported by the Proxy through the Auth API and recorded as that Proxy's (security.md, Session audit).
    await waitUntil('the Proxy-reported app.session.end of bob', async () => {
      const r = await gwctlAt(authB, ['get', 'events', '--format', 'json']);
      const events = (JSON.parse(r.stdout) as Array<{ spec: Record<string, unknown> }>).map((e) => e.spec);
      // The Proxy's own (an end-to-end stream's end is reported by the agent too, through the Proxy: `via`).
      const end = events.find((e) => e.event === 'app.session.end' && e.user === 'bob' && (e.reported_by as { proxy_id?: string } | undefined)?.proxy_id !== undefined);
      if (!end) return false;
      expect(end).toMatchObject({ resource: 'echo-tcp', reported_by: { proxy_id: proxy.hostId }, error: 'identity revoked: GW_ERR_ACCESS_LOCKED' });
      expect(end.bytes_in).toBeGreaterThanOrEqual(payload.length);
      expect(events.some((e) => e.event === 'app.session.start' && e.session === end.session)).toBe(true);
      return true;
    }, 30_000);

    const dave = await appProxy('dave');
    const daveStream = await openStream(dave.port);
    expect((await daveStream.echoes(payload)).equals(payload)).toBe(true);
    authA.process.kill('SIGKILL');
    await waitUntil('auth-a gone', () => authA.process.exitCode !== null || authA.process.signalCode !== null);
    // What is open stays open.
    const more = pseudoRandomBytes(64 * 1024, 8);
    expect((await daveStream.echoes(more)).equals(more)).toBe(true);
    // A new connection needs the Auth Service: it goes to auth-b.
    await waitUntil('a new stream through the Proxy after the failover', async () => {
      const s = await openStream(dave.port);
      try {
        return (await Promise.race([s.echoes(Buffer.from('again')), s.closed.then(() => Buffer.alloc(0))])).toString() === 'again';
      } finally {
        s.socket.destroy();
      }
    }, 60_000, 500);
    // The Proxy's event stream is now from auth-b (auth-a is gone): a lock there closes dave's open stream.
    expect(await proxy.waitForLog('event stream reconnected', 30_000)).toContain(authB.addresses.auth);
    expect((await gwctlAt(authB, ['lock', '--user', 'dave', '--name', 'split-dave'])).status).toBe(0);
    expect(await within(daveStream.closed, 30_000)).toBe(true);
  }, 180_000);


  it('a Proxy-only start without a joined identity, or without an Auth address, says what is missing', async () => {
    const proxyOnly = (authServer: string) => ['gateway:', '  data_dir: DATA_DIR', authServer, 'auth_service:', '  enabled: no', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n');
    const noToken = await startGatewayExpectingFailure(proxyOnly(`  auth_server: ${authB.addresses.auth}`), []);
    expect(noToken.status).toBe(1);
    expect(noToken.stderr).toContain('GW_ERR_AGENT_IDENTITY');
    expect(noToken.stderr).toContain('--type=proxy');
    const noAuth = await startGatewayExpectingFailure(proxyOnly(''), []);
    expect(noAuth.status).toBe(1);
    expect(noAuth.stderr).toContain('GW_ERR_CONFIG_VALUE');
    expect(noAuth.stderr).toContain('gateway.auth_server');
    // Hostile: a token of another type does not make a Proxy. At a third Auth Service on the same Backend: the
    // refused joins of the token race count against this address at the other two.
    const authC = await startGateway(authConfig('auth-c'), { args: ['--roles=auth'] });
    const nodeToken = (JSON.parse((await gwctlAt(authC, ['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
    const wrong = await startGatewayExpectingFailure(proxyOnly(`  auth_server: ${authC.addresses.auth}`), ['--token', nodeToken, '--ca-pin', pin]);
    await authC.stop();
    expect(wrong.status).toBe(1);
    expect(wrong.stderr).toContain('GW_ERR_AUTH_TOKEN_WRONG_TYPE');
  });

  // Last: it locks the Proxy.
  it("gwctl lock --node <the Proxy's host ID>: its event stream is cut, its record and the presence it wrote stop counting (issue 23)", async () => {
    const get = async (kind: string) => JSON.parse((await gwctlAt(authB, ['get', kind, '--format', 'json'])).stdout) as Array<{ metadata: { name: string }; spec: Record<string, unknown> }>;
    const proxyId = (await get('proxies')).find((p) => p.spec.hostname === 'proxy-1')!.metadata.name;
    // The presence this Proxy wrote for the agent passed the Auth Service's checks: the agent is online through it.
    const agentNode = () => get('nodes').then((nodes) => nodes.find((n) => n.spec.hostname === 'split-agent')!);
    expect((await agentNode()).spec).toMatchObject({ status: 'online', proxy: proxyId });
    // With the agent's signature of it: from its first one on, the Auth Services take its presence only so.
    expect(authA.logs() + authB.logs()).toContain('agent signs its presence');
    const lines = (text: string) => proxy.logs().split('\n').filter((l) => l.includes(text)).length;
    const ended = lines('Auth API event stream ended; reconnecting');
    const lock = await gwctlAt(authB, ['lock', '--node', proxyId, '--name', 'split-proxy']);
    expect(lock.status, lock.stderr).toBe(0);
    await waitUntil("the Proxy's event stream cut", () => lines('Auth API event stream ended; reconnecting') > ended, 30_000);
    await waitUntil('the Proxy out of the list', async () => !(await get('proxies')).some((p) => p.metadata.name === proxyId), 30_000, 500);
    expect((await agentNode()).spec.status).toBe('offline');
    // Its reconnects are refused while the lock lasts.
    expect(await proxy.waitForLog('status 403', 30_000)).toContain('Auth API event stream failed; reconnecting');
  }, 120_000);
});
