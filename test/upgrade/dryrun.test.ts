/**
 * gateway-upgrade dry-run (the built CLI) against the gateway's own version server: the real daemon with static,
 * forwarded and default channels, reached through a real squid (HTTPS_PROXY; the Proxy's name exists only in
 * squid's hosts file) or directly (NO_PROXY). Also: the exact messages of the seed, the endpoint file refusals,
 * the schedule warning, and a cluster too old for automatic upgrades (an in-process version server and ping
 * behind https with a test CA).
 */
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startHttpServer, startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { writeScript } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'proxy.gw.test';
/** Another name of the Proxy's address, known to squid but not in the Proxy's certificate. */
const OTHER_NAME = 'other.gw.test';
const HOUR = 3_600_000;

let dir: string;
let squid: Squid;
let gw: RunningGateway;
let upstream: HttpTestServer;
let port: number;
let root: string;
let etc: string;
let baseEnv: Record<string, string>;
let pki: TestPki;
let oldCluster: HttpTestServer;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-dryrun-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME} ${OTHER_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  upstream = await startHttpServer((req, res) => {
    // /none answers as upstream's version server does for a channel with no target (its constants.NoVersion).
    const answers: Record<string, string> = { '/rc/version': 'v17.1.0-rc.1', '/rc/critical': 'yes', '/none/version': 'none', '/none/critical': 'false' };
    const body = answers[req.url ?? ''];
    res.writeHead(body ? 200 : 404, { 'content-type': 'text/plain' });
    res.end(body ?? 'no');
  });
  port = await getPort({ host: PROXY_IP });
  gw = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      'auth_service:',
      '  cluster_name: dryrun.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${port}`,
      `  public_addr: ${PROXY_NAME}:${port}`,
      '  automatic_upgrades_channels:',
      '    stable/v17: { static_version: v17.0.2 }',
      '    pinned: { static_version: v17.0.1 }',
      `    rc: { forward_url: "${upstream.url}/rc" }`,
      `    none: { forward_url: "${upstream.url}/none" }`,
      '',
    ].join('\n'),
  );
  root = join(dir, 'root');
  etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(etc, { recursive: true });
  const fake = await writeScript(join(dir, 'gateway-17.0.1'), 'echo "Gateway v17.0.1 git:test"');
  baseEnv = {
    GATEWAY_UPGRADE_ROOT: root,
    GATEWAY_UPGRADE_CA_FILE: join(gw.dataDir, 'admin', 'host-ca.pem'),
    GATEWAY_UPGRADE_VERSION_COMMAND: `${fake} --version`,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball',
    GATEWAY_UPGRADE_ARCH: 'x64',
  };

  // A cluster that is too old: ping says 15.1.2; its version server says 15.1.3.
  pki = await makeTestPki();
  const cert = await pki.serverCert({ names: ['old.gw.test'], ips: ['127.0.0.1'] });
  const vs = new VersionServer({ ownVersion: '15.1.3', channels: {}, dialer: new Dialer({ env: {} }) });
  oldCluster = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    if (vs.handle(req, res)) return;
    if (req.url === '/webapi/ping') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ cluster_name: 'old', server_version: '15.1.2' }));
      return;
    }
    res.writeHead(404);
    res.end();
  });
}, 120_000);

