/**
 * `npm run package` (scripts/package/build.mjs) through test/helpers/packages.ts: what the .deb and .rpm packages
 * hold and declare, the systemd units inside them (exactly src/upgrade/systemd.ts's), an install, an upgrade that
 * keeps an edited configuration file and a removal into a temporary root with dpkg, the installed commands running
 * on their bundled Node.js, lintian, and the release tarball: its .sha256, the upgrader's own download check (a
 * tampered tarball refused, nothing extracted) and install script.
 */
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { copyFile, mkdir, mkdtemp, readdir, readFile, readlink, rm, symlink, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { agentUnit, upgradeServiceUnit, upgradeTimerUnit } from '../../src/upgrade/systemd.js';
import { fetchVerifiedTarball, installTarball, tarballName, type TarballDeps } from '../../src/upgrade/tarball.js';
import { packageVersion } from '../../src/upgrade/packages.js';
import { buildPackages, type BuiltPackages } from '../helpers/packages.js';
import { runCleanup } from '../helpers/cleanup.js';
import { rootTest } from '../helpers/root.js';

const run = promisify(execFile);
const N = '17.0.0-dev';
const N1 = '17.0.1';

let pkgs: BuiltPackages;
let next: BuiltPackages;
let dir: string;

beforeAll(async () => {
  // One build shared with every other test file (a cache keyed by the inputs' hash), and N+1 of the same app.
  pkgs = await buildPackages({ version: N });
  next = await buildPackages({ version: N1 });
  dir = await mkdtemp(join(tmpdir(), 'gw-package-test-'));
}, 900_000);

afterAll(() => runCleanup([() => rm(dir, { recursive: true, force: true })]));

async function out(cmd: string, args: string[], options: { cwd?: string; env?: NodeJS.ProcessEnv } = {}): Promise<string> {
  return (await run(cmd, args, { maxBuffer: 64 << 20, ...options })).stdout;
}

/** One file of a .deb, read without installing it. */
async function debFile(deb: string, path: string): Promise<string> {
  return out('sh', ['-c', 'dpkg-deb --fsys-tarfile "$1" | tar -xOf - "$2"', 'sh', deb, `./${path}`]);
}

/** A fresh dpkg root; dpkg installs into it without touching the machine's packages. */
async function dpkgRoot(name: string): Promise<{ root: string; dpkg: (...args: string[]) => Promise<string> }> {
  const root = join(dir, name);
  await mkdir(join(root, 'var/lib/dpkg/info'), { recursive: true });
  await mkdir(join(root, 'var/lib/dpkg/updates'), { recursive: true });
  await writeFile(join(root, 'var/lib/dpkg/status'), '');
  // --force-script-chrootless: the maintainer scripts run here with DPKG_ROOT set (they leave systemd alone then)
  // instead of in a chroot, which would need a shell inside the root.
  const base = [`--root=${root}`, '--force-script-chrootless', '--force-not-root', '--force-confold', `--log=${join(root, 'dpkg.log')}`];
  // dpkg looks for ldconfig and start-stop-daemon on PATH, which a normal user's PATH lacks (/usr/sbin, /sbin).
  const env = { ...process.env, PATH: `${process.env.PATH ?? '/usr/bin:/bin'}:/usr/local/sbin:/usr/sbin:/sbin` };
  return { root, dpkg: (...args) => out('dpkg', [...base, ...args], { env }) };
}

/**
 * `gateway start` from an installed root: the daemon (SQLite through better-sqlite3, the Proxy serving the Web UI
 * from the package's dist/web/) runs on the package's own runtime, and serves the Web UI's page.
 */
async function startInstalled(root: string): Promise<void> {
  const data = join(dir, 'installed-data');
  const config = join(dir, 'installed.yaml');
  await writeFile(config, `gateway:\n  nodename: pkg\n  data_dir: ${data}\n  log: { format: json }\nauth_service:\n  listen_addr: 127.0.0.1:0\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n`);
  const child = spawn(join(root, 'usr/bin/gateway'), ['start', '-c', config], { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: process.env.PATH ?? '' } });
  try {
    let output = '';
    const started = await new Promise<{ addresses: Record<string, string> }>((resolve, reject) => {
      child.stderr.on('data', (c: Buffer) => {
        output += c.toString();
        const line = output.split('\n').find((l) => l.includes('"gateway started"'));
        if (line) resolve(JSON.parse(line) as { addresses: Record<string, string> });
      });
      child.once('exit', (code) => reject(new Error(`the installed gateway exited with ${code}:\n${output}`)));
    });
    // The wrapper exec'd the package's node: the daemon's executable is <root>/usr/lib/gateway/node.
    expect(await readlink(`/proc/${child.pid}/exe`)).toBe(join(root, 'usr/lib/gateway/node'));
    const page = await out('curl', ['-sk', '--max-time', '20', `https://${started.addresses.web}/web/`]);
    expect(page).toMatch(/<html/i);
  } finally {
    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    await exited;
  }
}

