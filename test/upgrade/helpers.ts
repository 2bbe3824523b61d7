/**
 * Test machinery for the upgrader:
 *
 * - an apt "lab": real .deb packages of a fake `gateway` (fixtures/upgrade/fake-gateway.sh) built with dpkg-deb,
 *   or the project's own packages (TestPackage.files), indexed with apt-ftparchive into a `file:` repository laid
 *   out like the real one (dists/<codename>/stable/v<N> and stable/rolling, InRelease signed with a key of the
 *   lab's own that the source line names with signed-by), and a temporary root that apt-get and dpkg install into
 *   (APT_CONFIG points apt at it: Dir, the dpkg status file, and dpkg --root / --admindir, scripts chrootless).
 *   Nothing of the real system's packages changes, and no root is needed.
 * - an rpm lab for dnf or zypper: rpmbuild packages (or the project's), one createrepo_c repository per channel,
 *   repomd.xml signed, and a temporary root the manager installs into (dnf --installroot, zypper --root: rpm
 *   chroots there, so root is needed).
 * - for both, ways to break the repository as a mirror can (a package altered after indexing, metadata that does
 *   not match, metadata signed by another key), and a snapshot (hard links) to put it back.
 * - release tarballs of the same fake binary, with their .sha256 files; the servers of the tarball path (the
 *   download server, a Proxy's version server) and the upgrader's environment for it.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmod, copyFile, link, mkdir, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import type { ServerResponse } from 'node:http';
import { promisify } from 'node:util';
import { Dialer } from '../../src/dial/dialer.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import type { TestPki } from '../helpers/tls.js';

const run = promisify(execFile);
const FIXTURES = new URL('../../fixtures/upgrade/', import.meta.url);

export async function fakeGatewayScript(version: string, healthy = true): Promise<string> {
  const tmpl = await readFile(new URL('fake-gateway.sh', FIXTURES), 'utf8');
  return tmpl.replaceAll('@VERSION@', version).replaceAll('@HEALTHY@', healthy ? 'yes' : 'no');
}

export interface TestPackage {
  version: string;
  /** stable/v<major> by default. */
  channel?: string;
  /** false: `gateway health` fails (a build that does not come back after a restart). */
  healthy?: boolean;
  /** false: not on stable/rolling (by default every version is, as on the real repositories). */
  rolling?: boolean;
  /**
   * Real package files of this version (test/helpers/packages.ts buildPackages: .deb for an apt lab, .rpm for an
   * rpm lab), put in the repository instead of the fake gateway. They are hard-linked, never copied.
   */
  files?: string[];
}

export interface AptLab {
  dir: string;
  repo: string;
  /** The temporary root apt and dpkg install into. */
  root: string;
  /** Environment that points apt-get at the root (APT_CONFIG). */
  env: Record<string, string>;
  codename: string;
  /** The gateway binary inside the root. */
  binary: string;
  /** The apt source line for a channel, signed-by the lab's key (as the install guide's line). */
  sourceLine(channel: string): string;
  /** Signs InRelease with another key than the one the root trusts (a mirror serving someone else's metadata). */
  resignWithOtherKey(): Promise<void>;
  /** Installs a version of packages (default: gateway) directly with apt-get (test setup). */
  install(version: string, pkgs?: string[]): Promise<void>;
  /** What `<root>/usr/bin/gateway --version` says. */
  installed(): Promise<string>;
  /**
   * Puts `file` in a channel's pool in place of the package of the same name (a new file, never written through a
   * hard link), indexed and signed again with the lab's own key: a rebuilt package the repository serves as genuine.
   */
  replacePackage(channel: string, file: string): Promise<void>;
  /** Flips the last byte of a .deb on a channel: same size, another checksum than the Packages index says. */
  tamperPackage(channel: string, version: string): Promise<void>;
  /** Overwrites a channel's Packages index with garbage (its checksum in Release no longer matches). */
  corruptMetadata(channel: string): Promise<void>;
  /** Puts the repository back as it was built. */
  restore(): Promise<void>;
  cleanup(): Promise<void>;
}

