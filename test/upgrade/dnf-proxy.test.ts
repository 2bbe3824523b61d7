/**
 * dnf through the Proxy's repository route, with the signed rpm repository the dnf tests build (rpmbuild packages,
 * createrepo_c, repomd.xml signed and checked with repo_gpgcheck): the real daemon relays
 * proxy_service.autoupdate_artifacts.repo_url, an http server of that repository which it reaches only through its own
 * squid; dnf on the agent host reaches only the Proxy, through another squid (the entry's proxy=). `gateway-upgrade
 * repo set-source proxy` moves baseurl to the Proxy's route and adds sslcacert= (the cluster's CA for this repository
 * only); then gateway-upgrade run takes N to N+1 with dnf. HOSTILE: a repomd.xml signed by another key, relayed by
 * the Proxy, is refused by dnf (GW_ERR_UPGRADE_REPO), nothing installed. rpm installs into the root by chroot: root only.
 */
import { copyFile, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, normalize } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { startHttpServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeRpmLab, writeScript, type RpmLab } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const REPO_IP = '127.0.0.3';
const REPO_NAME = 'repo.gw.test';
const PROXY_IP = '127.0.0.4';
const PROXY_NAME = 'proxy.gw.test';
const DIRECT = 'https://yum.gateway.example';

rootSuite(['chroot'])('dnf through the Proxy\'s repository route', () => {
  let lab: RpmLab;
  let corporate: Squid;
  let agentSquid: Squid;
  let repoServer: HttpTestServer;
  const asked: string[] = [];
  let gw: RunningGateway;
  let port: number;
  let etc: string;
  let restartLog: string;
  let env: Record<string, string>;
  let caFile: string;

  beforeAll(async () => {
    lab = await makeRpmLab('dnf', [{ version: '17.0.1' }, { version: '17.0.2' }]);
    await writeFile(join(lab.dir, 'corp-hosts'), `${REPO_IP} ${REPO_NAME}\n`, { mode: 0o644 });
    await writeFile(join(lab.dir, 'agent-hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
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
        '  cluster_name: dnf-proxy.example',
        '  listen_addr: 127.0.0.1:0',
        'proxy_service:',
        `  web_listen_addr: ${PROXY_IP}:${port}`,
        `  public_addr: ${PROXY_NAME}:${port}`,
        '  automatic_upgrades_channels:',
        '    stable/v17: { static_version: v17.0.2 }',
        '  autoupdate_artifacts:',
        `    repo_url: http://${REPO_NAME}:${repoServer.port}`,
        '    index_ttl: 1ms',
        '',
      ].join('\n'),
      { env: { HTTPS_PROXY: corporate.url, HTTP_PROXY: corporate.url } },
    );
    etc = join(lab.root, 'etc/gateway-upgrade.d');
    await mkdir(etc, { recursive: true });
    await writeFile(join(etc, 'endpoint'), `${PROXY_NAME}:${port}/v1/webapi/automaticupgrades/channel/stable/v17\n`);
    const dataDir = join(lab.dir, 'var-lib-gateway');
    await mkdir(join(dataDir, 'host'), { recursive: true });
    caFile = join(dataDir, 'host', 'host-ca.pem');
    await copyFile(join(gw.dataDir, 'admin', 'host-ca.pem'), caFile);
    restartLog = join(lab.dir, 'restarts.log');
    const restart = await writeScript(join(lab.dir, 'restart.sh'), `echo "restart $(${lab.binary} --version)" >> ${restartLog}`);
    env = {
      ...lab.env,
      GATEWAY_UPGRADE_ROOT: lab.root,
      GATEWAY_UPGRADE_DATA_DIR: dataDir,
      GATEWAY_UPGRADE_PACKAGE_MANAGER: 'dnf',
      GATEWAY_UPGRADE_PM_ARGS: lab.pmArgs.join(' '),
      GATEWAY_UPGRADE_VERSION_COMMAND: `${lab.binary} --version`,
      GATEWAY_UPGRADE_RESTART_COMMAND: restart,
      GATEWAY_UPGRADE_HEALTH_COMMAND: `${lab.binary} health`,
      GATEWAY_UPGRADE_HEALTH_TIMEOUT: '2s',
      GATEWAY_UPGRADE_HEALTH_POLL: '100ms',
      HTTPS_PROXY: agentSquid.url,
    };
  }, 240_000);

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
    // The entry as the install guide writes it (the repository's own address), with dnf's way out on this host.
    await writeFile(lab.repoFile, lab.repoText('stable/v17').replace(`baseurl=file://${lab.repo}`, `baseurl=${DIRECT}`).replace('enabled=1', `enabled=1\nproxy=${agentSquid.url}`));
    asked.length = 0;
  }, 120_000);

  it('repo set-source proxy: baseurl on the Proxy\'s route with sslcacert=; then N -> N+1 with dnf', async () => {
    const set = await runCli('gateway-upgrade', ['repo', 'set-source', 'proxy'], { env, timeoutMs: 30_000 });
    expect(set.status, set.stderr).toBe(0);
    const entry = await readFile(lab.repoFile, 'utf8');
    expect(entry).toContain(`baseurl=https://${PROXY_NAME}:${port}/v1/webapi/autoupdate/repo/stable/v17\nsslcacert=${caFile}\n`);
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 180_000 });
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2');
    expect(asked).toContain('/stable/v17/repodata/repomd.xml');
    expect((await agentSquid.readAccessLog()).some((l) => l.includes(REPO_NAME))).toBe(false);
  });

  it('HOSTILE: a repomd.xml signed by another key, relayed by the Proxy: dnf refuses it, nothing installed', async () => {
    expect((await runCli('gateway-upgrade', ['repo', 'set-source', 'proxy'], { env, timeoutMs: 30_000 })).status).toBe(0);
    await lab.resignWithOtherKey('stable/v17');
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 180_000 });
    expect(r.status, r.stdout).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
    expect(await lab.query()).toMatch(/^gateway-17\.0\.1-/);
  });
});