afterAll(async () => {
  await gw?.stop();
  await squid?.stop();
  await upstream?.close();
  await oldCluster?.close();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function endpoint(value: string): Promise<void> {
  await writeFile(join(etc, 'endpoint'), `${value}\n`);
}
const viaName = (channel: string) => `${PROXY_NAME}:${port}/v1/webapi/automaticupgrades/channel/${channel}`;
const viaIp = (channel: string) => `${PROXY_IP}:${port}/v1/webapi/automaticupgrades/channel/${channel}`;
const throughSquid = { HTTPS_PROXY: '' };
const dryRun = (extra: Record<string, string> = {}) => runCli('gateway-upgrade', ['dry-run'], { env: { ...baseEnv, ...extra } });

describe('gateway-upgrade dry-run against the real version server', () => {
  beforeAll(() => {
    throughSquid.HTTPS_PROXY = squid.url;
  });

  it('static channel, through squid (HTTPS_PROXY): "an upgrade is available (<current> -> <target>)", the window and the next one', async () => {
    await endpoint(viaName('stable/v17'));
    const next = { start: new Date(Date.now() + 5 * HOUR), stop: new Date(Date.now() + 6 * HOUR) };
    await writeSchedule(etc, [next]);
    const r = await dryRun(throughSquid);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const lines = r.stdout.split('\n');
    expect(lines[0]).toBe('an upgrade is available (17.0.1 -> 17.0.2)');
    expect(lines[1]).toBe(`channel: stable/v17 at ${PROXY_NAME}:${port} (critical: no)`);
    // The Proxy that answered names itself (its host ID, <data_dir>/proxy_id): what tells Proxies apart behind a load balancer.
    expect(lines[2]).toBe(`answered by: Proxy ${(await readFile(join(gw.dataDir, 'proxy_id'), 'utf8')).trim()}`);
    expect(lines[3]).toContain(`maintenance window: not inside one now; the next starts at ${next.start.toISOString().replace(/\.\d+Z$/, 'Z')} (in 4h 5`);
    expect(lines[3]).toMatch(/\(in 4h 5\dm\)$/);
    expect(lines[4]).toBe('install: tarball https://cdn.gateway.example/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz');
    const connects = (await squid.readAccessLog()).filter((l) => l.includes(`CONNECT ${PROXY_NAME}:${port}`));
    expect(connects.length).toBeGreaterThanOrEqual(2); // /version, /critical, /webapi/ping
  });

  it('equal versions: exactly "no upgrades available (<current> == <target>)"; inside a window', async () => {
    await endpoint(viaName('pinned'));
    const open = { start: new Date(Date.now() - 10 * 60_000), stop: new Date(Date.now() + 50 * 60_000) };
    await writeSchedule(etc, [open]);
    const r = await dryRun(throughSquid);
    expect(r.status).toBe(0);
    expect(r.stdout.split('\n')[0]).toBe('no upgrades available (17.0.1 == 17.0.1)');
    expect(r.stdout).toContain(`maintenance window: inside one now, until ${open.stop.toISOString().replace(/\.\d+Z$/, 'Z')}`);
  });

  it('forwarded channel with a pre-release and a critical flag, directly (NO_PROXY names the Proxy)', async () => {
    await endpoint(viaIp('rc'));
    const before = (await squid.readAccessLog()).length;
    const r = await dryRun({ ...throughSquid, NO_PROXY: `${PROXY_IP}:${port}` });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout.split('\n')[0]).toBe('an upgrade is available (17.0.1 -> 17.1.0-rc.1)');
    expect(r.stdout).toContain(`channel: rc at ${PROXY_IP}:${port} (critical: yes)`);
    const after = await squid.readAccessLog();
    expect(after.slice(before).filter((l) => l.includes(PROXY_IP))).toEqual([]);
  });

  it('default channel: the Proxy\'s own version, compared with the real gateway binary', async () => {
    await endpoint(viaIp('default'));
    const r = await dryRun({ GATEWAY_UPGRADE_VERSION_COMMAND: `${process.execPath} ${BIN('gateway')} --version` });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout.split('\n')[0]).toBe('no upgrades available (17.0.0-dev == 17.0.0-dev)');
  });

  it('a FIPS install (the version output says so) targets gateway-ent-fips and the -fips tarball', async () => {
    await endpoint(viaIp('stable/v17'));
    const fips = await writeScript(join(dir, 'gateway-fips'), 'echo "Gateway v17.0.1 git:test FIPS"');
    const tar = await dryRun({ GATEWAY_UPGRADE_VERSION_COMMAND: fips });
    expect(tar.stdout).toContain('install: tarball https://cdn.gateway.example/gateway-ent-v17.0.2-linux-amd64-fips-bin.tar.gz');
    const apt = await dryRun({ GATEWAY_UPGRADE_VERSION_COMMAND: fips, GATEWAY_UPGRADE_PACKAGE_MANAGER: 'yum' });
    expect(apt.stdout).toContain('install: yum gateway-ent-fips-17.0.2');
    expect(apt.stderr).toContain(`warning: the package repository is not registered: ${join(root, 'etc/yum.repos.d/gateway.repo')} does not exist`);
  });

  it('a missing or stale schedule gives the invalid-schedule warning (expected right after install)', async () => {
    await endpoint(viaIp('stable/v17'));
    await rm(join(etc, 'schedule'), { force: true });
    const r = await dryRun();
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('maintenance window: unknown (no valid schedule)');
    expect(r.stderr).toBe(
      `warning: invalid upgrade schedule: ${join(etc, 'schedule')} does not exist. This is expected right after install, until the agent has exported the cluster's maintenance schedule; until then only critical upgrades run\n`,
    );
    await writeSchedule(etc, [{ start: new Date(Date.now() - 3 * HOUR), stop: new Date(Date.now() - 2 * HOUR) }]);
    const stale = await dryRun();
    expect(stale.stderr).toMatch(/^warning: invalid upgrade schedule: .*schedule is stale: its last window ended at .*Z\. This is expected right after install/);
  });

  it('"none" from the channel (upstream\'s "no version"): run and dry-run do nothing, say so and exit 0, as upstream\'s clients do', async () => {
    await endpoint(viaIp('none'));
    const url = `https://${viaIp('none')}/version`;
    const run = await runCli('gateway-upgrade', ['run'], { env: baseEnv });
    expect(run.stderr).toBe('');
    expect(run.status).toBe(0);
    expect(run.stdout).toMatch(new RegExp(`^no upgrades available: the version server ${url.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} advertises no version \\("none"\\) \\(Proxy [^)]+\\); nothing to do until it names one \\(17\\.0\\.1 stays installed\\)\\n$`));
    const dry = await runCli('gateway-upgrade', ['dry-run', '-f', 'json'], { env: baseEnv });
    expect(dry.status).toBe(0);
    expect(JSON.parse(dry.stdout)).toMatchObject({ installed_version: '17.0.1', target_version: null, upgrade_available: false, channel: 'none', install: null });
  });

  it('an unknown channel names it and says which exist', async () => {
    await endpoint(viaIp('nope'));
    const r = await dryRun();
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`error: the version server https://${viaIp('nope')}/version answered HTTP 404: no channel "nope" on this proxy`);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_VERSION_SERVER');
  });

  it("a Proxy certificate no trusted CA signed: GW_ERR_CLIENT_UNTRUSTED, and the hint's GATEWAY_UPGRADE_CA_FILE fixes it", async () => {
    await endpoint(viaIp('stable/v17'));
    const { GATEWAY_UPGRADE_CA_FILE: caFile, ...withoutCa } = baseEnv;
    const r = await runCli('gateway-upgrade', ['dry-run'], { env: withoutCa });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_CLIENT_UNTRUSTED');
    expect(r.stderr).toMatch(/^hint: Give the CA that signs the Proxy's certificate with GATEWAY_UPGRADE_CA_FILE/m);
    const fixed = await runCli('gateway-upgrade', ['dry-run'], { env: { ...withoutCa, GATEWAY_UPGRADE_CA_FILE: caFile! } });
    expect(fixed.stdout).toContain('an upgrade is available');
  });

  it('an endpoint host the Proxy certificate does not hold: GW_ERR_TLS_NAME_MISMATCH with the names and the public_addr fix', async () => {
    await endpoint(`${OTHER_NAME}:${port}/v1/webapi/automaticupgrades/channel/stable/v17`);
    const r = await dryRun(throughSquid);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_TLS_NAME_MISMATCH');
    expect(r.stderr).toContain(`the certificate of ${OTHER_NAME}:${port} does not hold the name ${OTHER_NAME}`);
    expect(r.stderr).toContain(PROXY_NAME);
    expect(r.stderr).toContain(`hint: Set proxy_service.public_addr on the Proxy to include ${OTHER_NAME}:${port}`);
  });

  it('the Proxy unreachable through the proxy: the Dialer\'s error, named', async () => {
    await endpoint(`unknown.gw.test:${port}/v1/webapi/automaticupgrades/channel/default`);
    const r = await dryRun(throughSquid);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('error: cannot ask the version server https://unknown.gw.test');
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_VERSION_SERVER');
  });
});

