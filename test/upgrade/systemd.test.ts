/**
 * `gateway install systemd`: the units carry exactly the lines the seed requires (environment variables rule 5,
 * Limits, "Upgrader behaviour on Linux"), `systemd-analyze verify` (Debian's systemd package) accepts them, and the
 * reload command really delivers SIGHUP to the pid in the pid file.
 */
import { spawn, spawnSync } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agentUnit, systemdUnits, unitPaths, upgradeServiceUnit, upgradeTimerUnit } from '../../src/upgrade/systemd.js';
import { runCli } from '../helpers/gateway.js';

let dir: string;
let binDir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-systemd-'));
  // verify checks that ExecStart binaries exist and are executable: stand-ins under a --bin-dir of our own.
  binDir = join(dir, 'bin');
  await mkdir(binDir);
  for (const name of ['gateway', 'gateway-upgrade']) {
    await writeFile(join(binDir, name), '#!/bin/sh\nexit 0\n');
    await chmod(join(binDir, name), 0o755);
  }
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const lines = (text: string) => text.split('\n');

describe('the units', () => {
  it('gateway.service has exactly the settings of the seed', () => {
    const unit = lines(agentUnit());
    for (const line of [
      'EnvironmentFile=-/etc/default/gateway',
      'Restart=always',
      'RestartSec=5',
      'LimitNOFILE=524288',
      'PIDFile=/run/gateway.pid',
      'ExecStart=/usr/local/bin/gateway start -c /etc/gateway.yaml --pid-file=/run/gateway.pid',
      `ExecReload=/bin/sh -c 'kill -HUP "$$(cat /run/gateway.pid)"'`,
      'WantedBy=multi-user.target',
    ]) {
      expect(unit).toContain(line);
    }
    // Each setting once, in [Service].
    const service = unit.slice(unit.indexOf('[Service]'), unit.indexOf('[Install]'));
    for (const key of ['EnvironmentFile', 'Restart', 'RestartSec', 'LimitNOFILE', 'PIDFile', 'ExecStart', 'ExecReload']) {
      expect(service.filter((l) => l.startsWith(`${key}=`))).toHaveLength(1);
    }
  });

  it('gateway.service keeps sessions over a restart: KillMode=mixed, TimeoutStopSec from the drain limit, PIDFile followed', () => {
    // What systemd does with them cannot run here (no systemd as PID 1 in the test machine): systemd re-reads
    // PIDFile= when the main process exits (src/core/service.c, service_sigchld_event: "Forking services may
    // occasionally move to a new PID. As long as they update the PID file before exiting the old PID, they're
    // fine."), so the successor of a hand-over becomes the main process; docs/upgrades.md says so too.
    const unit = lines(agentUnit());
    expect(unit).toContain('KillMode=mixed');
    expect(unit).toContain('TimeoutStopSec=1860'); // 30 min of drain + 60 s
    expect(lines(agentUnit({ drainLimitMs: 5 * 60_000 }))).toContain('TimeoutStopSec=360');
    expect(() => agentUnit({ drainLimitMs: -1 })).toThrow(expect.objectContaining({ code: 'GW_ERR_USAGE' }));
    const service = unit.slice(unit.indexOf('[Service]'), unit.indexOf('[Install]'));
    for (const key of ['KillMode', 'TimeoutStopSec']) expect(service.filter((l) => l.startsWith(`${key}=`))).toHaveLength(1);
  });

  it('gateway install systemd --drain-limit sets TimeoutStopSec; a bad one is a usage error', async () => {
    const r = await runCli('gateway', ['install', 'systemd', '--unit', 'gateway.service', '--drain-limit', '2h']);
    expect(r.status, r.stderr).toBe(0);
    expect(lines(r.stdout)).toContain('TimeoutStopSec=7260');
    const bad = await runCli('gateway', ['install', 'systemd', '--drain-limit', 'forever']);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toContain('GW_ERR_USAGE');
  });

  it('gateway-upgrade.service runs `gateway-upgrade run` once, with the same environment file', () => {
    const unit = lines(upgradeServiceUnit());
    expect(unit).toContain('Type=oneshot');
    expect(unit).toContain('ExecStart=/usr/local/bin/gateway-upgrade run');
    expect(unit).toContain('EnvironmentFile=-/etc/default/gateway');
    expect(unit).not.toContain('[Install]'); // started by the timer, never enabled on its own
  });

  it('gateway-upgrade.timer starts it every 30 minutes and catches up after downtime', () => {
    const unit = lines(upgradeTimerUnit());
    expect(unit).toContain('OnCalendar=*:0/30');
    expect(unit).toContain('Persistent=true');
    expect(unit).toContain('Unit=gateway-upgrade.service');
    expect(unit).toContain('WantedBy=timers.target');
    expect(unit.some((l) => /^RandomizedDelaySec=\S+/.test(l))).toBe(true);
  });

  it('paths are configurable, and refused when systemd would need escaping', () => {
    const unit = agentUnit({ binDir: '/opt/gateway/bin/', configPath: '/srv/gw.yaml', pidFile: '/var/run/gw.pid', environmentFile: '/etc/sysconfig/gateway' });
    expect(lines(unit)).toContain('ExecStart=/opt/gateway/bin/gateway start -c /srv/gw.yaml --pid-file=/var/run/gw.pid');
    expect(lines(unit)).toContain('PIDFile=/var/run/gw.pid');
    expect(lines(unit)).toContain('EnvironmentFile=-/etc/sysconfig/gateway');
    expect(() => agentUnit({ configPath: 'relative.yaml' })).toThrow(expect.objectContaining({ code: 'GW_ERR_USAGE' }));
    expect(() => agentUnit({ binDir: '/opt/my dir' })).toThrow(expect.objectContaining({ code: 'GW_ERR_USAGE' }));
    expect(() => agentUnit({ pidFile: '/run/%n.pid' })).toThrow(expect.objectContaining({ code: 'GW_ERR_USAGE' }));
  });

  it('--output: a directory gets every unit; a file gets the first and the others go next to it', async () => {
    const units = systemdUnits();
    expect(unitPaths(join(dir, 'somewhere') + '/', units).map((t) => t.path)).toEqual(units.map((u) => join(dir, 'somewhere', u.name)));
    expect(unitPaths(join(dir, 'agent.service'), units).map((t) => t.path)).toEqual([
      join(dir, 'agent.service'),
      join(dir, 'gateway-upgrade.service'),
      join(dir, 'gateway-upgrade.timer'),
    ]);
  });
});

