/**
 * An agent behind a firewall whose only way out is a SOCKS5 proxy: Debian's Dante (danted) with username/password
 * authentication, with the real binaries.
 *
 * Topology (test/helpers/firewall.ts): the agent and its app in one network namespace, the Proxy in another, the
 * root namespace joining them without forwarding. danted runs in the root namespace on the agent's link and
 * connects out on the Proxy's; it alone knows the Proxy's name, proxy.gw.test (a hosts file of its own, see
 * test/helpers/dante.ts), so every dial below goes through it with socks5h://, including the user's: gwsh in the
 * root namespace cannot resolve that name either. curl goes first, the reference client.
 *
 * Covered: the agent joins with a token and the CA pin and opens its tunnel through danted; danted's log shows
 * both ends' sessions with the user; `gwsh login` works through it; 16 MiB each way byte-exact through
 * `gwsh proxy app`; after a restart of danted the agent's tunnel comes back through it by itself; an agent with a
 * wrong SOCKS password says so with GW_ERR_DIAL_SOCKS_AUTH_REFUSED.
 */
import type { ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startBulkServer, expectedDownloadSha256, transfer } from '../helpers/bulk.js';
import { runCleanup } from '../helpers/cleanup.js';
import { curl } from '../helpers/curl.js';
import { createSocksUser, startDante, type Dante, type DanteOptions, type SocksUser } from '../helpers/dante.js';
import { createFirewall, startGatewayIn, type Firewall, type NsGateway } from '../helpers/firewall.js';
import { BIN, runCli } from '../helpers/gateway.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { rootSuite } from '../helpers/root.js';
import { eventually } from '../helpers/wait.js';

const describeAsRoot = rootSuite(['netns', 'port443', 'users']);

const PROXY_NAME = 'proxy.gw.test';
const WEB_PORT = 443;
const BULK_PORT = 7000;
const PASSWORD = 'correct horse battery';
const MiB = 1024 * 1024;

let fw: Firewall;
let dir: string;
let dante: Dante;
let danteOptions: DanteOptions;
let appPort = 0;
let socksUser: SocksUser;
let proxy: NsGateway;
let agent: NsGateway | undefined;
let bulkServer: ChildProcess | undefined;
let pin: string;
let token: string;
let aliceEnv: Record<string, string>;
const children: ChildProcess[] = [];

const gwctl = (args: string[]) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir } });
const socksUrl = (password = socksUser.password) => dante.url('socks5h', { ...socksUser, password });

