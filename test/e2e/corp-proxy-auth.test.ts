/**
 * Agents and users behind a proxy that asks for Kerberos (Negotiate) or NTLM, with the real binaries and the labs
 * of test/helpers/kerberos.ts (Debian's MIT KDC, squid's negotiate_kerberos_auth) and test/helpers/ntlm.ts (squid
 * with Samba's ntlm_auth and winbindd over a local account database), both proven with curl in test/dial/lab-*.
 *
 * Topology (test/helpers/firewall.ts, as in socks.test.ts): the agent and its app in one network namespace, the
 * Proxy in another, the root namespace joining them without forwarding. Each lab's squid listens in the root
 * namespace on the agent's link and alone knows the Proxy's name, gateway.gw.test (its hosts_file). The Kerberos
 * proxy must be reached by its name (the service principal is HTTP/proxy.gw.test), which no resolver knows: the
 * agent, gwsh and gateway-upgrade run under `unshare --mount` with a hosts file bound over /etc/hosts that names
 * it (their own mount namespace; the machine's /etc/hosts is never touched). The NTLM proxy is reached by address.
 *
 * Covered, in each lab: the agent joins with a token and opens its tunnel through the proxy, and squid's access log
 * shows the principal (a service account from a keytab, KRB5_CLIENT_KTNAME, as a systemd unit would have; or
 * GWLAB\user); `gwsh login` (alice's own ticket, or the NTLM account) and 4 MiB each way byte-exact through
 * `gwsh proxy app`; `gateway-upgrade dry-run` asks the Proxy's version server through the same proxy. Hostile, at
 * the process level: an agent without a ticket, and an agent with a wrong NTLM password, each stop with their code
 * and no secret in their output. The finer hostile cases (an expired ticket, a ticket from another KDC, a service
 * principal the proxy has no key for, a 407 loop, a lying challenge) are the Dialer's tests: test/dial/lab-*.test.ts
 * and test/dial/proxyauth.test.ts, seconds instead of an agent start each.
 */
import type { ChildProcess } from 'node:child_process';
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startBulkServer, expectedDownloadSha256, transfer } from '../helpers/bulk.js';
import { runCleanup } from '../helpers/cleanup.js';
import { createFirewall, startGatewayIn, type Firewall, type NsGateway } from '../helpers/firewall.js';
import { BIN, runCli } from '../helpers/gateway.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { startKerberosLab, type KerberosLab } from '../helpers/kerberos.js';
import { startNtlmLab, type NtlmLab } from '../helpers/ntlm.js';
import { rootSuite } from '../helpers/root.js';
import { parseAccessLogLine, type Squid } from '../helpers/squid.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';

const describeAsRoot = rootSuite(['netns', 'port443', 'users', 'mountns']);

const GW_NAME = 'gateway.gw.test';
const WEB_PORT = 443;
const BULK_PORT = 7000;
const PASSWORD = 'correct horse battery';
const MiB = 1024 * 1024;
const HOUR = 3_600_000;

let fw: Firewall;
let dir: string;
let proxy: NsGateway;
let bulkServer: ChildProcess | undefined;
let pin: string;
const agents: NsGateway[] = [];
const children: ChildProcess[] = [];

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
const newToken = async () => (JSON.parse((await gwctl(['tokens', 'add', '--type=app', '--ttl=10m', '--format', 'json'])).stdout) as { token: string }).token;

