/**
 * gateway-upgrade run with dnf or zypper, for real: the built CLI, the real daemon as the version server, and the
 * package manager installing rpm packages of a fake gateway (test/upgrade/helpers.ts makeRpmLab: rpmbuild,
 * createrepo_c, one repository per channel, repomd.xml signed and checked: repo_gpgcheck) into a temporary root that GATEWAY_UPGRADE_PM_ARGS points it at
 * (dnf --installroot, zypper --root). rpm installs into a root by chroot, so these suites need root.
 *
 * Versions: N = 17.0.1 (installed before each test), N+1 = 17.0.2, a broken 17.0.3 (its health check fails),
 * 18.0.0 on stable/v18 and stable/rolling only, and 17.0.9 which the repository does not have.
 * dnf.test.ts and zypper.test.ts each run this suite with their manager.
 */
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { startHttpServer, type HttpTestServer } from '../helpers/servers.js';
import { makeRpmLab, writeScript, type RpmLab, type RpmManager } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const HOUR = 3_600_000;
const insideNow = () => [{ start: new Date(Date.now() - 10 * 60_000), stop: new Date(Date.now() + 50 * 60_000) }];
const later = () => [{ start: new Date(Date.now() + 5 * HOUR), stop: new Date(Date.now() + 6 * HOUR) }];

const CHANNELS = [
  '  automatic_upgrades_channels:',
  '    stable/v17: { static_version: v17.0.2 }',
  '    broken: { static_version: v17.0.3 }',
  '    missing: { static_version: v17.0.9 }',
  '    major: { static_version: v18.0.0 }',
];

/** The upgrade lab shared by a suite: repository, root, daemon, endpoint and the recorded restarts. */
interface Harness {
  lab: RpmLab;
  gw: RunningGateway;
  upstream: HttpTestServer;
  etc: string;
  restartLog: string;
  env: Record<string, string>;
}