describe('the endpoint file (seed Errors rule 1)', () => {
  it('https:// in front is refused, showing the value and the expected shape', async () => {
    const value = `https://${viaIp('default')}`;
    await endpoint(value);
    const r = await dryRun();
    expect(r.status).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      [
        `error: ${join(etc, 'endpoint')} holds "${value}": it starts with https://, which the upgrader adds itself; expected <host>:<port>/v1/webapi/automaticupgrades/channel/<channel>, e.g. proxy.example.com:443/v1/webapi/automaticupgrades/channel/default`,
        `hint: Remove "https://": write ${viaIp('default')}`,
        'code: GW_ERR_UPGRADE_ENDPOINT',
        '',
      ].join('\n'),
    );
  });

  it('a /version suffix is refused the same way', async () => {
    await endpoint(`${viaIp('default')}/version`);
    const r = await runCli('gateway-upgrade', ['run'], { env: baseEnv });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`holds "${viaIp('default')}/version": it ends with /version, which the upgrader adds itself; expected <host>:<port>/v1/webapi/automaticupgrades/channel/<channel>`);
    expect(r.stderr).toContain(`hint: Remove the suffix: write ${viaIp('default')}\n`);
  });

  it('a missing file says what to write', async () => {
    await rm(join(etc, 'endpoint'), { force: true });
    const r = await dryRun();
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`error: ${join(etc, 'endpoint')} does not exist`);
    expect(r.stderr).toContain('hint: Write the Proxy\'s version endpoint there, one line: <host>:<port>/v1/webapi/automaticupgrades/channel/<channel>');
  });
});