describe('the .deb packages', () => {
  it('declare what they are: names, version, architecture, the -fips conflict, the updater on either server package', async () => {
    const info = await out('dpkg-deb', ['--info', pkgs.debs.gateway]);
    expect(info).toMatch(/^ Package: gateway$/m);
    expect(info).toMatch(new RegExp(`^ Version: ${packageVersion(N).replace('.', '\\.')}$`, 'm'));
    expect(pkgs.packageVersion).toBe('17.0.0~dev');
    expect(info).toMatch(/^ Architecture: amd64$/m);
    expect(info).toMatch(/^ Conflicts: gateway-ent-fips$/m);
    expect(info).not.toMatch(/^ Depends:/m);
    // The kerberos module (Negotiate proxy authentication) links libgssapi_krb5: recommended when it is staged.
    const kerberos = existsSync(new URL('../../node_modules/kerberos/build/Release/kerberos.node', import.meta.url));
    if (kerberos) {
      expect(info).toMatch(/^ Recommends: libgssapi-krb5-2$/m);
      expect(await out('dpkg-deb', ['-c', pkgs.debs.gateway])).toContain('./usr/lib/gateway/node_modules/kerberos/build/Release/kerberos.node');
    }
    else expect(info).not.toMatch(/^ Recommends:/m);
    const fips = await out('dpkg-deb', ['--field', pkgs.debs['gateway-ent-fips'], 'Package', 'Conflicts', 'Replaces']);
    expect(fips).toContain('Package: gateway-ent-fips\nConflicts: gateway\nReplaces: gateway');
    expect(await out('dpkg-deb', ['--field', pkgs.debs['gateway-ent-updater'], 'Depends'])).toBe('gateway | gateway-ent-fips\n');
    expect(await out('dpkg-deb', ['--field', next.debs.gateway, 'Version'])).toBe('17.0.1\n');
  });

  it('hold the runtime, the app, its native modules, the wrappers, the unit and the configuration files', async () => {
    const files = (await out('dpkg-deb', ['--contents', pkgs.debs.gateway])).split('\n').map((l) => l.split(/\s+/).slice(5).join(' '));
    for (const f of [
      './usr/bin/gateway', './usr/bin/gwctl', './usr/bin/gwsh', './usr/lib/gateway/node', './usr/lib/gateway/package.json',
      './usr/lib/gateway/dist/cli/gateway.js', './usr/lib/gateway/dist/web/index.html',
      './usr/lib/gateway/node_modules/better-sqlite3/build/Release/better_sqlite3.node',
      './usr/lib/gateway/node_modules/node-pty/build/Release/pty.node',
      './usr/lib/gateway/node_modules/cpu-features/build/Release/cpufeatures.node',
      './lib/systemd/system/gateway.service', './etc/default/gateway', './etc/gateway.yaml', './usr/share/doc/gateway/copyright',
    ]) {
      expect(files, f).toContain(f);
    }
    expect(files.filter((f) => f.endsWith('.map') || /prebuilds\/(?:darwin|win32|android)/.test(f))).toEqual([]);
    const conffiles = await out('sh', ['-c', 'dpkg-deb --ctrl-tarfile "$1" | tar -xOf - ./conffiles', 'sh', pkgs.debs.gateway]);
    expect(conffiles).toBe('/etc/default/gateway\n/etc/gateway.yaml\n');
    const updater = await out('dpkg-deb', ['--contents', pkgs.debs['gateway-ent-updater']]);
    expect(updater).toContain('./usr/bin/gateway-upgrade');
    expect(updater).toContain('./lib/systemd/system/gateway-upgrade.timer');
  });

  it('carry the systemd units exactly as src/upgrade/systemd.ts writes them for /usr/bin', async () => {
    expect(await debFile(pkgs.debs.gateway, 'lib/systemd/system/gateway.service')).toBe(agentUnit({ binDir: '/usr/bin' }));
    expect(await debFile(pkgs.debs['gateway-ent-fips'], 'lib/systemd/system/gateway.service')).toBe(agentUnit({ binDir: '/usr/bin' }));
    const unit = agentUnit({ binDir: '/usr/bin' });
    for (const line of ['EnvironmentFile=-/etc/default/gateway', 'Restart=always', 'RestartSec=5', 'LimitNOFILE=524288', 'PIDFile=/run/gateway.pid']) {
      expect(unit.split('\n')).toContain(line);
    }
    expect(await debFile(pkgs.debs['gateway-ent-updater'], 'lib/systemd/system/gateway-upgrade.service')).toBe(upgradeServiceUnit({ binDir: '/usr/bin' }));
    expect(await debFile(pkgs.debs['gateway-ent-updater'], 'lib/systemd/system/gateway-upgrade.timer')).toBe(upgradeTimerUnit());
  });

  it('never enable or start a service on install', async () => {
    for (const deb of [pkgs.debs.gateway, pkgs.debs['gateway-ent-updater']]) {
      const postinst = await out('sh', ['-c', 'dpkg-deb --ctrl-tarfile "$1" | tar -xOf - ./postinst', 'sh', deb]);
      expect(postinst).toContain('daemon-reload');
      expect(postinst).not.toMatch(/systemctl (?:--\S+ )*(?:start|enable|restart)\b/);
    }
  });

  it('install into a root, run on their own Node.js, upgrade keeping an edited configuration file, and remove', async () => {
    const { root, dpkg } = await dpkgRoot('deb-root');
    await dpkg('-i', pkgs.debs.gateway, pkgs.debs['gateway-ent-updater']);
    expect((await out(join(root, 'usr/bin/gateway'), ['--version'])).trim()).toBe(N);
    expect((await out(join(root, 'usr/bin/gwctl'), ['--version'])).trim()).toBe(N);
    expect((await out(join(root, 'usr/bin/gateway-upgrade'), ['version'])).trim()).toBe(`gateway-upgrade v${N}`);
    // The package's own runtime, not the machine's: the wrapper runs <root>/usr/lib/gateway/node.
    // With no node on PATH at all (only readlink, which the wrapper uses to find itself).
    const tools = join(dir, 'tools');
    await mkdir(tools);
    await symlink('/usr/bin/readlink', join(tools, 'readlink'));
    expect((await out(join(root, 'usr/bin/gateway'), ['--version'], { env: { PATH: tools } })).trim()).toBe(N);
    await startInstalled(root);
    await writeFile(join(root, 'etc/default/gateway'), 'HTTPS_PROXY=http://proxy.internal:3128\n');
    await dpkg('-i', next.debs.gateway, next.debs['gateway-ent-updater']);
    expect((await out(join(root, 'usr/bin/gateway'), ['--version'])).trim()).toBe(N1);
    expect(await readFile(join(root, 'etc/default/gateway'), 'utf8')).toBe('HTTPS_PROXY=http://proxy.internal:3128\n');
    await dpkg('--verify', 'gateway');
    await dpkg('-r', 'gateway-ent-updater', 'gateway');
    expect(existsSync(join(root, 'usr/bin/gateway'))).toBe(false);
    expect(existsSync(join(root, 'usr/lib/gateway'))).toBe(false);
    expect(existsSync(join(root, 'etc/default/gateway'))).toBe(true); // removed, not purged: configuration stays
    await dpkg('--purge', 'gateway');
    expect(existsSync(join(root, 'etc/default/gateway'))).toBe(false);
  }, 300_000);

  it('-fips: takes the place of gateway and says FIPS in --version (the upgrader picks the -fips package and tarball from it)', async () => {
    const { root, dpkg } = await dpkgRoot('fips-root');
    await dpkg('-i', pkgs.debs.gateway);
    await writeFile(join(root, 'etc/default/gateway'), 'NO_PROXY=.corp\n');
    // Conflicts + Replaces: dpkg removes gateway to install gateway-ent-fips in its place.
    await dpkg('-i', pkgs.debs['gateway-ent-fips']);
    expect(await readFile(join(root, 'etc/default/gateway'), 'utf8')).toBe('NO_PROXY=.corp\n');
    const status = await out('dpkg-query', [`--admindir=${join(root, 'var/lib/dpkg')}`, '-W', '-f=${Package} ${Status}\n', 'gateway', 'gateway-ent-fips']);
    expect(status).toContain('gateway-ent-fips install ok installed');
    expect(status).not.toContain('gateway install ok installed');
    const v = (await out(join(root, 'usr/bin/gateway'), ['--version'])).trim();
    expect(v.startsWith(`${N} FIPS`)).toBe(true);
    // Honest about the runtime: without an OpenSSL FIPS provider it says FIPS mode is unavailable.
    expect(v).toContain(pkgs.fipsMode ? 'OpenSSL FIPS mode on' : 'unavailable');
  }, 300_000);

  it('ship each command\'s shell completion and manual page, as the installed command prints them, where the shells and man look', async () => {
    const { root, dpkg } = await dpkgRoot('docs-root');
    await dpkg('-i', pkgs.debs.gateway, pkgs.debs['gateway-ent-updater']);
    for (const command of ['gateway', 'gwctl', 'gwsh', 'gateway-upgrade']) {
      const paths = { bash: `usr/share/bash-completion/completions/${command}`, zsh: `usr/share/zsh/vendor-completions/_${command}`, fish: `usr/share/fish/vendor_completions.d/${command}.fish` };
      for (const [shell, path] of Object.entries(paths)) {
        expect(await readFile(join(root, path), 'utf8'), path).toBe(await out(join(root, 'usr/bin', command), ['completion', shell]));
      }
      // man reads the installed page (gzip) and groff finds nothing to warn about.
      const page = join(root, `usr/share/man/man1/${command}.1.gz`);
      const r = await run('sh', ['-c', 'zcat "$1" | groff -man -ww -z', 'sh', page]);
      expect(r.stderr, page).toBe('');
      expect(await out('sh', ['-c', 'zcat "$1"', 'sh', page])).toContain(`.SH NAME\n${command.replace(/-/g, '\\-')} \\- `);
    }
    expect(await out('rpm', ['-qpl', pkgs.rpms.gateway])).toContain('/usr/share/man/man1/gwctl.1.gz\n');
    expect(await out('rpm', ['-qpl', pkgs.rpms['gateway-ent-updater']])).toContain('/usr/share/bash-completion/completions/gateway-upgrade\n');
  }, 300_000);

  it('lintian reports nothing but what the shipped overrides explain', async () => {
    // gateway-ent-fips holds the same files as gateway; lintian takes a while on 4,000 files, so it runs on one.
    const r = await run('lintian', ['--no-cfg', '--fail-on', 'none', pkgs.debs.gateway, pkgs.debs['gateway-ent-updater']], { maxBuffer: 16 << 20 }).catch((e: { stdout: string; stderr: string }) => e);
    const lines = `${r.stdout}\n${r.stderr}`.split('\n').filter((l) => l.trim() !== '' && !l.includes('running with root privileges'));
    expect(lines).toEqual([]);
  }, 600_000);
});

