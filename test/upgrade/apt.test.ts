/**
 * gateway-upgrade run on a test machine with a real apt repository: the built CLI, the real daemon as the
 * version server, apt-get and dpkg installing .deb packages of a fake gateway into a temporary root
 * (test/upgrade/helpers.ts). The service restart and health check are scripts that record what happened.
 *
 * Versions: N = 17.0.1 (installed before each test), N+1 = 17.0.2, a broken 17.0.3 (its health check fails),
 * 18.0.0 on the stable/v18 and stable/rolling channels only, and 17.0.9 which the repository does not have.
 * The repository is signed (InRelease) and the source line names its key with signed-by, as the install guide's.
 * Hostile: a tampered package, a corrupt index, an InRelease signed by another key, a missing version: each a
 * GW_ERR_UPGRADE_* and nothing changed.
 */
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import getPort from 'get-port';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { startScheduleExport, writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startHttpServer, startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { AUTOUPDATE_AGENT_PATH } from '../../src/wire/autoupdate.js';
import { makeAptLab, writeScript, type AptLab } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

let lab: AptLab;
let gw: RunningGateway;
let upstream: HttpTestServer;
let web: string;
let etc: string;
let restartLog: string;
let env: Record<string, string>;

const HOUR = 3_600_000;
const insideNow = () => [{ start: new Date(Date.now() - 10 * 60_000), stop: new Date(Date.now() + 50 * 60_000) }];
const later = () => [{ start: new Date(Date.now() + 5 * HOUR), stop: new Date(Date.now() + 6 * HOUR) }];

beforeAll(async () => {
  lab = await makeAptLab([
    { version: '17.0.1' },
    { version: '17.0.2' },
    { version: '17.0.3', healthy: false },
    { version: '18.0.0' },
  ]);
  // An upstream version server for a forward_url channel whose release is critical.
  upstream = await startHttpServer((req, res) => {
    const answers: Record<string, string> = { '/crit/version': 'v17.0.2', '/crit/critical': 'yes' };
    const body = answers[req.url ?? ''];
    res.writeHead(body ? 200 : 404, { 'content-type': 'text/plain' });
    res.end(body ?? 'not found');
  });
  const port = await getPort({ host: '127.0.0.1' });
  gw = await startGateway(
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
      '  automatic_upgrades_channels:',
      '    stable/v17: { static_version: v17.0.2 }',
      '    broken: { static_version: v17.0.3 }',
      '    missing: { static_version: v17.0.9 }',
      '    major: { static_version: v18.0.0 }',
      `    urgent: { forward_url: "${upstream.url}/crit" }`,
      '',
    ].join('\n'),
  );
  web = `127.0.0.1:${port}`;
  etc = join(lab.root, 'etc/gateway-upgrade.d');
  await mkdir(etc, { recursive: true });
  restartLog = join(lab.dir, 'restarts.log');
  const restart = await writeScript(join(lab.dir, 'restart.sh'), `echo "restart $(${lab.binary} --version)" >> ${restartLog}`);
  env = {
    ...lab.env,
    GATEWAY_UPGRADE_ROOT: lab.root,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: 'apt',
    GATEWAY_UPGRADE_CA_FILE: join(gw.dataDir, 'admin', 'host-ca.pem'),
    GATEWAY_UPGRADE_VERSION_COMMAND: `${lab.binary} --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: `${lab.binary} health`,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: '2s',
    GATEWAY_UPGRADE_HEALTH_POLL: '100ms',
  };
}, 120_000);

afterAll(async () => {
  await gw?.stop();
  await upstream?.close();
  await lab?.cleanup();
});

beforeEach(async () => {
  await lab.restore();
  await lab.install('17.0.1');
  await writeFile(join(lab.root, 'etc/apt/sources.list.d/gateway.list'), lab.sourceLine('stable/v17'));
  await rm(restartLog, { force: true });
  await rm(join(etc, 'schedule'), { force: true });
}, 60_000);

async function endpoint(channel: string): Promise<void> {
  await writeFile(join(etc, 'endpoint'), `${web}/v1/webapi/automaticupgrades/channel/${channel}\n`);
}

async function restarts(): Promise<string[]> {
  const text = await readFile(restartLog, 'utf8').catch(() => '');
  return text.split('\n').filter(Boolean);
}

const upgrade = (...args: string[]) => runCli('gateway-upgrade', ['run', ...args], { env, timeoutMs: 90_000 });

describe('gateway-upgrade run with apt', () => {
  it('outside the maintenance window: reports the upgrade and leaves N installed (schedule exported by the agent code)', async () => {
    await endpoint('stable/v17');
    // The agent's export: a window 12 hours from now, every day.
    const hour = (new Date().getUTCHours() + 12) % 24;
    const exp = startScheduleExport({
      fetchConfig: async () => ({ kind: 'cluster_maintenance_config', version: 'v1', metadata: { name: 'cluster-maintenance-config' }, spec: { agent_upgrades: { utc_start_hour: hour, weekdays: ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'] } } }) as never,
      dir: etc,
      uid: 0,
      intervalMs: HOUR,
    });
    await exp.ready;
    exp.stop();
    const r = await upgrade();
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const lines = r.stdout.split('\n');
    expect(lines[0]).toBe('an upgrade is available (17.0.1 -> 17.0.2)');
    expect(lines[1]).toMatch(new RegExp(`^not upgrading: outside the maintenance window; the next starts at \\d{4}-\\d\\d-\\d\\dT${String(hour).padStart(2, '0')}:00:00Z \\(in \\d+h \\d+m\\); critical releases go at once$`));
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual([]);
  });

  it('inside the window: N -> N+1 through apt-get, restarts the service, checks it came back; then nothing to do', async () => {
    await endpoint('stable/v17');
    await writeSchedule(etc, insideNow());
    const r = await upgrade();
    expect(r.status, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe('an upgrade is available (17.0.1 -> 17.0.2)');
    expect(lines[1]).toMatch(/^upgrading: inside the maintenance window \(until .*Z\)$/);
    expect(lines[2]).toBe('installing apt (gateway=17.0.2)');
    expect(lines.at(-1)).toBe('upgraded gateway 17.0.1 -> 17.0.2; the service is running 17.0.2');
    expect(r.stderr).toContain('+ apt-get install -y --allow-downgrades');
    expect(r.stderr).toContain('Unpacking gateway (17.0.2) over (17.0.1)');
    expect(await lab.installed()).toBe('Gateway v17.0.2 git:test');
    expect(await restarts()).toEqual(['restart Gateway v17.0.2 git:test']);

    const again = await upgrade();
    expect(again.status).toBe(0);
    expect(again.stdout).toBe('no upgrades available (17.0.2 == 17.0.2)\n');
  });

  it('a critical release goes at once, outside any window', async () => {
    await endpoint('urgent');
    await writeSchedule(etc, later());
    const r = await upgrade();
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('upgrading now: 17.0.2 is a critical release, which does not wait for a maintenance window');
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2');
    expect(await lab.installed()).toBe('Gateway v17.0.2 git:test');
  });

  it('no schedule yet: the invalid-schedule warning, and only critical releases go', async () => {
    await endpoint('stable/v17');
    const r = await upgrade();
    expect(r.status).toBe(0);
    expect(r.stderr).toContain(`warning: invalid upgrade schedule: ${join(etc, 'schedule')} does not exist. This is expected right after install`);
    expect(r.stdout).toContain('not upgrading: outside the maintenance window; critical releases go at once');
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
  });

  it('a build that does not come back is rolled back: N stays running, and the error says what failed', async () => {
    await endpoint('broken');
    await writeSchedule(etc, insideNow());
    const r = await upgrade();
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
    expect(r.stderr).toMatch(/error: the upgrade 17\.0\.1 -> 17\.0\.3 failed: the service did not come back with 17\.0\.3 within 2 s: the health check `.*health` failed \(exit status 1\): gateway 17\.0\.3: broken build, the service does not start; the previous version 17\.0\.1 was put back and is running/);
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual(['restart Gateway v17.0.3 git:test', 'restart Gateway v17.0.1 git:test']);
  });

  it('a version the repository does not have: the install fails, N stays, no restart', async () => {
    await endpoint('missing');
    await writeSchedule(etc, insideNow());
    const r = await upgrade();
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_INSTALL');
    expect(r.stderr).toMatch(/^error: installing gateway=17\.0\.9 failed: the gateway repository has no gateway=17\.0\.9 \(apt: E: Version '17\.0\.9' for 'gateway' was not found\) \[`apt-get install` exit status 100\]; 17\.0\.1 is still installed and the service was not restarted$/m);
    expect(r.stderr).toMatch(/^hint: The version server's channel names a version the repository does not hold/m);
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual([]);
  });

  it('a new major version: says the repository must move, moves only when told to, then installs it', async () => {
    await endpoint('major');
    await writeSchedule(etc, insideNow());
    const list = join(lab.root, 'etc/apt/sources.list.d/gateway.list');
    const dry = await runCli('gateway-upgrade', ['dry-run'], { env });
    expect(dry.stdout.split('\n')[0]).toBe('an upgrade is available (17.0.1 -> 18.0.0)');
    expect(dry.stderr).toContain(`it must move to stable/v18 (or stable/rolling)`);

    const refused = await upgrade();
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain(`error: the target 18.0.0 is a new major version, and the repository ${list} is on stable/v17, which holds only v17; it must move to stable/v18 (or stable/rolling) before this host can upgrade`);
    expect(refused.stderr).toContain(`hint: Run 'gateway-upgrade repo set-channel stable/v18' (or stable/rolling), or 'gateway-upgrade run --update-repo' to move it and upgrade; ${list} then reads: ${lab.sourceLine('stable/v18').trim()}.`);
    expect(refused.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
    expect(await readFile(list, 'utf8')).toBe(lab.sourceLine('stable/v17'));
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');

    const show = await runCli('gateway-upgrade', ['repo', 'show'], { env });
    expect(show.stdout).toBe(`${list}: channel stable/v17\n`);
    const moved = await runCli('gateway-upgrade', ['repo', 'set-channel', 'stable/v18'], { env });
    expect(moved.stdout).toBe(`${list}: channel stable/v17 -> stable/v18\n`);
    expect(await readFile(list, 'utf8')).toBe(lab.sourceLine('stable/v18'));

    const r = await upgrade();
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 18.0.0');
    expect(await lab.installed()).toBe('Gateway v18.0.0 git:test');
  });

  it('a new major version is announced while waiting for the window too, with the line to write: never silent', async () => {
    await endpoint('major');
    await writeSchedule(etc, later());
    const list = join(lab.root, 'etc/apt/sources.list.d/gateway.list');
    const r = await upgrade();
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('not upgrading: outside the maintenance window');
    expect(r.stderr).toContain(`warning: the target 18.0.0 is a new major version, and the repository ${list} is on stable/v17, which holds only v17; it must move to stable/v18 (or stable/rolling) before this host can upgrade`);
    expect(r.stderr).toContain(`${list} then reads: ${lab.sourceLine('stable/v18').trim()}`);
    expect(await readFile(list, 'utf8')).toBe(lab.sourceLine('stable/v17'));
  });

  it('stable/rolling holds every major: 17 -> 18 with no move and no announcement', async () => {
    const list = join(lab.root, 'etc/apt/sources.list.d/gateway.list');
    await writeFile(list, lab.sourceLine('stable/rolling'));
    await endpoint('major');
    await writeSchedule(etc, insideNow());
    const r = await upgrade();
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).not.toContain('new major version');
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 18.0.0');
    expect(await readFile(list, 'utf8')).toBe(lab.sourceLine('stable/rolling'));
    expect(await lab.installed()).toBe('Gateway v18.0.0 git:test');
  });

  it("hostile: a package whose checksum does not match the Packages index: GW_ERR_UPGRADE_CHECKSUM, nothing changed", async () => {
    await lab.tamperPackage('stable/v17', '17.0.2');
    await endpoint('stable/v17');
    await writeSchedule(etc, insideNow());
    const r = await upgrade();
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^error: installing gateway=17\.0\.2 failed: the package gateway=17\.0\.2 does not match the checksum the repository's metadata gives for it \(apt: .*Hash Sum mismatch.*\) \[`apt-get install` exit status 100\]; 17\.0\.1 is still installed and the service was not restarted$/m);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_CHECKSUM');
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual([]);
  });

  it('hostile: a Packages index that does not match the Release file: GW_ERR_UPGRADE_REPO, nothing changed', async () => {
    await lab.corruptMetadata('stable/v17');
    await endpoint('stable/v17');
    await writeSchedule(etc, insideNow());
    const r = await upgrade();
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^error: installing gateway=17\.0\.2 failed: the gateway repository's metadata cannot be read \(apt: .+\) \[`apt-get update` exit status 100\]; 17\.0\.1 is still installed and the service was not restarted$/m);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual([]);
  });

  it("hostile: an InRelease signed by another key than the one signed-by names (apt only warns and keeps the old index): GW_ERR_UPGRADE_REPO, nothing changed", async () => {
    await lab.resignWithOtherKey();
    await endpoint('stable/v17');
    await writeSchedule(etc, insideNow());
    const r = await upgrade();
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/^error: installing gateway=17\.0\.2 failed: the gateway repository's signature does not verify with the key this host trusts for it \(apt: .*NO_PUBKEY [0-9A-F]{16}\) \[`apt-get` warned\]; 17\.0\.1 is still installed and the service was not restarted$/m);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual([]);
  });

  it('run --update-repo moves the repository and upgrades in one go', async () => {
    await endpoint('major');
    await writeSchedule(etc, insideNow());
    const r = await upgrade('--update-repo');
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain(`moved the repository ${join(lab.root, 'etc/apt/sources.list.d/gateway.list')} from stable/v17 to stable/v18`);
    expect(await lab.installed()).toBe('Gateway v18.0.0 git:test');
  });

  it('two upgraders never run at once', async () => {
    await endpoint('stable/v17');
    await writeSchedule(etc, insideNow());
    const holder = spawn('sleep', ['30']);
    try {
      await mkdir(join(lab.root, 'run'), { recursive: true });
      await writeFile(join(lab.root, 'run/gateway-upgrade.lock'), `${holder.pid}\n`);
      const r = await upgrade();
      expect(r.status).toBe(1);
      expect(r.stderr).toContain(`error: another gateway-upgrade (pid ${holder.pid}) is running: it holds ${join(lab.root, 'run/gateway-upgrade.lock')}`);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_LOCKED');
      expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    } finally {
      holder.kill();
      await rm(join(lab.root, 'run/gateway-upgrade.lock'), { force: true });
    }
  });

  it('a repository that is not registered is refused with the command that registers it', async () => {
    await endpoint('stable/v17');
    await writeSchedule(etc, insideNow());
    await rm(join(lab.root, 'etc/apt/sources.list.d/gateway.list'));
    const r = await upgrade();
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('is not registered');
    expect(r.stderr).toContain("gateway-upgrade repo set-channel stable/v17");
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
  });
});


/**
 * Under a managed rollout (docs/upgrades.md, "Managed rollouts: the agent's side"): a small HTTPS Proxy of the
 * test answers the instruction, apt installs. The per-major repository rule holds as for a channel's target, and a
 * rollback is apt's downgrade; the window is closed throughout.
 */
describe('gateway-upgrade run with apt, told by a managed rollout', () => {
  let pki: TestPki;
  let proxy: HttpTestServer;
  let instruction: Record<string, unknown>;
  let managedEnv: Record<string, string>;
  const identity = () => join(lab.root, 'var/lib/gateway/host/identity.json');

  beforeAll(async () => {
    pki = await makeTestPki();
    const cert = await pki.serverCert({ names: ['proxy.gw.test'], ips: ['127.0.0.1'] });
    proxy = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      const ours = (req.url ?? '').startsWith(AUTOUPDATE_AGENT_PATH);
      res.writeHead(ours ? 200 : 404, { 'content-type': 'application/json' });
      res.end(JSON.stringify(ours ? instruction : {}));
    });
    managedEnv = { ...env, GATEWAY_UPGRADE_CA_FILE: `${env.GATEWAY_UPGRADE_CA_FILE}:${pki.caCertPath}` };
  });
  afterAll(async () => {
    await proxy?.close();
    await pki?.cleanup();
  });
  beforeEach(async () => {
    await mkdir(join(lab.root, 'var/lib/gateway/host'), { recursive: true });
    await writeFile(identity(), JSON.stringify({ hostId: '5b0c1d2e-0000-4000-8000-00000000a002' }));
    await writeFile(join(etc, 'endpoint'), `127.0.0.1:${proxy.port}/v1/webapi/automaticupgrades/channel/stable/v17\n`);
    await writeSchedule(etc, later());
  });
  // The other tests' host has no identity: the instruction is not asked there.
  afterEach(async () => rm(identity(), { force: true }));

  it('a new major version on a per-major repository is refused the same way, and moves only with --update-repo', async () => {
    instruction = { managed: true, version: '18.0.0', update: true, reason: 'group dev upgrades', group: 'dev', rollout_id: 'r-18' };
    const refused = await runCli('gateway-upgrade', ['run'], { env: managedEnv, timeoutMs: 90_000 });
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain('code: GW_ERR_UPGRADE_REPO');
    expect(refused.stderr).toContain('it must move to stable/v18 (or stable/rolling)');
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual([]);
    const moved = await runCli('gateway-upgrade', ['run', '--update-repo'], { env: managedEnv, timeoutMs: 90_000 });
    expect(moved.status, moved.stderr).toBe(0);
    expect(await lab.installed()).toBe('Gateway v18.0.0 git:test');
  });

  it("a rollback is apt's downgrade, outside any window, with the same restart and health check", async () => {
    await lab.install('17.0.2');
    instruction = { managed: true, version: '17.0.1', update: true, reason: 'rollback of group dev to 17.0.1', group: 'dev', rollout_id: 'r-back' };
    const r = await runCli('gateway-upgrade', ['run'], { env: managedEnv, timeoutMs: 90_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('the rollout moves this host back (17.0.2 -> 17.0.1)');
    expect(await lab.installed()).toBe('Gateway v17.0.1 git:test');
    expect(await restarts()).toEqual(['restart Gateway v17.0.1 git:test']);
  });
});
