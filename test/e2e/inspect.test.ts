/**
 * A cluster behind a TLS-inspecting corporate proxy, end to end: squid-openssl with `ssl_bump bump all` and a
 * corporate CA the test makes, the only way from the agent and the user to the Proxy (squid alone resolves the
 * Proxy's name). Through it, `gwsh login`, an agent's join (`gateway start`'s error) and an agent's reverse
 * tunnel (its log) each fail with GW_ERR_TLS_INSPECTED naming the corporate CA, and `gateway dial-plan --probe`
 * says "inspected by" it. With the operator's fix, a second squid that splices TLS to the Proxy's name, the same
 * commands succeed and the tunnel comes up. (test/dial/inspect.test.ts proves the lab with curl first.)
 *
 * The transport through inspection: a third squid bumps everything too, trusts the cluster's CA for what it
 * connects to and forwards WebSocket upgrades. With the corporate root given (GATEWAY_PROXY_CA_FILE), gwsh login,
 * gwctl, an agent's join and its reverse tunnel all work through it, inside the upgrade on the Proxy's web address;
 * 4 MiB each way flow byte-exact through `gwsh proxy app`; squid's log shows the bump (the GET of the upgrade
 * inside the CONNECT); `gateway dial-plan --probe` says the upgrade would be used.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ChildProcess } from 'node:child_process';
import { spawn } from 'node:child_process';
import { BULK_SERVER_SOURCE, expectedDownloadSha256, transfer } from '../helpers/bulk.js';
import { curl } from '../helpers/curl.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { runCli, startGateway, startGatewayExpectingFailure, type RunningGateway } from '../helpers/gateway.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

const PROXY_IP = '127.0.0.31';
const NAME = 'proxy.inspect.test';
const CORP_ROOT = 'CN=Corp Root CA, O=Example Corp';
const PASSWORD = 'correct horse battery';

let dir: string;
let dataDir: string;
let corp: TestPki;
let bump: Squid;
let splice: Squid;
/** Bumps everything, trusts the cluster CA upstream and forwards WebSocket upgrades. */
let upgrading: Squid;
let hostsFile: string;
const children: ChildProcess[] = [];
let cluster: RunningGateway | undefined;
let address: string;
let pin: string;

const clusterConfig = (webPort: number) =>
  [
    'gateway:',
    '  nodename: auth-1',
    `  data_dir: ${dataDir}`,
    '  log: { format: json }',
    'auth_service:',
    '  cluster_name: inspect.example',
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    `  web_listen_addr: ${PROXY_IP}:${webPort}`,
    `  public_addr: ["${NAME}:${webPort}"]`,
    '',
  ].join('\n');
const agentConfig = ['gateway:', '  nodename: node-inspected', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n');
const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const login = (proxy: Squid, home: string) =>
  runCli('gwsh', ['login', `--proxy=${address}`, '--user=alice', `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: join(dir, home), HTTPS_PROXY: proxy.url }, input: `${PASSWORD}\n` });
const addToken = async () => JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string; id: string };
const newToken = async () => (await addToken()).token;
const probe = (proxy: Squid, agentData: string) =>
  runCli('gateway', ['dial-plan', '--probe', '--data-dir', agentData, address], { env: { HTTPS_PROXY: proxy.url } });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-inspect-'));
  await chmod(dir, 0o755);
  dataDir = join(dir, 'cluster-data');
  corp = await makeTestPki(undefined, { subject: '/CN=Corp Root CA/O=Example Corp' });
  const webPort = await getPort({ host: PROXY_IP });
  address = `${NAME}:${webPort}`;
  const hosts = (hostsFile = join(dir, 'hosts'));
  await writeFile(hosts, `${PROXY_IP} ${NAME}\n`, { mode: 0o644 });
  const bumpCa = { caCert: corp.caCertPath, caKey: corp.caKeyPath };
  bump = await startSquid({ bump: bumpCa, extraConfig: [`hosts_file ${hosts}`, 'ssl_bump bump all'] });
  splice = await startSquid({ bump: bumpCa, extraConfig: [`hosts_file ${hosts}`, `acl gateway_proxy ssl::server_name ${NAME}`, 'ssl_bump splice gateway_proxy', 'ssl_bump bump all'] });
  cluster = await startGateway(clusterConfig(webPort));
  pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec((await admin(['status'])).stdout)![1]!;
  expect((await admin(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`)).status).toBe(0);
}, 120_000);