/** Flips the last byte of a file (a package altered on a mirror, its size unchanged), in a new file: never through a hard link. */
async function flipLastByte(file: string): Promise<void> {
  const body = await readFile(file);
  body[body.length - 1] = body[body.length - 1]! ^ 0xff;
  await replaceFile(file, body);
}

/** Writes a new file in place of `file` (the repository copies are hard links: writing through one alters both). */
async function replaceFile(file: string, body: string | Buffer): Promise<void> {
  await writeFile(`${file}.tmp`, body);
  await rename(`${file}.tmp`, file);
}

/** Puts the package files of `pkg` into `dir`: its real files hard-linked, or the fake one built by `build`. */
async function placePackage(dir: string, pkg: TestPackage, fakeName: string, build: (out: string) => Promise<void>): Promise<void> {
  if (!pkg.files) return build(join(dir, fakeName));
  for (const f of pkg.files) await link(f, join(dir, basename(f))).catch(() => copyFile(f, join(dir, basename(f))));
}

/** A copy of a tree made of hard links (the packages are large; a tampered file is replaced, not written through). */
const linkTree = (from: string, to: string) => run('cp', ['-al', from, to]);

async function buildDeb(out: string, work: string, pkg: TestPackage): Promise<void> {
  const d = join(work, `pkg-${pkg.version}`);
  await mkdir(join(d, 'DEBIAN'), { recursive: true });
  await mkdir(join(d, 'usr/bin'), { recursive: true });
  await writeFile(
    join(d, 'DEBIAN/control'),
    [
      'Package: gateway',
      `Version: ${pkg.version.replace('-', '~')}`,
      'Architecture: all',
      'Maintainer: Gateway tests <tests@gateway.example>',
      'Description: fake gateway for the upgrader tests',
      '',
    ].join('\n'),
  );
  await writeFile(join(d, 'usr/bin/gateway'), await fakeGatewayScript(pkg.version, pkg.healthy !== false), { mode: 0o755 });
  await chmod(join(d, 'usr/bin/gateway'), 0o755);
  await run('dpkg-deb', ['--root-owner-group', '-Zgzip', '--build', d, out]);
}

const APT_KEYRING_PATH = 'usr/share/keyrings/gateway-archive-keyring.asc';

interface SigningKey {
  /** The armored public key (what `signed-by` or `gpgkey` names). */
  publicKey: string;
  clearsign(file: string, out: string): Promise<void>;
  /** Writes <file>.asc, an armored detached signature (repomd.xml.asc). */
  detachSign(file: string): Promise<void>;
}

/** Removes a lab, ending first the agents gpg started for its keys (one per GNUPGHOME). */
async function cleanupLab(dir: string): Promise<void> {
  for (const home of ['gpg', 'gpg-other']) await run('gpgconf', ['--kill', 'all'], { env: { PATH: process.env.PATH ?? '', GNUPGHOME: join(dir, home) } }).catch(() => undefined);
  await rm(dir, { recursive: true, force: true });
}

/** A repository signing key of its own (ed25519, no passphrase) in a GNUPGHOME under `home`. */
async function makeSigningKey(home: string): Promise<SigningKey> {
  await mkdir(home, { recursive: true, mode: 0o700 });
  const env = { PATH: process.env.PATH ?? '', GNUPGHOME: home };
  await run('gpg', ['--batch', '--quiet', '--passphrase', '', '--quick-gen-key', 'Gateway test repository <repo@gateway.example>', 'ed25519', 'sign', 'never'], { env });
  const publicKey = (await run('gpg', ['--batch', '--armor', '--export'], { env })).stdout;
  return {
    publicKey,
    async clearsign(file, out) {
      await run('gpg', ['--batch', '--yes', '--quiet', '--clearsign', '--digest-algo', 'SHA512', '-o', out, file], { env });
    },
    async detachSign(file) {
      await run('gpg', ['--batch', '--yes', '--quiet', '--armor', '--detach-sign', '-o', `${file}.asc.new`, file], { env });
      await rename(`${file}.asc.new`, `${file}.asc`);
    },
  };
}