describe('the .rpm packages', () => {
  it('declare name, version, release, configuration files, dependencies and scriptlets', async () => {
    const info = await out('rpm', ['-qpi', pkgs.rpms.gateway]);
    expect(info).toMatch(/^Name\s*: gateway$/m);
    expect(info).toMatch(/^Version\s*: 17\.0\.0~dev$/m);
    expect(info).toMatch(/^Release\s*: 1$/m);
    expect(info).toMatch(/^Architecture: x86_64$/m);
    expect(await out('rpm', ['-qpc', pkgs.rpms.gateway])).toBe('/etc/default/gateway\n/etc/gateway.yaml\n');
    const files = (await out('rpm', ['-qpl', pkgs.rpms.gateway])).split('\n');
    for (const f of ['/usr/bin/gateway', '/usr/lib/gateway/node', '/usr/lib/gateway/dist/cli/gateway.js', '/usr/lib/systemd/system/gateway.service']) expect(files).toContain(f);
    expect(await out('rpm', ['-qpR', pkgs.rpms['gateway-ent-updater']])).toContain('(gateway or gateway-ent-fips)');
    expect(await out('rpm', ['-qp', '--conflicts', pkgs.rpms['gateway-ent-fips']])).toBe('gateway\n');
    expect((await out('rpm', ['-qpl', pkgs.rpms['gateway-ent-updater']])).split('\n')).toContain('/usr/lib/systemd/system/gateway-upgrade.timer');
    const scripts = await out('rpm', ['-qp', '--scripts', pkgs.rpms.gateway]);
    expect(scripts).toContain('daemon-reload');
    expect(scripts).not.toMatch(/"(?:start|enable|restart)"/);
    expect(await out('rpm', ['-qp', '--qf', '%{VERSION}-%{RELEASE}', next.rpms.gateway])).toBe('17.0.1-1');
  });

  rootTest(['chroot'])('install into an empty root with rpm (Lua scriptlets, no /bin/sh there), upgrade keeping an edited %config, remove', async () => {
    const root = join(dir, 'rpm-root');
    await mkdir(root);
    const rpm = (...args: string[]) => out('rpm', [`--root=${root}`, ...args]);
    await rpm('--initdb');
    await rpm('-i', pkgs.rpms.gateway, pkgs.rpms['gateway-ent-updater']);
    expect((await out(join(root, 'usr/bin/gateway'), ['--version'])).trim()).toBe(N);
    expect((await out(join(root, 'usr/bin/gateway-upgrade'), ['version'])).trim()).toBe(`gateway-upgrade v${N}`);
    await writeFile(join(root, 'etc/default/gateway'), 'NO_PROXY=.internal\n');
    await rpm('-U', next.rpms.gateway, next.rpms['gateway-ent-updater']);
    expect((await out(join(root, 'usr/bin/gateway'), ['--version'])).trim()).toBe(N1);
    expect(await readFile(join(root, 'etc/default/gateway'), 'utf8')).toBe('NO_PROXY=.internal\n');
    expect((await rpm('-qa', '--qf', '%{NAME}-%{VERSION}\n')).split('\n').sort()).toEqual(['', 'gateway-17.0.1', 'gateway-ent-updater-17.0.1']);
    await rpm('-e', 'gateway-ent-updater', 'gateway');
    expect(existsSync(join(root, 'usr/lib/gateway'))).toBe(false);
    // An edited %config(noreplace) file is saved as .rpmsave on removal, as RPM does.
    expect(await readFile(join(root, 'etc/default/gateway.rpmsave'), 'utf8')).toBe('NO_PROXY=.internal\n');
  }, 300_000);

  it('carry the same unit text', async () => {
    const unit = await out('sh', ['-c', 'rpm2archive - < "$1" | tar -xzOf - ./usr/lib/systemd/system/gateway.service', 'sh', pkgs.rpms.gateway]);
    expect(unit).toBe(agentUnit({ binDir: '/usr/bin' }));
  });
});

