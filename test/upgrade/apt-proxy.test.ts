/**
 * apt through the Proxy's repository route, with the real signed repository the apt tests build (dpkg-deb packages,
 * apt-ftparchive indices, InRelease signed with the test's own key, the entry's signed-by naming it): the real daemon
 * relays proxy_service.autoupdate_artifacts.repo_url, an http server of that repository which it reaches only through
 * its own squid (the corporate proxy: the repository's name exists only in that squid's hosts file). apt on the agent
 * host reaches only the Proxy, through another squid that lets CONNECT through only to the Proxy's port.
 *
 * `gateway-upgrade repo set-source proxy` moves the entry to the Proxy's route and writes the apt.conf.d file that
 * trusts the cluster's CA for the Proxy's host only; then gateway-upgrade run takes N to N+1 with apt-get. HOSTILE:
 * an InRelease signed by another key, relayed by the Proxy, is refused by apt's own signature check
 * (GW_ERR_UPGRADE_REPO), nothing installed. `set-source direct` puts the entry back and removes the CA file.
 */
import { copyFile, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, normalize } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startHttpServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeAptLab, writeScript, type AptLab } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const REPO_IP = '127.0.0.3';
const REPO_NAME = 'repo.gw.test';
const PROXY_IP = '127.0.0.4';
const PROXY_NAME = 'proxy.gw.test';
const DIRECT = 'https://apt.gateway.example';

let lab: AptLab;
let corporate: Squid;
let agentSquid: Squid;
let repoServer: HttpTestServer;
const asked: string[] = [];
let gw: RunningGateway;
let port: number;
let etc: string;
let list: string;
let restartLog: string;
let env: Record<string, string>;

