/**
 * Command lines of every package manager (their exact argv; apt, dnf and zypper also run for real in apt.test.ts,
 * dnf.test.ts and zypper.test.ts, yum only here: Debian has none), the causes read from their failures, version
 * spelling, repository entries and channel moves, cluster enrollment, the lock.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isGatewayError } from '../../src/errors.js';
import { checkClusterVersion } from '../../src/upgrade/enrollment.js';
import { acquireLock } from '../../src/upgrade/lock.js';
import { explainFailure, installCommands, installStep, packageSpec, packageVersion } from '../../src/upgrade/packages.js';
import { channelHolds, movedLine, parseAptList, parseRpmRepo, readRepo, setAptChannel, setChannel, setRpmChannel } from '../../src/upgrade/repo.js';
import { pmArgs, resolveSettings, tarballArch } from '../../src/upgrade/settings.js';
import { parseSha256File, tarballName } from '../../src/upgrade/tarball.js';
import { versionInOutput } from '../../src/upgrade/client.js';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-pkgs-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('version spelling', () => {
  it.each([
    ['17.0.2', '17.0.2'],
    ['v17.0.2', '17.0.2'],
    ['17.1.0-rc.1', '17.1.0~rc.1'],
    ['17.0.0-dev', '17.0.0~dev'],
    ['17.0.2+build.5', '17.0.2'],
  ])('%s is packaged as %s', (v, want) => expect(packageVersion(v)).toBe(want));

  it('each manager spells "this package at this version" its own way', () => {
    expect(packageSpec('apt', 'gateway', '17.0.2')).toBe('gateway=17.0.2');
    expect(packageSpec('yum', 'gateway', '17.0.2')).toBe('gateway-17.0.2');
    expect(packageSpec('dnf', 'gateway-ent-fips', '17.1.0-rc.1')).toBe('gateway-ent-fips-17.1.0~rc.1');
    expect(packageSpec('zypper', 'gateway', '17.0.2')).toBe('gateway=17.0.2');
  });
});

describe('install command lines', () => {
  it('apt: refresh only the gateway list, then install exactly the version, downgrades allowed, no questions', () => {
    expect(installCommands('apt', { pkg: 'gateway', version: '17.0.2', downgrade: false, aptSourceList: '/etc/apt/sources.list.d/gateway.list' })).toEqual([
      ['apt-get', 'update', '-o', 'Dir::Etc::SourceList=/etc/apt/sources.list.d/gateway.list', '-o', 'Dir::Etc::SourceParts=-', '-o', 'APT::Get::List-Cleanup=0'],
      ['apt-get', 'install', '-y', '--allow-downgrades', '--no-install-recommends', '-o', 'Dpkg::Options::=--force-confdef', '-o', 'Dpkg::Options::=--force-confold', 'gateway=17.0.2'],
    ]);
  });
  it('yum: expire the gateway repo cache, then install (or downgrade) from it alone', () => {
    expect(installCommands('yum', { pkg: 'gateway', version: '17.0.2', downgrade: false })).toEqual([
      ['yum', 'clean', 'expire-cache', '--disablerepo=*', '--enablerepo=gateway'],
      ['yum', 'install', '-y', '--disablerepo=*', '--enablerepo=gateway', 'gateway-17.0.2'],
    ]);
    expect(installCommands('yum', { pkg: 'gateway-ent-fips', version: '17.0.1', downgrade: true, repoId: 'gw' })[1]).toEqual([
      'yum', 'downgrade', '-y', '--disablerepo=*', '--enablerepo=gw', 'gateway-ent-fips-17.0.1',
    ]);
  });
  it('dnf: one command with --refresh', () => {
    expect(installCommands('dnf', { pkg: 'gateway', version: '17.1.0-rc.1', downgrade: false })).toEqual([
      ['dnf', 'install', '-y', '--refresh', '--disablerepo=*', '--enablerepo=gateway', 'gateway-17.1.0~rc.1'],
    ]);
    expect(installCommands('dnf', { pkg: 'gateway', version: '17.0.1', downgrade: true })[0]![1]).toBe('downgrade');
  });
  it('zypper: refresh the repo, then install from it with --oldpackage (downgrades too)', () => {
    expect(installCommands('zypper', { pkg: 'gateway', version: '17.0.2', downgrade: false })).toEqual([
      ['zypper', '--non-interactive', 'refresh', 'gateway'],
      ['zypper', '--non-interactive', 'install', '--oldpackage', '--from', 'gateway', 'gateway=17.0.2'],
    ]);
  });
});

describe('an alternate root for the package manager (GATEWAY_UPGRADE_PM_ARGS)', () => {
  it('goes right after the program name in every command', () => {
    const args = pmArgs('--root /srv/host');
    expect(installCommands('zypper', { pkg: 'gateway', version: '17.0.2', downgrade: false, args })).toEqual([
      ['zypper', '--root', '/srv/host', '--non-interactive', 'refresh', 'gateway'],
      ['zypper', '--root', '/srv/host', '--non-interactive', 'install', '--oldpackage', '--from', 'gateway', 'gateway=17.0.2'],
    ]);
    expect(installCommands('dnf', { pkg: 'gateway', version: '17.0.2', downgrade: false, args: pmArgs(' --installroot=/srv/h  --releasever=9 ') })[0]!.slice(0, 4)).toEqual([
      'dnf', '--installroot=/srv/h', '--releasever=9', 'install',
    ]);
    expect(resolveSettings({}).pmArgs).toEqual([]);
    expect(resolveSettings({ GATEWAY_UPGRADE_PM_ARGS: '--root /r' }).pmArgs).toEqual(['--root', '/r']);
  });
  it('a bad GATEWAY_UPGRADE_* variable is named with what it takes (not "--help": it is no flag); set as the hint says, it is taken', () => {
    for (const [name, bad] of [['GATEWAY_UPGRADE_FIPS', 'maybe'], ['GATEWAY_UPGRADE_BIN_DIR', 'usr/local/bin'], ['GATEWAY_UPGRADE_SERVICE', 'my agent']] as const) {
      let hint = '';
      try {
        resolveSettings({ [name]: bad });
      } catch (err) {
        hint = (err as { hint?: string }).hint ?? '';
      }
      expect(hint, name).toMatch(new RegExp(`^Set ${name} to `));
      expect(hint, name).not.toContain('--help');
    }
    expect(resolveSettings({ GATEWAY_UPGRADE_FIPS: 'yes' }).fips).toBe(true);
    expect(resolveSettings({ GATEWAY_UPGRADE_BIN_DIR: '/usr/local/bin' }).binDir).toBe('/usr/local/bin');
    expect(resolveSettings({ GATEWAY_UPGRADE_SERVICE: 'gateway-agent.service' }).service).toBe('gateway-agent.service');
  });
  it('hostile: quotes are refused rather than split in the wrong place', () => {
    expect(() => pmArgs('--root "/srv/my root"')).toThrow(/quotes and backslashes are not understood/);
    expect(() => pmArgs("--root '/x'")).toThrow(/GATEWAY_UPGRADE_PM_ARGS/);
  });
});

describe("why a package manager failed, in the managers' own words", () => {
  const cases: [string, Parameters<typeof explainFailure>[0], 'refresh' | 'install', string, string | undefined][] = [
    ['apt: a corrupt index', 'apt', 'refresh', 'E: Failed to fetch file:/r/dists/bookworm/stable/v17/binary-amd64/Packages  Hash Sum mismatch', 'GW_ERR_UPGRADE_REPO'],
    ['apt: a tampered package', 'apt', 'install', 'E: Failed to fetch file:/r/pool/gateway_17.0.2_all.deb  Hash Sum mismatch', 'GW_ERR_UPGRADE_CHECKSUM'],
    ['apt: a missing version', 'apt', 'install', "E: Version '17.0.9' for 'gateway' was not found", 'GW_ERR_UPGRADE_INSTALL'],
    ['dnf: repomd.xml', 'dnf', 'install', "Error: Failed to download metadata for repo 'gateway': repomd.xml parser error\nError: Unable to find a match: gateway-17.0.2", 'GW_ERR_UPGRADE_REPO'],
    ['dnf: a tampered package', 'dnf', 'install', 'Package "gateway-17.0.2-1.noarch" from local repository "gateway" has incorrect checksum', 'GW_ERR_UPGRADE_CHECKSUM'],
    ['dnf: a missing version', 'dnf', 'install', 'No match for argument: gateway-17.0.9\nError: Unable to find a match: gateway-17.0.9', 'GW_ERR_UPGRADE_INSTALL'],
    ['zypper: invalid metadata', 'zypper', 'refresh', "Repository 'Gateway' is invalid.\nValid metadata not found at specified URL", 'GW_ERR_UPGRADE_REPO'],
    ['zypper: a tampered package', 'zypper', 'install', "Warning: Digest verification failed for file 'gateway-17.0.2-1.noarch.rpm'", 'GW_ERR_UPGRADE_CHECKSUM'],
    ['zypper: a missing version', 'zypper', 'install', "No provider of 'gateway=17.0.9' found.", 'GW_ERR_UPGRADE_INSTALL'],
    ['apt: signed by another key', 'apt', 'refresh', "W: GPG error: file:/r bookworm InRelease: The following signatures couldn't be verified because the public key is not available: NO_PUBKEY 0123456789ABCDEF\nE: The repository 'file:/r bookworm InRelease' is not signed.", 'GW_ERR_UPGRADE_REPO'],
    ['dnf: repomd.xml signed by another key', 'dnf', 'install', "Error: Failed to download metadata for repo 'gateway': repomd.xml GPG signature verification error: Bad GPG signature", 'GW_ERR_UPGRADE_REPO'],
    ['anything else is quoted as it is', 'apt', 'install', 'E: You don\'t have enough free space in /var/cache/apt/archives/.', undefined],
  ];
  it.each(cases)('%s', (_name, pm, step, output, code) => {
    const cause = explainFailure(pm, step, 'gateway-17.0.2', output);
    expect(cause?.code).toBe(code);
    if (cause) expect(cause.reason).toContain(`(${pm}: `);
    if (/GPG|NO_PUBKEY/.test(output)) expect(cause?.reason).toContain('signature does not verify');
  });
  it('which step a command is', () => {
    expect(installStep(['apt-get', 'update'])).toBe('refresh');
    expect(installStep(['zypper', '--root', '/r', '--non-interactive', 'refresh', 'gateway'])).toBe('refresh');
    expect(installStep(['dnf', 'install', '-y', '--refresh', 'gateway-17.0.2'])).toBe('install');
  });
});

describe('tarballs', () => {
  it('names', () => {
    expect(tarballName('17.0.2', 'amd64', false)).toBe('gateway-ent-v17.0.2-linux-amd64-bin.tar.gz');
    expect(tarballName('v17.0.2', 'arm64', true)).toBe('gateway-ent-v17.0.2-linux-arm64-fips-bin.tar.gz');
    expect(tarballName('17.0.2', 'arm', false)).toBe('gateway-ent-v17.0.2-linux-arm-bin.tar.gz');
  });
  it('machine architectures', () => {
    expect(resolveSettings({ GATEWAY_UPGRADE_ARCH: 'x64' }).arch).toBe('x64');
    expect(tarballArch('x64')).toBe('amd64');
    expect(tarballArch('aarch64')).toBe('arm64');
    expect(tarballArch('arm')).toBe('arm');
    expect(() => tarballArch('s390x')).toThrow(/s390x/);
  });
  it('.sha256 files as sha256sum writes them, or the bare digest', () => {
    const h = 'a'.repeat(64);
    expect(parseSha256File(`${h}  gateway-ent-v17.0.2-linux-amd64-bin.tar.gz\n`, 'u')).toBe(h);
    expect(parseSha256File(`${h.toUpperCase()}\n`, 'u')).toBe(h);
    expect(() => parseSha256File('<html>not found</html>', 'https://x/y.sha256')).toThrow(/not a SHA-256 checksum file/);
  });
});

describe('installed version from a command output', () => {
  it.each([
    ['17.0.0-dev\n', '17.0.0-dev'],
    ['Gateway v17.0.2 git:abc go1.22\n', '17.0.2'],
    ['Gateway Enterprise v14.3.7 git:v14.3.7-0 go1.21.6 X:boringcrypto\n', '14.3.7'],
    ['no version here', undefined],
  ])('%j → %s', (out, v) => expect(versionInOutput(out)).toBe(v));
});

describe('repository entries', () => {
  const apt = 'deb [signed-by=/usr/share/keyrings/gateway-archive-keyring.asc arch=amd64] https://apt.gateway.example/debian bookworm stable/v17\n';
  const rpm = '[gateway]\nname=Gateway\nbaseurl=https://yum.gateway.example/rhel/9/Gateway/$basearch/stable/v17\nenabled=1\n';

  it('reads the channel', () => {
    expect(parseAptList(apt)).toBe('stable/v17');
    expect(parseAptList('# comment\ndeb [trusted=yes] file:/srv/repo bookworm stable/rolling\n')).toBe('stable/rolling');
    expect(parseRpmRepo(rpm)).toEqual({ repoId: 'gateway', channel: 'stable/v17' });
  });
  it('moves the channel, keeping the rest', () => {
    expect(setAptChannel(apt, 'stable/v18')).toBe(apt.replace('stable/v17', 'stable/v18'));
    expect(setRpmChannel(rpm, 'stable/rolling')).toBe(rpm.replace('stable/v17', 'stable/rolling'));
  });
  it('the line an entry reads once moved (what a new major version announces)', () => {
    expect(movedLine({ kind: 'apt', text: `# Gateway\n${apt}` }, 'stable/v18')).toBe(apt.trim().replace('stable/v17', 'stable/v18'));
    expect(movedLine({ kind: 'rpm', text: rpm }, 'stable/v18')).toBe('baseurl=https://yum.gateway.example/rhel/9/Gateway/$basearch/stable/v18');
  });
  it('says when a per-major channel cannot hold the target', () => {
    expect(channelHolds('stable/v17', '17.3.0')).toEqual({ ok: true });
    expect(channelHolds('stable/v17', '18.0.0')).toEqual({ ok: false, move: 'stable/v18' });
    expect(channelHolds('stable/rolling', '18.0.0')).toEqual({ ok: true });
    expect(channelHolds(undefined, '18.0.0')).toEqual({ ok: true });
  });
  it('writes and reads the files under the configured root', async () => {
    const root = join(dir, 'root');
    await import('node:fs/promises').then((fs) => fs.mkdir(join(root, 'etc'), { recursive: true }));
    await writeFile(join(root, 'etc/os-release'), 'ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\n');
    const s = resolveSettings({ GATEWAY_UPGRADE_ROOT: root, GATEWAY_UPGRADE_APT_REPO_URL: 'https://apt.example.net/' });
    expect(await readRepo('apt', s)).toBeUndefined();
    const created = await setChannel('apt', 'stable/v17', s);
    expect(created.path).toBe(join(root, 'etc/apt/sources.list.d/gateway.list'));
    expect(await readFile(created.path, 'utf8')).toContain('deb [signed-by=/usr/share/keyrings/gateway-archive-keyring.asc] https://apt.example.net/debian bookworm stable/v17\n');
    expect((await setChannel('apt', 'stable/v18', s)).channel).toBe('stable/v18');
    const yum = await setChannel('yum', 'stable/v17', s);
    expect(yum.path).toBe(join(root, 'etc/yum.repos.d/gateway.repo'));
    expect(yum).toMatchObject({ channel: 'stable/v17', repoId: 'gateway' });
    expect((await setChannel('zypper', 'stable/rolling', s)).path).toBe(join(root, 'etc/zypp/repos.d/gateway.repo'));
    await expect(setChannel('apt', 'beta', s)).rejects.toMatchObject({ code: 'GW_ERR_UPGRADE_REPO' });
  });
});

describe('cluster enrollment (seed Versioning 2)', () => {
  it.each([
    ['14.3.7', true],
    ['v14.3.8', true],
    ['14.3.6', false],
    ['14.4.0', true],
    ['13.9.9', false],
    ['15.0.0', false],
    ['15.1.2', false],
    ['15.1.3-rc.1', false],
    ['15.1.3', true],
    ['16.0.0', true],
    ['17.0.0-dev', true],
  ])('%s → %s', (v, ok) => {
    expect(checkClusterVersion(v).ok).toBe(ok);
  });
  it('says why and what is needed', () => {
    const r = checkClusterVersion('15.0.2');
    expect(r).toEqual({ ok: false, reason: 'the cluster runs v15.0.2, older than automatic agent upgrades need (v15.1.3 or later (v15))', needed: 'v14.3.7 on v14, or v15.1.3 on v15 and later' });
    expect(checkClusterVersion(undefined).ok).toBe(false);
    expect(checkClusterVersion('banana').ok).toBe(false);
  });
});

describe('the lock', () => {
  it('one holder at a time; a dead holder is taken over', async () => {
    const path = join(dir, 'run', 'gateway-upgrade.lock');
    const a = await acquireLock(path);
    const b = await acquireLock(path).catch((e: unknown) => e);
    expect(isGatewayError(b, 'GW_ERR_UPGRADE_LOCKED')).toBe(true);
    await a.release();
    const c = await acquireLock(path);
    await c.release();
    // A lock left by a process that is gone.
    const dead = spawn('true');
    const pid = await new Promise<number>((resolve) => dead.once('exit', () => resolve(dead.pid!)));
    await writeFile(path, `${pid}\n`);
    const d = await acquireLock(path);
    expect(await readFile(path, 'utf8')).toBe(`${process.pid}\n`);
    await d.release();
  });
  it('a running holder in another process', async () => {
    const path = join(dir, 'run', 'other.lock');
    const other = spawn('sleep', ['30']);
    try {
      await writeFile(path, `${other.pid}\n`);
      await expect(acquireLock(path)).rejects.toMatchObject({ code: 'GW_ERR_UPGRADE_LOCKED', message: expect.stringContaining(`pid ${other.pid}`) });
    } finally {
      other.kill();
    }
  });
});

describe('settings', () => {
  it('every path under GATEWAY_UPGRADE_ROOT, each overridable', () => {
    const s = resolveSettings({ GATEWAY_UPGRADE_ROOT: '/tmp/r', GATEWAY_UPGRADE_LOCK_FILE: '/tmp/l.lock', GATEWAY_UPGRADE_HEALTH_TIMEOUT: '90s' });
    expect(s).toMatchObject({
      endpointFile: '/tmp/r/etc/gateway-upgrade.d/endpoint',
      scheduleFile: '/tmp/r/etc/gateway-upgrade.d/schedule',
      aptSourcesDir: '/tmp/r/etc/apt/sources.list.d',
      yumReposDir: '/tmp/r/etc/yum.repos.d',
      lockFile: '/tmp/l.lock',
      binDir: '/tmp/r/usr/local/bin',
      // The hand-over while the unit runs (the old process drains), a plain restart when it does not.
      restartCommand: 'if systemctl is-active --quiet gateway; then systemctl kill --signal=SIGUSR2 --kill-whom=main gateway; else systemctl restart gateway; fi',
      pidFile: '/tmp/r/run/gateway.pid',
      healthCommand: 'systemctl is-active --quiet gateway',
      versionCommand: 'gateway --version',
      healthTimeoutMs: 90_000,
      packageManager: 'auto',
    });
    expect(resolveSettings({}).endpointFile).toBe('/etc/gateway-upgrade.d/endpoint');
    expect(() => resolveSettings({ GATEWAY_UPGRADE_PACKAGE_MANAGER: 'pacman' })).toThrow(/pacman/);
    expect(() => resolveSettings({ GATEWAY_UPGRADE_DIR: 'relative' })).toThrow(/absolute/);
  });
});