afterAll(async () => {
  await cluster?.stop();
  await bump?.stop();
  await splice?.stop();
  for (const c of children) c.kill('SIGKILL');
  await upgrading?.stop();
  await corp?.cleanup();
  await rm(dir, { recursive: true, force: true });
});

describe('behind the bumping squid', () => {
  it('gwsh login fails with GW_ERR_TLS_INSPECTED naming the corporate CA, and the hint gives the splice rule', async () => {
    const r = await login(bump, 'bumped');
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_TLS_INSPECTED');
    expect(r.stderr).toContain(`TLS to ${address} is inspected by ${CORP_ROOT}`);
    expect(r.stderr).toMatch(new RegExp(`^hint: .*ssl_bump splice gateway_proxy`, 'm'));
  });

  it("an agent's join fails the same way in gateway start's error, and its token is not spent", async () => {
    const { token, id } = await addToken();
    const r = await startGatewayExpectingFailure(agentConfig, ['--token', token, '--ca-pin', pin, '--proxy', address], { HTTPS_PROXY: bump.url });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_TLS_INSPECTED');
    expect(r.stderr).toContain(`inspected by ${CORP_ROOT}`);
    const tokens = JSON.parse((await admin(['tokens', 'ls', '--format', 'json'])).stdout) as Array<{ id: string; used: number }>;
    expect(tokens.find((t) => t.id === id)?.used).toBe(0);
  });
});

describe('with the splice exception for the Proxy name', () => {
  it('gwsh login succeeds; the profile it made, used by gwctl behind the bump, gets the same error', async () => {
    const r = await login(splice, 'spliced');
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const env = { HOME: dir, GWSH_HOME: join(dir, 'spliced') };
    expect((await runCli('gwctl', ['status'], { env: { ...env, HTTPS_PROXY: splice.url } })).status).toBe(0);
    const bumped = await runCli('gwctl', ['status'], { env: { ...env, HTTPS_PROXY: bump.url } });
    expect(bumped.status).toBe(1);
    expect(bumped.stderr).toContain('code: GW_ERR_TLS_INSPECTED');
    expect(bumped.stderr).toContain(`inspected by ${CORP_ROOT}`);
  });

  it("an agent joins and its tunnel comes up; moved behind the bump, its log names the inspection; dial-plan --probe tells the two paths apart", async () => {
    // Its own data directory, which outlives each run (stop() removes the run's temporary directory).
    const agentData = join(dir, 'agent-data');
    const agent = await startGateway(agentConfig, { dataDir: agentData, args: ['--token', await newToken(), '--ca-pin', pin, '--proxy', address], env: { HTTPS_PROXY: splice.url } });
    try {
      await agent.waitForLog('reverse tunnel ready', 30_000);
    } finally {
      await agent.stop();
    }
    const spliced = await probe(splice, agentData);
    expect(spliced.stdout).toContain(`probe: TLS to ${address} presented`);
    expect(spliced.stdout).toContain("issued by the cluster's host CA");
    expect(spliced.status).toBe(0);
    const bumped = await probe(bump, agentData);
    expect(bumped.stdout).toContain(`probe: not the cluster's host CA (from ${agentData} (host identity)): TLS to ${address} is inspected by ${CORP_ROOT}`);

    const again = await startGateway(agentConfig, { dataDir: agentData, env: { HTTPS_PROXY: bump.url } });
    try {
      const line = await again.waitForLog('GW_ERR_TLS_INSPECTED', 30_000);
      expect(line).toContain('cannot reach the Proxy');
      expect(line).toContain(`inspected by ${CORP_ROOT}`);
    } finally {
      await again.stop();
    }
  }, 90_000);
});