describe('a cluster too old for automatic upgrades (seed Versioning 2)', () => {
  it('dry-run reports the comparison and says why run will not upgrade; run refuses with the version needed', async () => {
    const env = { ...baseEnv, GATEWAY_UPGRADE_CA_FILE: pki.caCertPath };
    await endpoint(`127.0.0.1:${oldCluster.port}/v1/webapi/automaticupgrades/channel/default`);
    await writeSchedule(etc, [{ start: new Date(Date.now() - 60_000), stop: new Date(Date.now() + HOUR) }]);
    const dry = await runCli('gateway-upgrade', ['dry-run'], { env });
    expect(dry.status).toBe(0);
    expect(dry.stdout.split('\n')[0]).toBe('an upgrade is available (17.0.1 -> 15.1.3)');
    expect(dry.stderr).toContain(
      "warning: this agent is not enrolled in automatic upgrades: the cluster runs v15.1.2, older than automatic agent upgrades need (v15.1.3 or later (v15)); 'gateway-upgrade run' will not upgrade (needs v14.3.7 on v14, or v15.1.3 on v15 and later)",
    );
    const run = await runCli('gateway-upgrade', ['run'], { env });
    expect(run.status).toBe(1);
    expect(run.stderr).toContain('error: this agent is not enrolled in automatic upgrades: the cluster runs v15.1.2');
    expect(run.stderr).toContain("hint: Upgrade the cluster's Auth and Proxy Services to v14.3.7 on v14, or v15.1.3 on v15 and later");
    expect(run.stderr).toContain('code: GW_ERR_UPGRADE_CLUSTER_TOO_OLD');
  });
});

describe('gateway-upgrade itself', () => {
  it('version prints its own version; no subcommand prints the usage', async () => {
    const v = await runCli('gateway-upgrade', ['version']);
    expect(v).toMatchObject({ status: 0, stdout: 'gateway-upgrade v17.0.0-dev\n' });
    const help = await runCli('gateway-upgrade', []);
    expect(help.stdout + help.stderr).toContain('dry-run');
    const bad = await runCli('gateway-upgrade', ['frobnicate']);
    expect(bad.status).toBe(2);
  });
});