const agentConfig = (nodename: string) =>
  ['gateway:', `  nodename: ${nodename}`, '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: bulk, uri: tcp://127.0.0.1:${BULK_PORT} }`, ''].join('\n');

describeAsRoot('an agent behind a SOCKS5 proxy (Dante, username/password)', () => {
  beforeAll(async () => {
    fw = await createFirewall();
    dir = await mkdtemp(join(tmpdir(), 'gw-socks-e2e-'));
    await chmod(dir, 0o755);
    socksUser = createSocksUser();
    danteOptions = {
      internal: fw.agentGatewayIp,
      external: fw.proxyGatewayIp,
      auth: true,
      // the agent, and the root namespace's own address on that link (gwsh and curl, the user's side)
      clients: [`${fw.agentIp}/32`, `${fw.agentGatewayIp}/32`],
      hosts: `${fw.proxyIp} ${PROXY_NAME}`,
    };
    dante = await startDante(danteOptions);
    const proxyConfig = [
      'gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }',
      'auth_service:', '  cluster_name: socks.example', `  listen_addr: ${fw.proxyIp}:3025`, '  keep_alive_interval: 1s', '  keep_alive_count_max: 3',
      'proxy_service:', `  web_listen_addr: ${fw.proxyIp}:${WEB_PORT}`, `  public_addr: ${PROXY_NAME}:${WEB_PORT}`, '',
    ].join('\n');
    proxy = await startGatewayIn(fw, fw.proxyNs, proxyConfig, { name: 'proxy' });
    bulkServer = await startBulkServer(dir, BULK_PORT, (command, args) => fw.spawnIn(fw.agentNs, command, args));
    const status = await gwctl(['status']);
    expect(status.stderr).toBe('');
    pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;
    expect((await runCli('gwctl', ['--data-dir', proxy.dataDir, 'users', 'add', 'alice', '--roles=access'], { env: { HOME: dir }, input: `${PASSWORD}\n` })).status).toBe(0);
    const tokens = await gwctl(['tokens', 'add', '--type=app', '--ttl=10m', '--format', 'json']);
    token = (JSON.parse(tokens.stdout) as { token: string }).token;
    aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh'), HTTPS_PROXY: socksUrl() };
  }, 120_000);

  afterAll(async () => {
    await runCleanup([
      () => children.forEach((c) => c.kill('SIGTERM')),
      () => agent?.stop(true),
      () => proxy?.stop(true),
      () => bulkServer?.kill('SIGKILL'),
      () => dante?.stop(),
      () => socksUser?.remove(),
      () => fw?.close(),
      () => dir && rm(dir, { recursive: true, force: true }),
    ]);
  }, 60_000);

  it('the lab: the agent cannot reach the Proxy itself; curl reaches it through danted by name', async () => {
    expect((await fw.tcpConnectFrom(fw.agentNs, fw.proxyIp, WEB_PORT)).ok).toBe(false);
    const r = await fw.runIn(fw.agentNs, 'curl', ['-sS', '--max-time', '20', '-k', '-o', '/dev/null', '-w', '%{http_code}', '--proxy', socksUrl(), `https://${PROXY_NAME}/webapi/ping`], { timeoutMs: 30_000 });
    expect(r.stdout).toMatch(/^[2-4]\d\d$/);
    await dante.waitForLog((l) => l.includes('tcp/connect [') && l.includes(`username%${socksUser.user}@${fw.agentIp}.`) && l.includes(`${fw.proxyIp}.${WEB_PORT}`));
  });

  it('the agent joins and opens its tunnel through danted; its log shows the user', async () => {
    const before = (await dante.readLog()).length;
    agent = await startGatewayIn(fw, fw.agentNs, agentConfig('agent-1'), {
      name: 'agent',
      args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${WEB_PORT}`],
      env: { HTTPS_PROXY: socksUrl() },
    });
    await agent.waitForLog('reverse tunnel ready', 30_000);
    const lines = (await dante.readLog()).slice(before);
    expect(lines.some((l) => l.includes('tcp/connect [') && l.includes(`username%${socksUser.user}@${fw.agentIp}.`) && l.includes(`${fw.proxyIp}.${WEB_PORT}`))).toBe(true);
  });

  it('gwsh login works through danted (gwsh cannot even resolve the Proxy name itself)', async () => {
    const login = await runCli('gwsh', ['login', `--proxy=${PROXY_NAME}:${WEB_PORT}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
    expect(login.stderr).toBe('');
    expect(login.status).toBe(0);
    await dante.waitForLog((l) => l.includes('tcp/connect [') && l.includes(`username%${socksUser.user}@${fw.agentGatewayIp}.`));
  });

  it('16 MiB each way byte-exact through gwsh proxy app, both ends through danted', async () => {
    const app = await startGwshProxy(['app', 'bulk', '--e2e', 'require'], aliceEnv, children);
    appPort = app.port;
    const r = await transfer('127.0.0.1', app.port, { id: 1, upload: 16 * MiB, download: 16 * MiB, seed: 5, timeoutMs: 120_000 });
    expect(r.server.received).toEqual(r.sent);
    expect(r.received.bytes).toBe(16 * MiB);
    expect(r.received.sha256).toBe(expectedDownloadSha256(16 * MiB, 5));
  }, 180_000);

  it('danted restarts: the agent reconnects through it by itself, and the app works again', async () => {
    const since = Date.now();
    await dante.stop();
    dante = await startDante(danteOptions);
    await eventually('the agent is online on a tunnel opened after the restart', async () => {
      const r = await gwctl(['get', 'nodes', '--format', 'json']);
      const nodes = JSON.parse(r.stdout) as Array<{ spec: { hostname: string; status: string; connected_since?: string } }>;
      const node = nodes.find((n) => n.spec.hostname === 'agent-1');
      if (node?.spec.status !== 'online' || Date.parse(node.spec.connected_since ?? '') < since) throw new Error(r.stdout);
    }, 60_000);
    await dante.waitForLog((l) => l.includes('tcp/connect [') && l.includes(`username%${socksUser.user}@${fw.agentIp}.`));
    await eventually('the app works again', async () => {
      const r = await transfer('127.0.0.1', appPort, { id: 2, upload: 64 * 1024, download: 64 * 1024, seed: 6, timeoutMs: 15_000 });
      if (r.server.received.sha256 !== r.sent.sha256 || r.received.sha256 !== expectedDownloadSha256(64 * 1024, 6)) throw new Error('not byte-exact');
    });
  }, 120_000);

  it('an agent with a wrong SOCKS password stops with GW_ERR_DIAL_SOCKS_AUTH_REFUSED, the password nowhere in its output', async () => {
    const d = await mkdtemp(join(dir, 'agent-wrong-'));
    await writeFile(join(d, 'gateway.yaml'), agentConfig('agent-wrong').replaceAll('DATA_DIR', join(d, 'data')));
    const wrong = `${socksUser.password}-wrong`;
    const r = await fw.runIn(fw.agentNs, process.execPath, [BIN('gateway'), 'start', '-c', join(d, 'gateway.yaml'), '--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${WEB_PORT}`], {
      env: { HTTPS_PROXY: socksUrl(wrong) },
      timeoutMs: 60_000,
    });
    const output = r.stdout + r.stderr;
    expect(output).toContain("GW_ERR_DIAL_SOCKS_AUTH_REFUSED");
    expect(output).not.toContain(wrong);
    expect(output).not.toContain(encodeURIComponent(wrong));
  }, 90_000);
});