describe('the transport through inspection: the corporate root given, a bumping squid that forwards WebSockets', () => {
  const BULK_PORT_HOST = '127.0.0.32';
  let bulkPort: number;
  const corpEnv = () => ({ HTTPS_PROXY: upgrading.url, GATEWAY_PROXY_CA_FILE: corp.caCertPath });

  beforeAll(async () => {
    // squid verifies the Proxy it connects to: the cluster's host CA (as /webapi/ca gives it).
    const ca = await curl(['-k', `--resolve`, `${address}:${PROXY_IP}`, `https://${address}/webapi/ca`]);
    const upstreamCa = join(dir, 'cluster-host-ca.pem');
    await writeFile(upstreamCa, (JSON.parse(ca.stdout) as { host_ca: string }).host_ca, { mode: 0o644 });
    upgrading = await startSquid({
      bump: { caCert: corp.caCertPath, caKey: corp.caKeyPath, upstreamCa },
      extraConfig: [`hosts_file ${hostsFile}`, 'ssl_bump bump all', 'http_upgrade_request_protocols websocket allow all'],
    });
    bulkPort = await getPort({ host: BULK_PORT_HOST });
    const script = join(dir, 'bulk-server.mjs');
    await writeFile(script, BULK_SERVER_SOURCE);
    const bulk = spawn(process.execPath, [script, String(bulkPort), BULK_PORT_HOST], { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(bulk);
    await new Promise<void>((resolve) => bulk.stdout!.on('data', (c: Buffer) => c.toString().includes('listening') && resolve()));
  }, 60_000);

  it('gwsh login and gwctl work through the bump, and squid logged the upgrade inside the CONNECT', async () => {
    const home = join(dir, 'upgraded');
    const r = await runCli('gwsh', ['login', `--proxy=${address}`, '--user=alice', `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: home, ...corpEnv() }, input: `${PASSWORD}\n` });
    // Its only line on stderr says why it took the upgrade (once per process: the Dialer's log).
    expect(r.stderr.trim().split('\n')).toEqual([expect.stringContaining(`inspected by ${CORP_ROOT}, whose root the operator gave`)]);
    expect(r.status).toBe(0);
    const status = await runCli('gwctl', ['status'], { env: { HOME: dir, GWSH_HOME: home, ...corpEnv() } });
    expect(status.stderr).not.toContain('error:');
    expect(status.status).toBe(0);
    await upgrading.waitForAccessLog((l) => l.includes(`GET https://${address}/webapi/connectionupgrade`));
  });

  it('without the root, gwsh login fails with GW_ERR_TLS_INSPECTED whose hint names the root to give', async () => {
    const r = await runCli('gwsh', ['login', `--proxy=${address}`, '--user=alice', `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: join(dir, 'no-root'), HTTPS_PROXY: upgrading.url }, input: `${PASSWORD}\n` });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_TLS_INSPECTED');
    expect(r.stderr).toMatch(new RegExp(`^hint: Give the root certificate of ${CORP_ROOT} .*GATEWAY_PROXY_CA_FILE`, 'm'));
  });

  it('an agent joins and its tunnel comes up inside the upgrade; 4 MiB each way flow byte-exact through gwsh proxy app; dial-plan --probe says the upgrade would be used', async () => {
    const agentData = join(dir, 'agent-upgraded');
    const config = ['gateway:', '  nodename: node-upgraded', '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: bulk, uri: tcp://${BULK_PORT_HOST}:${bulkPort} }`, ''].join('\n');
    const appToken = JSON.parse((await admin(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string };
    const agent = await startGateway(config, { dataDir: agentData, args: ['--token', appToken.token, '--ca-pin', pin, '--proxy', address], env: corpEnv() });
    try {
      await agent.waitForLog('reverse tunnel ready', 45_000);
      expect(agent.logs()).toContain(`inspected by ${CORP_ROOT}, whose root the operator gave`);
      const home = join(dir, 'upgraded');
      const local = await startGwshProxy(['app', 'bulk', '--e2e', 'require'], { HOME: dir, GWSH_HOME: home, ...corpEnv() }, children);
      const r = await transfer('127.0.0.1', local.port, { id: 1, upload: 4 << 20, download: 4 << 20, seed: 11, timeoutMs: 60_000 });
      expect(r.server.received.sha256).toBe(r.sent.sha256);
      expect(r.received.sha256).toBe(expectedDownloadSha256(4 << 20, 11));
    } finally {
      await agent.stop();
    }
    const probed = await runCli('gateway', ['dial-plan', '--probe', '--data-dir', agentData, address], { env: corpEnv() });
    expect(probed.stdout).toContain(`probe: inspected by ${CORP_ROOT}, whose root the operator gave: the upgrade transport would be used`);
    const without = await runCli('gateway', ['dial-plan', '--probe', '--data-dir', agentData, address], { env: { HTTPS_PROXY: upgrading.url } });
    expect(without.stdout).toContain(`probe: give ${CORP_ROOT}'s root certificate in GATEWAY_PROXY_CA_FILE`);
  }, 150_000);
});