/** channel -> packages: each package on its own channel (stable/v<major> by default) and on stable/rolling. */
export function channelsOf(packages: readonly TestPackage[]): Map<string, TestPackage[]> {
  const channels = new Map<string, TestPackage[]>();
  const add = (ch: string, p: TestPackage) => channels.set(ch, [...(channels.get(ch) ?? []), p]);
  for (const p of packages) {
    add(p.channel ?? `stable/v${p.version.split('.')[0]}`, p);
    if (p.rolling !== false) add('stable/rolling', p);
  }
  return channels;
}

export async function makeAptLab(packages: TestPackage[], codename = 'bookworm'): Promise<AptLab> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-apt-'));
  await chmod(dir, 0o755);
  const repo = join(dir, 'repo');
  const root = join(dir, 'root');
  const arch = (await run('dpkg', ['--print-architecture'])).stdout.trim();
  const channels = channelsOf(packages);
  for (const [ch, pkgs] of channels) {
    const pool = join(repo, 'pool', ch);
    await mkdir(pool, { recursive: true });
    for (const p of pkgs) await placePackage(pool, p, `gateway_${p.version}_all.deb`, (out) => buildDeb(out, join(dir, 'build'), p));
  }
  const signer = await makeSigningKey(join(dir, 'gpg'));
  /** Indexes every channel's pool and signs the Release with the lab's key (at build, and after a package is replaced). */
  const index = async () => {
    for (const ch of channels.keys()) {
      const bin = join(repo, 'dists', codename, ch, `binary-${arch}`);
      await mkdir(bin, { recursive: true });
      const { stdout } = await run('apt-ftparchive', ['packages', join('pool', ch)], { cwd: repo });
      await replaceFile(join(bin, 'Packages'), stdout);
    }
    const { stdout: release } = await run(
      'apt-ftparchive',
      [
        '-o', `APT::FTPArchive::Release::Suite=${codename}`,
        '-o', `APT::FTPArchive::Release::Codename=${codename}`,
        '-o', `APT::FTPArchive::Release::Components=${[...channels.keys()].join(' ')}`,
        '-o', `APT::FTPArchive::Release::Architectures=${arch}`,
        'release', join('dists', codename),
      ],
      { cwd: repo },
    );
    await replaceFile(join(repo, 'dists', codename, 'Release'), release);
    const inRelease = join(repo, 'dists', codename, 'InRelease');
    await signer.clearsign(join(repo, 'dists', codename, 'Release'), `${inRelease}.new`);
    await rename(`${inRelease}.new`, inRelease);
  };
  await index();
  await linkTree(repo, `${repo}.orig`);

  for (const d of ['etc/apt/sources.list.d', 'etc/apt/apt.conf.d', 'etc/apt/preferences.d', 'var/lib/dpkg/info', 'var/lib/dpkg/updates', 'var/lib/apt/lists/partial', 'var/cache/apt/archives/partial', 'var/log/apt']) {
    await mkdir(join(root, d), { recursive: true });
  }
  await writeFile(join(root, 'var/lib/dpkg/status'), '');
  await writeFile(join(root, 'etc/os-release'), `ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=${codename}\n`);
  const aptConf = join(root, 'etc/apt/apt.conf');
  await writeFile(
    aptConf,
    [
      `Dir "${root}/";`,
      `Dir::State::status "${root}/var/lib/dpkg/status";`,
      `Dir::Etc::Parts "${root}/etc/apt/apt.conf.d";`,
      `Dir::Etc::PreferencesParts "${root}/etc/apt/preferences.d";`,
      `Dir::Log "${root}/var/log/apt";`,
      // --force-not-root: dpkg refuses to run for a normal user even with --root; into this root it can.
      // --force-script-chrootless: maintainer scripts run here with DPKG_ROOT set (the root has no /bin/sh).
      `DPkg::Options { "--force-not-root"; "--force-script-chrootless"; "--root=${root}"; "--admindir=${root}/var/lib/dpkg"; "--log=${root}/var/log/dpkg.log"; };`,
      'APT::Sandbox::User "root";',
      '',
    ].join('\n'),
  );
  const env = { APT_CONFIG: aptConf };
  const binary = join(root, 'usr/bin/gateway');
  // The repository's key, installed where the install guide puts it (in the root): apt checks InRelease with it.
  const keyring = join(root, APT_KEYRING_PATH);
  await mkdir(join(root, 'usr/share/keyrings'), { recursive: true });
  await writeFile(keyring, signer.publicKey);
  const sourceLine = (channel: string) => `deb [signed-by=${keyring}] file:${repo} ${codename} ${channel}\n`;
  const aptEnv = { PATH: process.env.PATH ?? '', ...env, DEBIAN_FRONTEND: 'noninteractive' };
  const lab: AptLab = {
    dir,
    repo,
    root,
    env,
    codename,
    binary,
    sourceLine,
    async install(version, pkgs = ['gateway']) {
      const ch = `stable/v${version.split('.')[0]}`;
      const tmpList = join(dir, `setup-${ch.replace('/', '-')}.list`);
      await writeFile(tmpList, sourceLine(ch));
      const only = ['-o', `Dir::Etc::SourceList=${tmpList}`, '-o', 'Dir::Etc::SourceParts=-', '-o', 'APT::Get::List-Cleanup=0'];
      await run('apt-get', ['update', '-qq', ...only], { env: aptEnv });
      await run('apt-get', ['install', '-y', '-qq', '--allow-downgrades', ...only, ...pkgs.map((p) => `${p}=${version.replace('-', '~')}`)], { env: aptEnv });
    },
    async installed() {
      return (await run(binary, ['--version'])).stdout.trim();
    },
    async replacePackage(channel, file) {
      const dest = join(repo, 'pool', channel, basename(file));
      await copyFile(file, `${dest}.new`);
      await rename(`${dest}.new`, dest);
      await index();
    },
    tamperPackage: (channel, version) => flipLastByte(join(repo, 'pool', channel, `gateway_${version}_all.deb`)),
    async resignWithOtherKey() {
      const other = await makeSigningKey(join(dir, 'gpg-other'));
      const inRelease = join(repo, 'dists', codename, 'InRelease');
      await other.clearsign(join(repo, 'dists', codename, 'Release'), `${inRelease}.new`);
      await rename(`${inRelease}.new`, inRelease);
    },
    async corruptMetadata(channel) {
      await replaceFile(join(repo, 'dists', codename, channel, `binary-${arch}`, 'Packages'), 'Package gateway\n\x00garbage\n');
    },
    async restore() {
      await rm(repo, { recursive: true, force: true });
      await linkTree(`${repo}.orig`, repo);
    },
    cleanup: () => cleanupLab(dir),
  };
  return lab;
}