async function startHarness(manager: RpmManager): Promise<Harness> {
  const lab = await makeRpmLab(manager, [{ version: '17.0.1' }, { version: '17.0.2' }, { version: '17.0.3', healthy: false }, { version: '18.0.0' }]);
  const upstream = await startHttpServer((req, res) => {
    const answers: Record<string, string> = { '/crit/version': 'v17.0.2', '/crit/critical': 'yes' };
    const body = answers[req.url ?? ''];
    res.writeHead(body ? 200 : 404, { 'content-type': 'text/plain' });
    res.end(body ?? 'not found');
  });
  const port = await getPort({ host: '127.0.0.1' });
  const gw = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      'auth_service:',
      '  cluster_name: upgrades.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: 127.0.0.1:${port}`,
      ...CHANNELS,
      `    urgent: { forward_url: "${upstream.url}/crit" }`,
      '',
    ].join('\n'),
  );
  const etc = join(lab.root, 'etc/gateway-upgrade.d');
  await mkdir(etc, { recursive: true });
  await writeFile(join(etc, 'endpoint.base'), `127.0.0.1:${port}`);
  const restartLog = join(lab.dir, 'restarts.log');
  const restart = await writeScript(join(lab.dir, 'restart.sh'), `echo "restart $(${lab.binary} --version)" >> ${restartLog}`);
  const env = {
    ...lab.env,
    GATEWAY_UPGRADE_ROOT: lab.root,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: manager,
    GATEWAY_UPGRADE_PM_ARGS: lab.pmArgs.join(' '),
    GATEWAY_UPGRADE_CA_FILE: join(gw.dataDir, 'admin', 'host-ca.pem'),
    GATEWAY_UPGRADE_VERSION_COMMAND: `${lab.binary} --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: `${lab.binary} health`,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: '2s',
    GATEWAY_UPGRADE_HEALTH_POLL: '100ms',
  };
  return { lab, gw, upstream, etc, restartLog, env };
}

/** Registers the suite of one rpm package manager. */
export function rpmUpgradeSuite(manager: RpmManager): void {
  rootSuite(['chroot'])(`gateway-upgrade run with ${manager}`, () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness(manager);
    }, 120_000);
    afterAll(async () => {
      await h?.gw.stop();
      await h?.upstream.close();
      await h?.lab.cleanup();
    });
    beforeEach(async () => {
      await h.lab.restore();
      await h.lab.install('17.0.1');
      await writeFile(h.lab.repoFile, h.lab.repoText('stable/v17'));
      await rm(h.restartLog, { force: true });
      await rm(join(h.etc, 'schedule'), { force: true });
    }, 60_000);

    const endpoint = async (channel: string) => {
      const base = await readFile(join(h.etc, 'endpoint.base'), 'utf8');
      await writeFile(join(h.etc, 'endpoint'), `${base}/v1/webapi/automaticupgrades/channel/${channel}\n`);
    };
    const restarts = async () => (await readFile(h.restartLog, 'utf8').catch(() => '')).split('\n').filter(Boolean);
    const upgrade = (...args: string[]) => runCli('gateway-upgrade', ['run', ...args], { env: h.env, timeoutMs: 90_000 });
    /** Nothing changed: N installed and running, no restart, the repository entry as it was. */
    const unchanged = async () => {
      expect(await h.lab.query()).toBe('gateway-17.0.1-1.noarch');
      expect(await h.lab.installed()).toBe('Gateway v17.0.1 git:test');
      expect(await restarts()).toEqual([]);
      expect(await readFile(h.lab.repoFile, 'utf8')).toBe(h.lab.repoText('stable/v17'));
    };

    it('outside the maintenance window: reports the upgrade and leaves N installed', async () => {
      await endpoint('stable/v17');
      await writeSchedule(h.etc, later());
      const r = await upgrade();
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout.split('\n')[0]).toBe('an upgrade is available (17.0.1 -> 17.0.2)');
      expect(r.stdout).toMatch(/^not upgrading: outside the maintenance window; the next starts at .*Z \(in \d+h \d+m\); critical releases go at once$/m);
      await unchanged();
    });

    it(`inside the window: N -> N+1 through ${manager} in the root, restarts the service; then nothing to do`, async () => {
      await endpoint('stable/v17');
      await writeSchedule(h.etc, insideNow());
      const r = await upgrade();
      expect(r.status, r.stderr).toBe(0);
      const lines = r.stdout.trim().split('\n');
      expect(lines[0]).toBe('an upgrade is available (17.0.1 -> 17.0.2)');
      expect(lines[1]).toMatch(/^upgrading: inside the maintenance window \(until .*Z\)$/);
      expect(lines[2]).toBe(`installing ${manager} (${manager === 'dnf' ? 'gateway-17.0.2' : 'gateway=17.0.2'})`);
      expect(lines.at(-1)).toBe('upgraded gateway 17.0.1 -> 17.0.2; the service is running 17.0.2');
      expect(r.stderr).toContain(`+ ${manager} ${h.lab.pmArgs.join(' ')} `);
      expect(await h.lab.query()).toBe('gateway-17.0.2-1.noarch');
      expect(await h.lab.installed()).toBe('Gateway v17.0.2 git:test');
      expect(await restarts()).toEqual(['restart Gateway v17.0.2 git:test']);
      const again = await upgrade();
      expect(again.stdout).toBe('no upgrades available (17.0.2 == 17.0.2)\n');
    });

    it('a critical release goes at once, outside any window', async () => {
      await endpoint('urgent');
      await writeSchedule(h.etc, later());
      const r = await upgrade();
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toContain('upgrading now: 17.0.2 is a critical release, which does not wait for a maintenance window');
      expect(await h.lab.query()).toBe('gateway-17.0.2-1.noarch');
    });

    it(`a build that does not come back is rolled back with ${manager} (a downgrade): N runs again`, async () => {
      await endpoint('broken');
      await writeSchedule(h.etc, insideNow());
      const r = await upgrade();
      expect(r.status).toBe(1);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
      expect(r.stderr).toContain('the previous version 17.0.1 was put back and is running');
      expect(await h.lab.query()).toBe('gateway-17.0.1-1.noarch');
      expect(await restarts()).toEqual(['restart Gateway v17.0.3 git:test', 'restart Gateway v17.0.1 git:test']);
    });

    it('hostile: a version the repository does not have: GW_ERR_UPGRADE_INSTALL naming it, nothing changed', async () => {
      await endpoint('missing');
      await writeSchedule(h.etc, insideNow());
      const r = await upgrade();
      expect(r.status).toBe(1);
      const spec = manager === 'dnf' ? 'gateway-17.0.9' : 'gateway=17.0.9';
      expect(r.stderr).toMatch(new RegExp(`^error: installing ${spec} failed: the gateway repository has no ${spec} \\(${manager}: .+\\) \\[.*\\]; 17\\.0\\.1 is still installed and the service was not restarted$`, 'm'));
      expect(r.stderr).toMatch(/^hint: The version server's channel names a version the repository does not hold/m);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_INSTALL');
      await unchanged();
    });

    it("hostile: a package whose checksum does not match the repository's metadata: GW_ERR_UPGRADE_CHECKSUM, nothing changed", async () => {
      await h.lab.tamperPackage('stable/v17', '17.0.2');
      await endpoint('stable/v17');
      await writeSchedule(h.etc, insideNow());
      const r = await upgrade();
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/^error: installing gateway.17\.0\.2 failed: the package gateway.17\.0\.2 does not match the checksum the repository's metadata gives for it \(.+\).*; 17\.0\.1 is still installed and the service was not restarted$/m);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_CHECKSUM');
      await unchanged();
    });

    it('hostile: signed metadata naming a primary.xml.gz that is not there (a mirror mid-sync): GW_ERR_UPGRADE_REPO, nothing changed', async () => {
      await h.lab.corruptMetadata('stable/v17');
      await endpoint('stable/v17');
      await writeSchedule(h.etc, insideNow());
      const r = await upgrade();
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/^error: installing gateway.17\.0\.2 failed: the gateway repository's metadata cannot be read \(.+\).*; 17\.0\.1 is still installed and the service was not restarted$/m);
      expect(r.stderr).toMatch(/^hint: The repository serves corrupt or incomplete metadata/m);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
      await unchanged();
    });

    it('hostile: repository metadata signed by another key than the one the entry names: GW_ERR_UPGRADE_REPO, nothing changed', async () => {
      await h.lab.resignWithOtherKey('stable/v17');
      await endpoint('stable/v17');
      await writeSchedule(h.etc, insideNow());
      const r = await upgrade();
      expect(r.status).toBe(1);
      expect(r.stderr).toMatch(/^error: installing gateway.17\.0\.2 failed: the gateway repository's signature does not verify with the key this host trusts for it \(.+\).*; 17\.0\.1 is still installed and the service was not restarted$/m);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
      await unchanged();
    });

    it('a new major version on stable/v17 is announced with the baseurl to write, in and out of the window; --update-repo moves and installs it', async () => {
      await endpoint('major');
      await writeSchedule(h.etc, later());
      const line = `baseurl=file://${h.lab.repo}/stable/v18`;
      const waiting = await upgrade();
      expect(waiting.status).toBe(0);
      expect(waiting.stdout).toContain('not upgrading: outside the maintenance window');
      expect(waiting.stderr).toContain(`warning: the target 18.0.0 is a new major version, and the repository ${h.lab.repoFile} is on stable/v17, which holds only v17; it must move to stable/v18 (or stable/rolling)`);
      expect(waiting.stderr).toContain(`${h.lab.repoFile} then reads: ${line}`);

      await writeSchedule(h.etc, insideNow());
      const refused = await upgrade();
      expect(refused.status).toBe(1);
      expect(refused.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
      expect(refused.stderr).toContain(`then reads: ${line}`);
      await unchanged();

      const moved = await upgrade('--update-repo');
      expect(moved.status, moved.stderr).toBe(0);
      expect(await readFile(h.lab.repoFile, 'utf8')).toBe(h.lab.repoText('stable/v18'));
      expect(await h.lab.query()).toBe('gateway-18.0.0-1.noarch');
    });

    it('stable/rolling holds every major: 17 -> 18 with no move and no announcement', async () => {
      await writeFile(h.lab.repoFile, h.lab.repoText('stable/rolling'));
      await endpoint('major');
      await writeSchedule(h.etc, insideNow());
      const r = await upgrade();
      expect(r.status, r.stderr).toBe(0);
      expect(r.stderr).not.toContain('new major version');
      expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 18.0.0');
      expect(await readFile(h.lab.repoFile, 'utf8')).toBe(h.lab.repoText('stable/rolling'));
      expect(await h.lab.query()).toBe('gateway-18.0.0-1.noarch');
    });
  });
}