beforeAll(async () => {
  lab = await makeAptLab([{ version: '17.0.1' }, { version: '17.0.2' }]);
  await writeFile(join(lab.dir, 'corp-hosts'), `${REPO_IP} ${REPO_NAME}\n`, { mode: 0o644 });
  await writeFile(join(lab.dir, 'agent-hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  // The repository over http, read from disk at each request (so a re-signed InRelease is what it serves next).
  repoServer = await startHttpServer((req, res) => {
    const path = normalize(decodeURIComponent(req.url ?? '/'));
    asked.push(path);
    readFile(join(lab.repo, path)).then(
      (body) => res.writeHead(200, { 'content-length': body.length }).end(body),
      () => res.writeHead(404).end(),
    );
  }, REPO_IP);
  port = await getPort({ host: PROXY_IP });
  corporate = await startSquid({ extraConfig: [`hosts_file ${join(lab.dir, 'corp-hosts')}`] });
  agentSquid = await startSquid({ extraConfig: [`hosts_file ${join(lab.dir, 'agent-hosts')}`], connectPorts: [port] });
  gw = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      'auth_service:',
      '  cluster_name: apt-proxy.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${port}`,
      `  public_addr: ${PROXY_NAME}:${port}`,
      '  automatic_upgrades_channels:',
      '    stable/v17: { static_version: v17.0.2 }',
      '  autoupdate_artifacts:',
      `    repo_url: http://${REPO_NAME}:${repoServer.port}`,
      // Every index is fetched again at once: the hostile case below re-signs InRelease between runs.
      '    index_ttl: 1ms',
      '',
    ].join('\n'),
    { env: { HTTPS_PROXY: corporate.url, HTTP_PROXY: corporate.url } },
  );
  etc = join(lab.root, 'etc/gateway-upgrade.d');
  await mkdir(etc, { recursive: true });
  await writeFile(join(etc, 'endpoint'), `${PROXY_NAME}:${port}/v1/webapi/automaticupgrades/channel/stable/v17\n`);
  // The agent's stored cluster CA, where gateway-upgrade finds it (and names it to apt).
  const dataDir = join(lab.dir, 'var-lib-gateway');
  await mkdir(join(dataDir, 'host'), { recursive: true });
  await copyFile(join(gw.dataDir, 'admin', 'host-ca.pem'), join(dataDir, 'host', 'host-ca.pem'));
  // apt's own way out on this host: the agent side's squid.
  await writeFile(join(lab.root, 'etc/apt/apt.conf.d/10proxy'), `Acquire::https::Proxy "${agentSquid.url}";\nAcquire::http::Proxy "${agentSquid.url}";\n`);
  list = join(lab.root, 'etc/apt/sources.list.d/gateway.list');
  restartLog = join(lab.dir, 'restarts.log');
  const restart = await writeScript(join(lab.dir, 'restart.sh'), `echo "restart $(${lab.binary} --version)" >> ${restartLog}`);
  env = {
    ...lab.env,
    PATH: process.env.PATH ?? '',
    GATEWAY_UPGRADE_ROOT: lab.root,
    GATEWAY_UPGRADE_DATA_DIR: dataDir,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: 'apt',
    GATEWAY_UPGRADE_VERSION_COMMAND: `${lab.binary} --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: `${lab.binary} health`,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: '2s',
    GATEWAY_UPGRADE_HEALTH_POLL: '100ms',
    HTTPS_PROXY: agentSquid.url,
  };
}, 180_000);

afterAll(async () => {
  await gw?.stop();
  await repoServer?.close();
  await corporate?.stop();
  await agentSquid?.stop();
  await lab?.cleanup();
});

beforeEach(async () => {
  await lab.restore();
  await lab.install('17.0.1');
  await rm(restartLog, { force: true });
  await writeSchedule(etc, [{ start: new Date(Date.now() - 60_000), stop: new Date(Date.now() + 3_600_000) }]);
  asked.length = 0;
}, 60_000);

const keyring = () => /signed-by=(\S+)\]/.exec(lab.sourceLine('stable/v17'))![1]!;
/** The entry as the install guide writes it: the repository's own address. */
const directEntry = () => writeFile(list, `deb [signed-by=${keyring()}] ${DIRECT} ${lab.codename} stable/v17\n`);
const upgrade = () => runCli('gateway-upgrade', ['run'], { env, timeoutMs: 120_000 });

describe('apt through the Proxy\'s repository route', () => {
  it('repo set-source proxy: the entry names the Proxy\'s route, apt trusts the cluster CA for that host only; then N -> N+1', async () => {
    await directEntry();
    const set = await runCli('gateway-upgrade', ['repo', 'set-source', 'proxy'], { env, timeoutMs: 30_000 });
    expect(set.status, set.stderr).toBe(0);
    expect(await readFile(list, 'utf8')).toBe(`deb [signed-by=${keyring()}] https://${PROXY_NAME}:${port}/v1/webapi/autoupdate/repo ${lab.codename} stable/v17\n`);
    const conf = await readFile(join(lab.root, 'etc/apt/apt.conf.d/60gateway-proxy-ca'), 'utf8');
    expect(conf).toContain(`Acquire::https::${PROXY_NAME}::CaInfo "${join(lab.dir, 'var-lib-gateway', 'host', 'host-ca.pem')}";`);

    const r = await upgrade();
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2');
    expect(await lab.installed()).toBe('Gateway v17.0.2 git:test');
    // The repository was read by the Proxy (through its squid), and apt reached only the Proxy.
    expect(asked).toContain(`/dists/${lab.codename}/InRelease`);
    expect(asked.some((p) => p.endsWith('gateway_17.0.2_all.deb'))).toBe(true);
    expect((await corporate.readAccessLog()).some((l) => l.includes(`CONNECT ${REPO_NAME}:${repoServer.port}`))).toBe(true);
    const agentLog = await agentSquid.readAccessLog();
    expect(agentLog.some((l) => l.includes(`CONNECT ${PROXY_NAME}:${port}`))).toBe(true);
    expect(agentLog.some((l) => l.includes(REPO_NAME))).toBe(false);
  });

  it('HOSTILE: an InRelease signed by another key, relayed by the Proxy: apt refuses it, nothing installed', async () => {
    await directEntry();
    expect((await runCli('gateway-upgrade', ['repo', 'set-source', 'proxy'], { env, timeoutMs: 30_000 })).status).toBe(0);
    await lab.resignWithOtherKey();
    const r = await upgrade();
    expect(r.status, r.stdout).toBe(1);
    expect(r.stderr).toContain("the gateway repository's signature does not verify with the key this host trusts for it");
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await readFile(restartLog, 'utf8').catch(() => '')).toBe('');
  });

  it('GATEWAY_UPGRADE_ARTIFACTS=proxy: the entry repo set-channel creates names the Proxy\'s route at once', async () => {
    await rm(list, { force: true });
    const r = await runCli('gateway-upgrade', ['repo', 'set-channel', 'stable/v17'], { env: { ...env, GATEWAY_UPGRADE_ARTIFACTS: 'proxy' }, timeoutMs: 30_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(await readFile(list, 'utf8')).toContain(` https://${PROXY_NAME}:${port}/v1/webapi/autoupdate/repo/debian ${lab.codename} stable/v17\n`);
    // Without it, the repository's own address, as before.
    await rm(list, { force: true });
    expect((await runCli('gateway-upgrade', ['repo', 'set-channel', 'stable/v17'], { env, timeoutMs: 30_000 })).status).toBe(0);
    expect(await readFile(list, 'utf8')).toContain(` ${DIRECT}/debian ${lab.codename} stable/v17\n`);
  });

  it('repo set-source direct: the entry back at the repository\'s own address, the CA file removed', async () => {
    await directEntry();
    expect((await runCli('gateway-upgrade', ['repo', 'set-source', 'proxy'], { env, timeoutMs: 30_000 })).status).toBe(0);
    const back = await runCli('gateway-upgrade', ['repo', 'set-source', 'direct'], { env, timeoutMs: 30_000 });
    expect(back.status, back.stderr).toBe(0);
    expect(await readFile(list, 'utf8')).toBe(`deb [signed-by=${keyring()}] ${DIRECT} ${lab.codename} stable/v17\n`);
    await expect(readFile(join(lab.root, 'etc/apt/apt.conf.d/60gateway-proxy-ca'), 'utf8')).rejects.toThrow();
    const bad = await runCli('gateway-upgrade', ['repo', 'set-source', 'mirror'], { env, timeoutMs: 30_000 });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toContain("unknown source 'mirror'");
  });
});
