/**
 * A cluster behind a TLS-inspecting corporate proxy, end to end: squid-openssl with `ssl_bump bump all` and a
 * corporate CA the test makes, the only way from the agent and the user to the Proxy (squid alone resolves the
 * Proxy's name). Through it, `gwsh login`, an agent's join (`gateway start`'s error) and an agent's reverse
 * tunnel (its log) each fail with GW_ERR_TLS_INSPECTED naming the corporate CA, and `gateway dial-plan --probe`
 * says "inspected by" it. With the operator's fix, a second squid that splices TLS to the Proxy's name, the same
 * commands succeed and the tunnel comes up. (test/dial/inspect.test.ts proves the lab with curl first.)
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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
  const hosts = join(dir, 'hosts');
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
