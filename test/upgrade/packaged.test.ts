/**
 * The project's own packages (`npm run package`, built once by test/helpers/packages.ts and shared through its
 * cache) in real repositories: for apt, dnf and zypper, gateway and gateway-ent-updater N = 17.0.0-dev are installed
 * into a temporary root from the stable/v17 repository, then the INSTALLED `gateway-upgrade` (the updater package's
 * wrapper on the gateway package's Node.js runtime) moves the host to N+1 inside a maintenance window,
 * with the manager running for real, to N+1 = 17.0.1. Outside the window it leaves N. The installed `gateway --version` is the
 * version command and the health check; the operator's /etc/default/gateway (a configuration file) survives.
 *
 * The cheaper cases (rollback, hostile repositories, new major versions, rolling) run on fake packages in
 * apt.test.ts, dnf.test.ts and zypper.test.ts.
 */
import { spawn } from 'node:child_process';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { buildPackages, type BuiltPackages } from '../helpers/packages.js';
import { rootSuite } from '../helpers/root.js';
import { makeAptLab, makeRpmLab, writeScript, type TestPackage } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

// The versions test/package/build.test.ts and the tarball tests build too (one build each for all of them); N is a
// pre-release, so apt, dnf and zypper also order 17.0.0~dev before 17.0.1 as semver does.
const N = '17.0.0-dev';
const N1 = '17.0.1';
const UPDATER = 'gateway-ent-updater';
const HOUR = 3_600_000;
const OPERATOR_DEFAULTS = '# edited by the operator\nHTTPS_PROXY=http://proxy.internal:3128\n';

let built: { n: BuiltPackages; n1: BuiltPackages };
let gw: RunningGateway;
let endpoint: string;

beforeAll(async () => {
  // One build per version, shared with every other test file through the cache (a build in progress is waited for).
  built = { n: await buildPackages({ version: N }), n1: await buildPackages({ version: N1 }) };
  const port = await getPort({ host: '127.0.0.1' });
  gw = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      'auth_service:',
      '  cluster_name: packaged.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: 127.0.0.1:${port}`,
      '  automatic_upgrades_channels:',
      `    stable/v17: { static_version: v${N1} }`,
      '',
    ].join('\n'),
  );
  endpoint = `127.0.0.1:${port}/v1/webapi/automaticupgrades/channel/stable/v17\n`;
}, 900_000);

afterAll(async () => {
  await gw?.stop();
});

interface Installed {
  root: string;
  dir: string;
  env: Record<string, string>;
  cleanup(): Promise<void>;
}

function packagesOf(kind: 'debs' | 'rpms'): TestPackage[] {
  return [
    { version: N, files: [built.n[kind].gateway, built.n[kind][UPDATER]] },
    { version: N1, files: [built.n1[kind].gateway, built.n1[kind][UPDATER]] },
  ];
}

/** A root with N of gateway and gateway-ent-updater installed by `manager`, registered on stable/v17. */
async function installN(manager: 'apt' | 'dnf' | 'zypper'): Promise<Installed> {
  let root: string;
  let dir: string;
  let env: Record<string, string>;
  let cleanup: () => Promise<void>;
  if (manager === 'apt') {
    const lab = await makeAptLab(packagesOf('debs'));
    await lab.install(N, ['gateway', UPDATER]);
    await writeFile(join(lab.root, 'etc/apt/sources.list.d/gateway.list'), lab.sourceLine('stable/v17'));
    ({ root, dir, cleanup } = lab);
    env = { ...lab.env };
  } else {
    const lab = await makeRpmLab(manager, packagesOf('rpms'));
    await lab.install(N, ['gateway', UPDATER]);
    ({ root, dir, cleanup } = lab);
    env = { ...lab.env, GATEWAY_UPGRADE_PM_ARGS: lab.pmArgs.join(' ') };
  }
  const etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(etc, { recursive: true });
  await writeFile(join(etc, 'endpoint'), endpoint);
  await writeFile(join(root, 'etc/default/gateway'), OPERATOR_DEFAULTS);
  const gateway = join(root, 'usr/bin/gateway');
  const restart = await writeScript(join(dir, 'restart.sh'), `echo "restart $(${gateway} --version)" >> ${join(dir, 'restarts.log')}`);
  env = {
    ...env,
    PATH: process.env.PATH ?? '',
    GATEWAY_UPGRADE_ROOT: root,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: manager,
    GATEWAY_UPGRADE_CA_FILE: join(gw.dataDir, 'admin', 'host-ca.pem'),
    GATEWAY_UPGRADE_VERSION_COMMAND: `${gateway} --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: `${gateway} --version`,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: '30s',
  };
  return { root, dir, env, cleanup };
}

/** Runs a program installed in the root (its wrapper finds the packaged Node.js next to itself). */
function runInstalled(root: string, command: string, args: string[], env: Record<string, string> = {}): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(join(root, 'usr/bin', command), args, { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 300_000);
    child.once('error', reject);
    child.once('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

function managerSuite(manager: 'apt' | 'dnf' | 'zypper', suite: (name: string, fn: () => void) => void): void {
  suite(`the packages in a real ${manager} repository`, () => {
    let host: Installed;
    beforeAll(async () => {
      host = await installN(manager);
    }, 600_000);
    afterAll(async () => {
      await host?.cleanup();
    });

    it(`${manager} installed N: the packaged gateway runs on its own Node.js and says ${N}`, async () => {
      const v = await runInstalled(host.root, 'gateway', ['--version']);
      expect(v.status, v.stderr).toBe(0);
      expect(v.stdout).toContain(N);
    });

    it('outside the maintenance window the installed gateway-upgrade leaves N', async () => {
      await writeSchedule(join(host.root, 'etc/gateway-upgrade.d'), [{ start: new Date(Date.now() + 5 * HOUR), stop: new Date(Date.now() + 6 * HOUR) }]);
      const r = await runInstalled(host.root, 'gateway-upgrade', ['run'], host.env);
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toContain(`an upgrade is available (${N} -> ${N1})`);
      expect(r.stdout).toContain('not upgrading: outside the maintenance window');
      expect((await runInstalled(host.root, 'gateway', ['--version'])).stdout).toContain(N);
    });

    it(`inside the window the installed gateway-upgrade moves N -> N+1 with ${manager}; the operator's /etc/default/gateway stays`, async () => {
      await writeSchedule(join(host.root, 'etc/gateway-upgrade.d'), [{ start: new Date(Date.now() - 10 * 60_000), stop: new Date(Date.now() + 50 * 60_000) }]);
      const r = await runInstalled(host.root, 'gateway-upgrade', ['run'], host.env);
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toContain(`upgraded gateway ${N} -> ${N1}; the service is running ${N1}`);
      const v = await runInstalled(host.root, 'gateway', ['--version']);
      expect(v.stdout).toContain(N1);
      expect(await readFile(join(host.dir, 'restarts.log'), 'utf8')).toContain(N1);
      expect(await readFile(join(host.root, 'etc/default/gateway'), 'utf8')).toBe(OPERATOR_DEFAULTS);
      const again = await runInstalled(host.root, 'gateway-upgrade', ['run'], host.env);
      expect(again.stdout).toBe(`no upgrades available (${N1} == ${N1})\n`);
      await rm(join(host.dir, 'restarts.log'), { force: true });
    }, 300_000);
  });
}

managerSuite('apt', describe);
managerSuite('dnf', rootSuite(['chroot']));
managerSuite('zypper', rootSuite(['chroot']));