export interface Tarball {
  name: string;
  body: Buffer;
  sha256: string;
}

/** gateway-ent-v<version>-linux-<arch>-bin.tar.gz holding gateway/{install,gateway,README}. */
export async function makeTarball(version: string, arch: string, options: { healthy?: boolean } = {}): Promise<Tarball> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-tarball-'));
  try {
    const top = join(dir, 'gateway');
    await mkdir(top);
    await writeFile(join(top, 'gateway'), await fakeGatewayScript(version, options.healthy !== false), { mode: 0o755 });
    await copyFile(new URL('tarball-install.sh', FIXTURES), join(top, 'install'));
    await chmod(join(top, 'install'), 0o755);
    await writeFile(join(top, 'README'), `Gateway ${version}\n`);
    const name = `gateway-ent-v${version}-linux-${arch}-bin.tar.gz`;
    await run('tar', ['-czf', join(dir, name), '-C', dir, 'gateway']);
    const body = await readFile(join(dir, name));
    return { name, body, sha256: createHash('sha256').update(body).digest('hex') };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A shell script file (mode 0755). */
export async function writeScript(path: string, body: string): Promise<string> {
  await writeFile(path, `#!/bin/sh\n${body}\n`, { mode: 0o755 });
  await chmod(path, 0o755);
  return path;
}

// --- the tarball path's servers: releases over https, and a Proxy's version server ----------------------------

/** The release download server's answers: files by path (404 otherwise), special paths answered their own way. */
export interface ReleaseFiles {
  files: Map<string, Buffer | string>;
  /** Every path asked, in order. */
  requests: string[];
  /** Paths answered in their own way (a cut connection, a lying Content-Length). */
  special?: Map<string, (res: ServerResponse) => void>;
}

/** The release tarballs' download server: https on ip with a certificate of the test CA for name. */
export async function startReleaseServer(pki: TestPki, name: string, ip: string, releases: ReleaseFiles): Promise<HttpTestServer> {
  const cert = await pki.serverCert({ names: [name], ips: [ip] });
  return startHttpsServer(
    { cert: cert.certPem, key: cert.keyPem },
    (req, res) => {
      releases.requests.push(req.url ?? '');
      const own = releases.special?.get(req.url ?? '');
      if (own) return own(res);
      const body = releases.files.get(req.url ?? '');
      if (body === undefined) {
        res.writeHead(404);
        res.end();
        return;
      }
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    },
    ip,
  );
}

/**
 * A Proxy as the upgrader sees it, over https on 127.0.0.1 (proxy.gw.test): the real version server with these
 * channels, and a ping naming ownVersion as the cluster's server_version for every other path.
 */
export async function startVersionProxy(pki: TestPki, ownVersion: string, channels: Record<string, { static_version?: string; forward_url?: string }> = {}): Promise<HttpTestServer> {
  const cert = await pki.serverCert({ names: ['proxy.gw.test'], ips: ['127.0.0.1'] });
  const vs = new VersionServer({ ownVersion, channels, dialer: new Dialer({ env: {} }) });
  return startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    if (vs.handle(req, res)) return;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ server_version: ownVersion }));
  });
}

