/**
 * Release tarballs through the Proxy, end to end with real components (docs/upgrades.md, "Artifacts through the
 * Proxy"): the real daemon's Proxy relays proxy_service.autoupdate_artifacts.download_url, an HTTPS release server
 * that it reaches only through its own squid (the corporate proxy on its side: the server's name exists only in that
 * squid's hosts file). The agent host reaches only the Proxy, through another squid that knows only the Proxy's name
 * and lets CONNECT through only to the Proxy's port. The built gateway-upgrade runs with GATEWAY_UPGRADE_ARTIFACTS=proxy
 * (the download location derived from the endpoint file's Proxy) and the cluster's CA as its only extra trust:
 *
 * - the genuine N+1 is downloaded through both squids, checked, installed and restarted;
 * - a second upgrade of the same release is served from the Proxy's cache: the release server is not asked again;
 * - a release whose .sha256 does not match what the Proxy serves is refused by the agent's own check
 *   (GW_ERR_UPGRADE_CHECKSUM), nothing installed: the Proxy checks nothing on the agent's behalf;
 * - an agent's certificate at the download location is still refused (the relaxed check takes only a Proxy's).
 */
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import type { HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { fakeGatewayScript, makeTarball, startReleaseServer, writeScript } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const CDN_IP = '127.0.0.3';
const CDN_NAME = 'cdn.gw.test';
const PROXY_IP = '127.0.0.4';
const PROXY_NAME = 'proxy.gw.test';
const name = (v: string) => `gateway-ent-v${v}-linux-amd64-bin.tar.gz`;

let dir: string;
let pki: TestPki;
let corporate: Squid;
let agentSquid: Squid;
let cdn: HttpTestServer;
let gw: RunningGateway;
let port: number;
let diagPort: number;
let root: string;
let bin: string;
let etc: string;
let restartLog: string;
let env: Record<string, string>;
const files = new Map<string, Buffer | string>();
const requests: string[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-artifacts-proxy-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'corp-hosts'), `${CDN_IP} ${CDN_NAME}\n`, { mode: 0o644 });
  await writeFile(join(dir, 'agent-hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  pki = await makeTestPki();
  cdn = await startReleaseServer(pki, CDN_NAME, CDN_IP, { files, requests });
  port = await getPort({ host: PROXY_IP });
  diagPort = await getPort({ host: '127.0.0.1' });
  corporate = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'corp-hosts')}`] });
  agentSquid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'agent-hosts')}`], connectPorts: [port] });

  for (const v of ['17.0.2', '17.0.3']) {
    const t = await makeTarball(v, 'amd64');
    files.set(`/${t.name}`, t.body);
    // 17.0.3's .sha256 is another file's: the release as served does not match it.
    files.set(`/${t.name}.sha256`, `${v === '17.0.3' ? 'ab'.repeat(32) : t.sha256}  ${t.name}\n`);
  }

  gw = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      `  diag_addr: 127.0.0.1:${diagPort}`,
      'auth_service:',
      '  cluster_name: artifacts.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${port}`,
      `  public_addr: ${PROXY_NAME}:${port}`,
      '  automatic_upgrades_channels:',
      '    default: { static_version: v17.0.2 }',
      '    tampered: { static_version: v17.0.3 }',
      '  autoupdate_artifacts:',
      `    download_url: https://${CDN_NAME}:${cdn.port}`,
      '    fetch_timeout: 20s',
      '',
    ].join('\n'),
    // The Proxy's own way out: the corporate squid; it trusts the release server's CA as an operator's system would.
    { env: { HTTPS_PROXY: corporate.url, NODE_EXTRA_CA_CERTS: pki.caCertPath } },
  );

  root = join(dir, 'root');
  bin = join(root, 'usr/local/bin');
  etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(bin, { recursive: true });
  await mkdir(etc, { recursive: true });
  restartLog = join(dir, 'restarts.log');
  const restart = await writeScript(join(dir, 'restart.sh'), `echo "restart $(${bin}/gateway --version)" >> ${restartLog}`);
  env = {
    PATH: process.env.PATH ?? '',
    GATEWAY_UPGRADE_ROOT: root,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball',
    GATEWAY_UPGRADE_ARCH: 'x64',
    GATEWAY_UPGRADE_ARTIFACTS: 'proxy',
    // The cluster's CA only (what an agent keeps in <data_dir>/host/host-ca.pem): the Proxy's certificate is its.
    GATEWAY_UPGRADE_CA_FILE: join(gw.dataDir, 'admin', 'host-ca.pem'),
    GATEWAY_UPGRADE_VERSION_COMMAND: `${bin}/gateway --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: `${bin}/gateway health`,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: '5s',
    GATEWAY_UPGRADE_HEALTH_POLL: '100ms',
    HTTPS_PROXY: agentSquid.url,
  };
}, 120_000);

afterAll(async () => {
  await gw?.stop();
  await cdn?.close();
  await corporate?.stop();
  await agentSquid?.stop();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

beforeEach(async () => {
  await writeFile(join(bin, 'gateway'), await fakeGatewayScript('17.0.1'), { mode: 0o755 });
  await rm(restartLog, { force: true });
  await writeSchedule(etc, [{ start: new Date(Date.now() - 60_000), stop: new Date(Date.now() + 3_600_000) }]);
  requests.length = 0;
});

const endpoint = (channel: string) => writeFile(join(etc, 'endpoint'), `${PROXY_NAME}:${port}/v1/webapi/automaticupgrades/channel/${channel}\n`);
const installed = async () => (await readFile(join(bin, 'gateway'), 'utf8')).match(/Gateway v(\S+)/)?.[1];
const restarts = async () => (await readFile(restartLog, 'utf8').catch(() => '')).split('\n').filter(Boolean);

describe('release tarballs through the Proxy (agent side reaches only the Proxy; the Proxy reaches the release server only through its corporate proxy)', () => {
  it('the genuine 17.0.2: fetched by the Proxy through its squid, relayed through the agent\'s squid, checked, installed', async () => {
    await endpoint('default');
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 90_000 });
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(r.stdout).toContain(`installing tarball ${name('17.0.2')}`);
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2; the service is running 17.0.2');
    expect(await installed()).toBe('17.0.2');
    expect(await restarts()).toHaveLength(1);
    expect(requests).toEqual([`/${name('17.0.2')}.sha256`, `/${name('17.0.2')}`]);
    // Each side went out through its own proxy, and the agent's side never named the release server.
    expect((await corporate.readAccessLog()).some((l) => l.includes(`CONNECT ${CDN_NAME}:${cdn.port}`))).toBe(true);
    const agentLog = await agentSquid.readAccessLog();
    expect(agentLog.some((l) => l.includes(`CONNECT ${PROXY_NAME}:${port}`))).toBe(true);
    expect(agentLog.some((l) => l.includes(CDN_NAME))).toBe(false);
  });

  it('the same release again (another host): served from the Proxy\'s cache, the release server not asked', async () => {
    await endpoint('default');
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 90_000 });
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(await installed()).toBe('17.0.2');
    expect(requests).toEqual([]);
    const metrics = await fetchMetrics();
    expect(metrics).toMatch(/gateway_proxy_artifact_requests_total\{[^}]*route="artifacts"[^}]*outcome="hit"[^}]*\} [1-9]/);
  });

  it('HOSTILE: a release that does not match its .sha256, served by the Proxy: refused by the agent, nothing installed', async () => {
    await endpoint('tampered');
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 90_000 });
    expect(r.status, r.stdout).toBe(1);
    expect(r.stderr).toContain(`checksum mismatch for ${name('17.0.3')}`);
    expect(r.stderr).toContain('nothing was extracted or installed');
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_CHECKSUM');
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual([]);
  });

  it('HOSTILE: the real front door refuses paths that climb, queries and names that are not releases, before anything is fetched', async () => {
    const ca = await readFile(join(gw.dataDir, 'admin', 'host-ca.pem'), 'utf8');
    const ask = (path: string, method = 'GET') =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = https.request({ host: PROXY_IP, port, path, method, servername: PROXY_NAME, ca, agent: false }, (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        });
        req.on('error', reject);
        req.end();
      });
    for (const path of [
      '/v1/webapi/autoupdate/artifacts/..%2f..%2fetc%2fpasswd',
      '/v1/webapi/autoupdate/artifacts/%2e%2e/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz',
      '/v1/webapi/autoupdate/artifacts/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz?x=1',
      '/v1/webapi/autoupdate/artifacts/install.sh',
      '/v1/webapi/autoupdate/repo/../../admin/host-ca.pem',
      `/v1/webapi/autoupdate/repo/${'a'.repeat(2000)}`,
    ]) {
      const r = await ask(path);
      expect(r.status, path).toBe(400);
      expect(r.body, path).toContain('GW_ERR_ARTIFACT_BAD_PATH');
    }
    expect((await ask(`/v1/webapi/autoupdate/artifacts/${name('17.0.2')}`, 'DELETE')).status).toBe(405);
    // repo_url is not set on this Proxy: its route says so.
    const off = await ask('/v1/webapi/autoupdate/repo/debian/dists/bookworm/InRelease');
    expect(off.status).toBe(404);
    expect(off.body).toContain('GW_ERR_ARTIFACT_DISABLED');
    expect(requests).toEqual([]);
  });

  it('GATEWAY_UPGRADE_ARTIFACTS=proxy with GATEWAY_UPGRADE_DOWNLOAD_URL too: refused as ambiguous, nothing asked', async () => {
    await endpoint('default');
    const r = await runCli('gateway-upgrade', ['run'], { env: { ...env, GATEWAY_UPGRADE_DOWNLOAD_URL: `https://${CDN_NAME}:${cdn.port}` }, timeoutMs: 30_000 });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('GATEWAY_UPGRADE_ARTIFACTS=proxy and GATEWAY_UPGRADE_DOWNLOAD_URL are both set');
    expect(await installed()).toBe('17.0.1');
  });
});

/** The Proxy's metrics, from its diagnostics address. */
async function fetchMetrics(): Promise<string> {
  return (await fetch(`http://127.0.0.1:${diagPort}/metrics`)).text();
}