const agentConfig = (nodename: string) =>
  ['gateway:', `  nodename: ${nodename}`, '  data_dir: DATA_DIR', '  log: { format: json, severity: debug }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: bulk, uri: tcp://127.0.0.1:${BULK_PORT} }`, ''].join('\n');

/** Runs the rest of the command line with `hosts` bound over /etc/hosts, in a mount namespace of its own. */
const withHosts = (hosts: string) => ['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', 'mount --bind "$0" /etc/hosts && exec "$@"', hosts];

beforeAll(async () => {
  fw = await createFirewall();
  dir = await mkdtemp(join(tmpdir(), 'gw-corpauth-e2e-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'squid-hosts'), `${fw.proxyIp} ${GW_NAME}\n`, { mode: 0o644 });
  const proxyConfig = [
    'gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }',
    'auth_service:', '  cluster_name: corpauth.example', `  listen_addr: ${fw.proxyIp}:3025`,
    'proxy_service:', `  web_listen_addr: ${fw.proxyIp}:${WEB_PORT}`, `  public_addr: ${GW_NAME}:${WEB_PORT}`,
    '  automatic_upgrades_channels:', '    stable/v17: { static_version: v17.0.2 }', '',
  ].join('\n');
  proxy = await startGatewayIn(fw, fw.proxyNs, proxyConfig, { name: 'proxy' });
  bulkServer = await startBulkServer(dir, BULK_PORT, (command, args) => fw.spawnIn(fw.agentNs, command, args));
  const status = await gwctl(['status']);
  expect(status.stderr).toBe('');
  pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;
  expect((await gwctl(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`)).status).toBe(0);
}, 120_000);

afterAll(async () => {
  await runCleanup([
    () => children.forEach((c) => c.kill('SIGTERM')),
    ...agents.map((a) => () => a.stop(true)),
    () => proxy?.stop(true),
    () => bulkServer?.kill('SIGKILL'),
    () => fw?.close(),
    () => dir && rm(dir, { recursive: true, force: true }),
  ]);
}, 60_000);

/** What both labs check once the agent is up: gwsh login, a byte-exact stream, gateway-upgrade's question. */
function userSideThroughTheProxy(o: { name: string; squid: () => Squid; env: () => Record<string, string>; wrap?: () => string[]; user: () => string }) {
  const wrap = () => (o.wrap ? { wrap: o.wrap() } : {});
  /** A CONNECT to the Proxy from the user's side (the root namespace's address on the agent link), authenticated as the user. */
  const isUserConnect = (l: string) => {
    const e = parseAccessLogLine(l);
    return e.client === fw.agentGatewayIp && e.url === `${GW_NAME}:${WEB_PORT}` && e.status === 200 && e.user?.toLowerCase() === o.user().toLowerCase();
  };
  const gwshEnv = () => ({ HOME: dir, GWSH_HOME: join(dir, `gwsh-${o.name}`), ...o.env() });

  it(`gwsh login works through the ${o.name} proxy (gwsh cannot resolve the Proxy's name itself); squid logs the user`, async () => {
    const login = await runCli('gwsh', ['login', `--proxy=${GW_NAME}:${WEB_PORT}`, '--user=alice', `--ca-pin=${pin}`], { env: gwshEnv(), input: `${PASSWORD}\n`, ...wrap() });
    expect(login.stderr).toBe('');
    expect(login.status).toBe(0);
    await o.squid().waitForAccessLog(isUserConnect);
  });

  it('4 MiB each way byte-exact through gwsh proxy app, both ends through the proxy', async () => {
    const app = await startGwshProxy(['app', 'bulk', '--e2e', 'require'], gwshEnv(), children, wrap());
    const r = await transfer('127.0.0.1', app.port, { id: 1, upload: 4 * MiB, download: 4 * MiB, seed: 7, timeoutMs: 60_000 });
    expect(r.server.received).toEqual(r.sent);
    expect(r.received.bytes).toBe(4 * MiB);
    expect(r.received.sha256).toBe(expectedDownloadSha256(4 * MiB, 7));
    app.child.kill('SIGTERM');
  }, 90_000);

  it("gateway-upgrade dry-run asks the Proxy's version server through the same proxy", async () => {
    const root = join(dir, `upgrade-${o.name}`);
    await mkdir(join(root, 'etc/gateway-upgrade.d'), { recursive: true });
    await writeFile(join(root, 'etc/gateway-upgrade.d/endpoint'), `${GW_NAME}:${WEB_PORT}/v1/webapi/automaticupgrades/channel/stable/v17\n`);
    const fake = join(dir, `gateway-17.0.1-${o.name}`);
    await writeFile(fake, '#!/bin/sh\necho "Gateway v17.0.1 git:test"\n', { mode: 0o755 });
    const env = {
      GATEWAY_UPGRADE_ROOT: root,
      GATEWAY_UPGRADE_CA_FILE: join(proxy.dataDir, 'admin', 'host-ca.pem'),
      GATEWAY_UPGRADE_VERSION_COMMAND: `${fake} --version`,
      GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball',
      GATEWAY_UPGRADE_ARCH: 'x64',
      ...o.env(),
    };
    await writeSchedule(join(root, 'etc/gateway-upgrade.d'), [{ start: new Date(Date.now() + HOUR), stop: new Date(Date.now() + 2 * HOUR) }]);
    const byUser = async () => (await o.squid().readAccessLog()).filter((l) => isUserConnect(l)).length;
    const before = await byUser();
    const r = await runCli('gateway-upgrade', ['dry-run'], { env, ...wrap() });
    expect(r.stderr).toBe('');
    expect(r.stdout.split('\n')[0]).toBe('an upgrade is available (17.0.1 -> 17.0.2)');
    expect(await byUser()).toBeGreaterThan(before);
  });
}

describeAsRoot('behind a Kerberos proxy (MIT KDC, squid negotiate_kerberos_auth)', () => {
  let lab: KerberosLab;
  let clientHosts: string;
  let keytab: string;
  const agentEnv = (extra: Record<string, string> = {}) => ({
    HTTPS_PROXY: lab.proxyUrl,
    KRB5_CONFIG: lab.env.KRB5_CONFIG!,
    KRB5_CLIENT_KTNAME: keytab,
    KRB5CCNAME: `FILE:${join(dir, 'agent-ccache')}`,
    ...extra,
  });

  beforeAll(async () => {
    lab = await startKerberosLab({
      host: fw.agentGatewayIp,
      clients: [`${fw.agentIp}/32`, `${fw.agentGatewayIp}/32`],
      squidConfig: [`hosts_file ${join(dir, 'squid-hosts')}`],
    });
    clientHosts = join(dir, 'client-hosts');
    await writeFile(clientHosts, `127.0.0.1 localhost\n::1 localhost\n${lab.squid.host} ${lab.proxyHost}\n`, { mode: 0o644 });
    // The agent's own principal, its key in a keytab: libkrb5 gets (and renews) its tickets by itself.
    await lab.kadmin('addprinc -randkey gw-agent');
    keytab = join(dir, 'gw-agent.keytab');
    await lab.kadmin(`ktadd -k ${keytab} gw-agent`);
  }, 60_000);
  afterAll(() => lab?.stop());

  it('curl, the reference client, reaches the Proxy through the lab from the agent namespace', async () => {
    expect((await fw.tcpConnectFrom(fw.agentNs, fw.proxyIp, WEB_PORT, 3000)).ok).toBe(false);
    const args = ['-sS', '--max-time', '20', '-k', '-o', '/dev/null', '-w', '%{http_code}', '-p', '-x', lab.proxyUrl, '--resolve', `${lab.proxyHost}:${lab.squid.port}:${lab.squid.host}`, '--proxy-negotiate', '-U', ':', `https://${GW_NAME}/webapi/ping`];
    const r = await fw.runIn(fw.agentNs, 'curl', args, { env: lab.env, timeoutMs: 30_000 });
    expect(r.stdout).toMatch(/^[2-4]\d\d$/);
  });

  it("the agent joins with a keytab (KRB5_CLIENT_KTNAME) and opens its tunnel; squid logs gw-agent@GW.TEST", async () => {
    const agent = await startGatewayIn(fw, fw.agentNs, agentConfig('agent-krb'), {
      name: 'agent-krb',
      args: ['--token', await newToken(), '--ca-pin', pin, '--proxy', `${GW_NAME}:${WEB_PORT}`],
      env: agentEnv(),
      wrap: withHosts(clientHosts),
    });
    agents.push(agent);
    await agent.waitForLog('reverse tunnel ready', 30_000);
    const line = await lab.squid.waitForAccessLog((l) => l.includes(` CONNECT ${GW_NAME}:${WEB_PORT} `) && l.includes(' 200 gw-agent@'));
    expect(parseAccessLogLine(line)).toMatchObject({ client: fw.agentIp, user: `gw-agent@${lab.realm}` });
    expect(agent.logs()).not.toMatch(/Proxy-Authorization|Negotiate YII/);
  }, 60_000);

  userSideThroughTheProxy({ name: 'kerberos', squid: () => lab.squid, env: () => ({ HTTPS_PROXY: lab.proxyUrl, ...lab.env }), wrap: () => withHosts(clientHosts), user: () => lab.user.principal });

  it('an agent with no Kerberos credentials stops with GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED and the fix', async () => {
    const d = await mkdtemp(join(dir, 'agent-noticket-'));
    await writeFile(join(d, 'gateway.yaml'), agentConfig('agent-noticket').replaceAll('DATA_DIR', join(d, 'data')));
    const env = agentEnv({ KRB5CCNAME: `FILE:${join(d, 'no-cache')}` });
    delete (env as Record<string, string | undefined>).KRB5_CLIENT_KTNAME;
    const [cmd, ...args] = [...withHosts(clientHosts), process.execPath, BIN('gateway'), 'start', '-c', join(d, 'gateway.yaml'), '--token', await newToken(), '--ca-pin', pin, '--proxy', `${GW_NAME}:${WEB_PORT}`];
    const r = await fw.runIn(fw.agentNs, cmd!, args, { env, timeoutMs: 60_000 });
    expect(r.stdout + r.stderr).toContain('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    expect(r.stdout + r.stderr).toContain('kinit');
  }, 90_000);
});

describeAsRoot('behind an NTLM proxy (squid, Samba ntlm_auth and winbindd)', () => {
  let lab: NtlmLab;
  const proxyUrl = (password = lab.user.password) => `http://${encodeURIComponent(lab.account)}:${encodeURIComponent(password)}@${lab.squid.host}:${lab.squid.port}`;

  beforeAll(async () => {
    lab = await startNtlmLab({ host: fw.agentGatewayIp, clients: [`${fw.agentIp}/32`, `${fw.agentGatewayIp}/32`], squidConfig: [`hosts_file ${join(dir, 'squid-hosts')}`] });
  }, 60_000);
  afterAll(() => lab?.stop());

  it('the agent joins with DOMAIN%5Cuser:password in HTTPS_PROXY and opens its tunnel; squid logs GWLAB\\user', async () => {
    const agent = await startGatewayIn(fw, fw.agentNs, agentConfig('agent-ntlm'), {
      name: 'agent-ntlm',
      args: ['--token', await newToken(), '--ca-pin', pin, '--proxy', `${GW_NAME}:${WEB_PORT}`],
      env: { HTTPS_PROXY: proxyUrl() },
    });
    agents.push(agent);
    await agent.waitForLog('reverse tunnel ready', 30_000);
    const line = await lab.squid.waitForAccessLog((l) => l.includes(` CONNECT ${GW_NAME}:${WEB_PORT} `) && l.includes(' 200 ') && l.includes(fw.agentIp));
    expect(parseAccessLogLine(line).user?.toLowerCase()).toBe(lab.account.toLowerCase());
    expect(agent.logs()).not.toContain(lab.user.password);
    expect(agent.logs()).not.toMatch(/Proxy-Authorization|TlRMTVNT/);
  }, 60_000);

  userSideThroughTheProxy({ name: 'ntlm', squid: () => lab.squid, env: () => ({ HTTPS_PROXY: proxyUrl() }), user: () => lab.account });

  it('an agent with a wrong NTLM password stops with GW_ERR_DIAL_PROXY_AUTH_REFUSED, the password nowhere in its output', async () => {
    const d = await mkdtemp(join(dir, 'agent-wrong-'));
    await writeFile(join(d, 'gateway.yaml'), agentConfig('agent-wrong').replaceAll('DATA_DIR', join(d, 'data')));
    const wrong = `${lab.user.password}-wrong`;
    const r = await fw.runIn(fw.agentNs, process.execPath, [BIN('gateway'), 'start', '-c', join(d, 'gateway.yaml'), '--token', await newToken(), '--ca-pin', pin, '--proxy', `${GW_NAME}:${WEB_PORT}`], {
      env: { HTTPS_PROXY: proxyUrl(wrong) },
      timeoutMs: 60_000,
    });
    const output = r.stdout + r.stderr;
    expect(output).toContain('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(output).toContain('DOMAIN%5Cuser');
    expect(output).not.toContain(wrong);
    expect(output).not.toContain(encodeURIComponent(wrong));
  }, 90_000);
});