describe('the release tarball', () => {
  let server: Server;
  let base: string;
  const served = new Map<string, Buffer>();

  beforeAll(async () => {
    server = createServer((req, res) => {
      const body = served.get(req.url ?? '');
      res.writeHead(body ? 200 : 404, body ? { 'content-length': body.length } : {});
      res.end(body);
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => runCleanup([() => server.close()]));

  function deps(work: string, binDir: string): TarballDeps {
    return { dialer: new Dialer({ env: {} }), stderr: new PassThrough(), downloadUrl: base, arch: 'amd64', fips: false, binDir, workDir: work, commandTimeoutMs: 120_000 };
  }

  it('is named as the upgrader asks for it, and its .sha256 verifies with sha256sum', async () => {
    expect(pkgs.tarballs.default.tarball.endsWith(`/${tarballName(N, 'amd64', false)}`)).toBe(true);
    expect(pkgs.tarballs.fips.tarball.endsWith(`/${tarballName(N, 'amd64', true)}`)).toBe(true);
    expect(await out('sha256sum', ['-c', pkgs.tarballs.default.sha256.split('/').pop()!], { cwd: pkgs.dir })).toMatch(/: OK\n$/);
    const list = (await out('tar', ['-tzf', pkgs.tarballs.default.tarball])).split('\n');
    for (const f of ['gateway/install', 'gateway/gateway', 'gateway/gwctl', 'gateway/gwsh', 'gateway/gateway-upgrade', 'gateway/lib/node', 'gateway/lib/gateway-upgrade.mjs']) expect(list).toContain(f);
  });

  it('hostile: a tampered tarball fails its checksum, with sha256sum and in the upgrader, and nothing is extracted', async () => {
    const bad = join(dir, 'tampered');
    await mkdir(bad);
    const name = tarballName(N, 'amd64', false);
    const body = Buffer.from(await readFile(pkgs.tarballs.default.tarball));
    body[body.length >> 1] = body[body.length >> 1]! ^ 0x01;
    await writeFile(join(bad, name), body);
    await copyFile(pkgs.tarballs.default.sha256, join(bad, `${name}.sha256`));
    await expect(run('sha256sum', ['-c', `${name}.sha256`], { cwd: bad })).rejects.toThrow(/did NOT match/);
    served.set(`/${name}`, body);
    served.set(`/${name}.sha256`, await readFile(pkgs.tarballs.default.sha256));
    const work = join(dir, 'tampered-work');
    await mkdir(work);
    const err = await fetchVerifiedTarball(N, deps(work, join(dir, 'tampered-bin'))).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_UPGRADE_CHECKSUM');
    expect(await readdir(work)).toEqual([]);
    expect(existsSync(join(dir, 'tampered-bin'))).toBe(false);
  });

  it('downloads, verifies and installs with the upgrader; a rollback puts the commands and the app directory back as they were', async () => {
    for (const t of [pkgs, next]) {
      const name = tarballName(t.version, 'amd64', false);
      served.set(`/${name}`, await readFile(t.tarballs.default.tarball));
      served.set(`/${name}.sha256`, await readFile(t.tarballs.default.sha256));
    }
    const bin = join(dir, 'tar-root/usr/local/bin');
    for (const v of [N, N1]) {
      const work = join(dir, `work-${v}`);
      await mkdir(work, { recursive: true });
      const tarball = await fetchVerifiedTarball(v, deps(work, bin));
      const install = await installTarball(tarball, deps(work, bin));
      expect((await out(join(bin, 'gateway'), ['--version'])).trim()).toBe(v);
      expect((await out(join(bin, 'gateway-upgrade'), ['version'])).trim()).toBe(`gateway-upgrade v${v}`);
      if (v === N1) {
        expect((await readdir(join(dir, 'tar-root/usr/local/lib/gateway'))).sort()).toEqual([N, N1].sort());
        // The upgrader's rollback puts the previous commands and the app directory back (src/upgrade/tarball.ts saves
        // both before the install script runs): the commands find the previous app, the new release is gone.
        await install.restore();
        expect((await out(join(bin, 'gateway'), ['--version'])).trim()).toBe(N);
      }
    }
    expect(await readdir(join(dir, 'tar-root/usr/local/lib/gateway'))).toEqual([N]);
  }, 300_000);

  it('hostile: the install script refuses a bin directory it could not quote, before changing anything', async () => {
    const x = join(dir, 'hostile-install');
    await mkdir(x);
    await run('tar', ['-xzf', pkgs.tarballs.default.tarball, '-C', x]);
    const bin = join(x, "bin'; touch pwned; '");
    const r = await run(join(x, 'gateway/install'), [], { cwd: join(x, 'gateway'), env: { PATH: process.env.PATH, GATEWAY_BIN_DIR: bin } }).catch((e: { code: number; stderr: string }) => e);
    expect('code' in r ? r.code : 0).toBe(1);
    expect((r as { stderr: string }).stderr).toContain('refusing paths with quotes');
    expect(existsSync(bin)).toBe(false);
    expect((await readdir(x)).sort()).toEqual(['gateway']);
  });
});

describe('npm run package itself', () => {
  it('hostile: refuses a --version that is not semver before building anything (it goes into control files and scripts)', async () => {
    const outDir = join(dir, 'bad-version');
    const r = await run(process.execPath, [new URL('../../scripts/package/build.mjs', import.meta.url).pathname, '--version', '17.0.1\nDepends: evil', '--out', outDir]).catch((e: { code: number; stderr: string }) => e);
    expect('code' in r ? r.code : 0).toBe(1);
    expect((r as { stderr: string }).stderr).toContain('expected a semver version');
    expect(existsSync(outDir)).toBe(false);
  });
});