describe('gateway install systemd', () => {
  it('prints the three units, each under its path', async () => {
    const r = await runCli('gateway', ['install', 'systemd']);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('# /etc/systemd/system/gateway.service\n');
    expect(r.stdout).toContain('# /etc/systemd/system/gateway-upgrade.service\n');
    expect(r.stdout).toContain('# /etc/systemd/system/gateway-upgrade.timer\n');
    expect(r.stdout).toContain(agentUnit());
  });

  it('--unit prints one unit as it is, ready for a redirection', async () => {
    const r = await runCli('gateway', ['install', 'systemd', '--unit', 'gateway.service']);
    expect(r.status).toBe(0);
    expect(r.stdout).toBe(agentUnit());
    const bad = await runCli('gateway', ['install', 'systemd', '--unit', 'gateway.socket']);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toContain('GW_ERR_USAGE');
  });

  it('--output DIR writes the units (mode 0644) that systemd-analyze verify accepts', async () => {
    const out = join(dir, 'units');
    await mkdir(out);
    const r = await runCli('gateway', ['install', 'systemd', '--output', out, '--bin-dir', binDir]);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const files = ['gateway.service', 'gateway-upgrade.service', 'gateway-upgrade.timer'].map((n) => join(out, n));
    for (const f of files) {
      expect(r.stdout).toContain(`wrote ${f}`);
      expect((await stat(f)).mode & 0o777).toBe(0o644);
    }
    expect(await readFile(files[0]!, 'utf8')).toContain(`ExecStart=${binDir}/gateway start -c /etc/gateway.yaml --pid-file=/run/gateway.pid`);
    const verify = spawnSync('systemd-analyze', ['verify', '--man=no', ...files], { encoding: 'utf8' });
    expect(verify.stderr).toBe(''); // unknown keys and the like are warnings with status 0: none allowed either
    expect(verify.status).toBe(0);
  });

  it('systemd-analyze verify does check: a unit whose binary is missing is refused', async () => {
    const out = join(dir, 'missing-bin');
    const r = await runCli('gateway', ['install', 'systemd', '--output', `${out}/`, '--bin-dir', join(dir, 'no-such-dir')]);
    expect(r.status).toBe(0);
    const verify = spawnSync('systemd-analyze', ['verify', '--man=no', join(out, 'gateway.service')], { encoding: 'utf8' });
    expect(verify.status).not.toBe(0);
    expect(verify.stderr).toContain('is not executable');
  });

  it('refuses to replace existing units without --force, writing nothing', async () => {
    const out = join(dir, 'again');
    await mkdir(out);
    await writeFile(join(out, 'gateway-upgrade.timer'), 'mine\n');
    const r = await runCli('gateway', ['install', 'systemd', '--output', out]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_INSTALL_EXISTS');
    expect(r.stderr).toContain(join(out, 'gateway-upgrade.timer'));
    expect(existsSync(join(out, 'gateway.service'))).toBe(false);
    expect(await readFile(join(out, 'gateway-upgrade.timer'), 'utf8')).toBe('mine\n');
    const forced = await runCli('gateway', ['install', 'systemd', '--output', out, '--force']);
    expect(forced.status).toBe(0);
    expect(await readFile(join(out, 'gateway-upgrade.timer'), 'utf8')).toBe(upgradeTimerUnit());
  });

  it('--output FILE puts the agent unit there and the upgrader units beside it', async () => {
    const out = join(dir, 'file-out');
    await mkdir(out);
    const r = await runCli('gateway', ['install', 'systemd', '--output', join(out, 'gw-agent.service'), '--bin-dir', binDir]);
    expect(r.status).toBe(0);
    expect(await readFile(join(out, 'gw-agent.service'), 'utf8')).toBe(agentUnit({ binDir }));
    expect(existsSync(join(out, 'gateway-upgrade.service'))).toBe(true);
    expect(existsSync(join(out, 'gateway-upgrade.timer'))).toBe(true);
  });
});

describe('ExecReload', () => {
  it('sends SIGHUP to the pid written in the pid file (as systemd runs it: $$ is a literal $)', async () => {
    const pidFile = join(dir, 'reload.pid');
    const child = spawn(process.execPath, ['-e', "process.on('SIGHUP', () => { console.log('got SIGHUP'); process.exit(0); }); console.log('ready'); setInterval(() => {}, 1000);"], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    await new Promise<void>((resolve) => child.stdout!.on('data', (c: Buffer) => ((out += c.toString()), out.includes('ready') && resolve())));
    await writeFile(pidFile, `${child.pid}\n`);
    const line = lines(agentUnit({ pidFile })).find((l) => l.startsWith('ExecReload='))!;
    const m = /^ExecReload=\/bin\/sh -c '(.*)'$/.exec(line)!;
    const command = m[1]!.replaceAll('$$', '$');
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    const r = spawnSync('/bin/sh', ['-c', command], { encoding: 'utf8', env: { PATH: '/usr/bin:/bin' } }); // kill: the shell's builtin
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(await exited).toBe(0);
    expect(out).toContain('got SIGHUP');
  });
});