/**
 * gateway-upgrade's environment for the tarball path under root: releases from downloadUrl through the proxy at
 * httpsProxy (the version server on 127.0.0.1 directly), the installed gateway in bin, restarts by restart.
 */
export function tarballUpgradeEnv(o: {
  root: string;
  bin: string;
  downloadUrl: string;
  caFile: string;
  restart: string;
  health: { command: string; timeout: string; poll: string };
  httpsProxy: string;
}): Record<string, string> {
  return {
    GATEWAY_UPGRADE_ROOT: o.root,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball',
    GATEWAY_UPGRADE_ARCH: 'x64',
    GATEWAY_UPGRADE_DOWNLOAD_URL: o.downloadUrl,
    GATEWAY_UPGRADE_CA_FILE: o.caFile,
    GATEWAY_UPGRADE_VERSION_COMMAND: `${o.bin}/gateway --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: o.restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: o.health.command,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: o.health.timeout,
    GATEWAY_UPGRADE_HEALTH_POLL: o.health.poll,
    HTTPS_PROXY: o.httpsProxy,
    NO_PROXY: '127.0.0.1',
  };
}

// --- rpm repositories: dnf and zypper ----------------------------------------------------------------------------

export type RpmManager = 'dnf' | 'zypper';

export interface RpmLab {
  dir: string;
  /** Holds one createrepo_c repository per channel: <repo>/stable/v17, <repo>/stable/rolling. */
  repo: string;
  /** The temporary root dnf (--installroot) or zypper (--root) installs into. */
  root: string;
  manager: RpmManager;
  /** The arguments that point the manager at the root: GATEWAY_UPGRADE_PM_ARGS. */
  pmArgs: string[];
  /** Environment for the manager (a fixed HOME: Debian's rpm keeps its database in ~/.rpmdb, under the root). */
  env: Record<string, string>;
  binary: string;
  /** Where the repository entry is: <root>/etc/yum.repos.d/gateway.repo (dnf) or <root>/etc/zypp/repos.d/gateway.repo. */
  repoFile: string;
  /** The .repo entry for a channel (gpgcheck off: the test repository is not signed). */
  repoText(channel: string): string;
  /** Installs a version of packages (default: gateway) directly with the manager (test setup). */
  install(version: string, pkgs?: string[]): Promise<void>;
  /** `rpm -q gateway` in the root. */
  query(): Promise<string>;
  /** What `<root>/usr/bin/gateway --version` says. */
  installed(): Promise<string>;
  /** Flips the last byte of a package file on a channel: same size, another checksum than its metadata says. */
  tamperPackage(channel: string, version: string): Promise<void>;
  /** Signs a new repomd.xml on a channel whose primary.xml.gz checksum is not the file's (a mirror mid-sync). */
  corruptMetadata(channel: string): Promise<void>;
  /** Changes a channel's repomd.xml and signs it with another key than the one the entry names. */
  resignWithOtherKey(channel: string): Promise<void>;
  /** Puts the repository back as it was built. */
  restore(): Promise<void>;
  cleanup(): Promise<void>;
}

const rpmVersion = (v: string) => v.replace('-', '~');

async function buildRpm(topdir: string, pkg: TestPackage): Promise<string> {
  const specs = join(topdir, 'SPECS');
  await mkdir(specs, { recursive: true });
  const script = await fakeGatewayScript(pkg.version, pkg.healthy !== false);
  const spec = join(specs, `gateway-${pkg.version}.spec`);
  await writeFile(join(specs, `gateway-${pkg.version}.sh`), script);
  await writeFile(
    spec,
    [
      'Name: gateway',
      `Version: ${rpmVersion(pkg.version)}`,
      'Release: 1',
      'Summary: fake gateway for the upgrader tests',
      'License: Apache-2.0',
      'BuildArch: noarch',
      // The root has no base system whose /bin/sh a generated dependency could name.
      'AutoReqProv: no',
      '%description',
      'A stand-in gateway binary (fixtures/upgrade/fake-gateway.sh).',
      '%install',
      'mkdir -p %{buildroot}/usr/bin',
      `install -m 0755 ${join(specs, `gateway-${pkg.version}.sh`)} %{buildroot}/usr/bin/gateway`,
      '%files',
      '/usr/bin/gateway',
      '',
    ].join('\n'),
  );
  await run('rpmbuild', ['-bb', '--quiet', '--define', `_topdir ${topdir}`, '--define', '_binary_payload w1.gzdio', spec]);
  return join(topdir, 'RPMS', 'noarch', `gateway-${rpmVersion(pkg.version)}-1.noarch.rpm`);
}

export async function makeRpmLab(manager: RpmManager, packages: TestPackage[]): Promise<RpmLab> {
  const dir = await mkdtemp(join(tmpdir(), `gw-${manager}-`));
  await chmod(dir, 0o755);
  const repo = join(dir, 'repo');
  const root = join(dir, 'root');
  const built = new Map<string, string>();
  for (const p of packages) if (!p.files) built.set(p.version, await buildRpm(join(dir, 'rpmbuild'), p));
  for (const [ch, pkgs] of channelsOf(packages)) {
    await mkdir(join(repo, ch), { recursive: true });
    for (const p of pkgs) await placePackage(join(repo, ch), p, `gateway-${rpmVersion(p.version)}-1.noarch.rpm`, (out) => copyFile(built.get(p.version)!, out));
    await run('createrepo_c', ['--quiet', '--no-database', join(repo, ch)]);
  }
  // repomd.xml signed (repomd.xml.asc) with a key of the lab's own; the entries check it (repo_gpgcheck).
  const signer = await makeSigningKey(join(dir, 'gpg'));
  const keyFile = join(dir, 'gateway-repo-key.asc');
  await writeFile(keyFile, signer.publicKey);
  for (const ch of channelsOf(packages).keys()) await signer.detachSign(join(repo, ch, 'repodata', 'repomd.xml'));
  await linkTree(repo, `${repo}.orig`);
  const repoDir = manager === 'dnf' ? 'etc/yum.repos.d' : 'etc/zypp/repos.d';
  await mkdir(join(root, repoDir), { recursive: true });
  await writeFile(join(root, 'etc/os-release'), 'ID=rhel\nVERSION_ID="9"\n');
  const pmArgs = manager === 'dnf' ? [`--installroot=${root}`, '--releasever=9'] : ['--root', root];
  const env = { PATH: process.env.PATH ?? '', HOME: '/root' };
  const binary = join(root, 'usr/bin/gateway');
  const repoText = (channel: string) =>
    // gpgcheck=0: the packages themselves are not signed (their checksums are in the signed metadata).
    ['[gateway]', 'name=Gateway', `baseurl=file://${repo}/${channel}`, 'enabled=1', 'autorefresh=1', 'type=rpm-md', 'gpgcheck=0', 'repo_gpgcheck=1', `gpgkey=file://${keyFile}`, ''].join('\n');
  const repoFile = join(root, repoDir, 'gateway.repo');
  const lab: RpmLab = {
    dir,
    repo,
    root,
    manager,
    pmArgs,
    env,
    binary,
    repoFile,
    repoText,
    async install(version, pkgs = ['gateway']) {
      await writeFile(repoFile, repoText(`stable/v${version.split('.')[0]}`));
      const spec = rpmVersion(version);
      if (manager === 'dnf') {
        // dnf installs an older version with `downgrade`, the same one again with `reinstall`.
        const installed = await lab.query().catch(() => '');
        const verb = installed.startsWith(`gateway-${spec}-`) ? 'reinstall' : installed.startsWith('gateway-') ? 'downgrade' : 'install';
        await run('dnf', [...pmArgs, '-y', '-q', '--refresh', verb, ...pkgs.map((p) => `${p}-${spec}`)], { env });
        return;
      }
      const base = ['--non-interactive', '--quiet', '--root', root];
      // Trusting the repository's key is part of registering it (dnf -y imports it by itself).
      await run('zypper', [...base, '--gpg-auto-import-keys', 'refresh', 'gateway'], { env });
      await run('zypper', [...base, 'install', '--oldpackage', '--force', '--from', 'gateway', ...pkgs.map((p) => `${p}=${spec}`)], { env });
    },
    async query() {
      return (await run('rpm', ['--root', root, '-q', 'gateway'], { env })).stdout.trim();
    },
    async installed() {
      return (await run(binary, ['--version'])).stdout.trim();
    },
    tamperPackage: (channel, version) => flipLastByte(join(repo, channel, `gateway-${rpmVersion(version)}-1.noarch.rpm`)),
    async corruptMetadata(channel) {
      // A mirror in the middle of a sync: a new repomd.xml, correctly signed, whose primary.xml.gz has not arrived
      // (the file there is the old one: its checksum is not the one repomd.xml gives).
      const repomd = join(repo, channel, 'repodata', 'repomd.xml');
      const text = await readFile(repomd, 'utf8');
      const primary = /<data type="primary">\s*<checksum type="sha256">([0-9a-f]{64})<\/checksum>/.exec(text);
      if (!primary) throw new Error(`no primary checksum in ${repomd}`);
      await replaceFile(repomd, text.replace(primary[1]!, createHash('sha256').update('not yet synced').digest('hex')));
      await signer.detachSign(repomd);
    },
    async resignWithOtherKey(channel) {
      const other = await makeSigningKey(join(dir, 'gpg-other'));
      const repomd = join(repo, channel, 'repodata', 'repomd.xml');
      // New metadata (a manager re-checks a signature only when repomd.xml changed), signed by someone else.
      await replaceFile(repomd, `${await readFile(repomd, 'utf8')}<!-- changed -->\n`);
      await other.detachSign(repomd);
    },
    async restore() {
      await rm(repo, { recursive: true, force: true });
      await linkTree(`${repo}.orig`, repo);
    },
    cleanup: () => cleanupLab(dir),
  };
  return lab;
}
