/**
 * Tarball installs:
 *
 *   {download_url}/gateway-ent-v<version>-linux-<arch>[-fips]-bin.tar.gz   and the same name + ".sha256"
 *
 * The tarball is downloaded through the Dialer (a progress bar on a terminal; capped in size, a short body is a
 * failure), its SHA-256 compared with the .sha256 file, then every entry checked (tarentries.ts: nothing outside
 * the archive, no devices, bounded size), and only then extracted (GNU tar, no owners kept) and its install script
 * run. The tarball holds one top directory with an `install` (or `install.sh`) script and the commands (at the top
 * or in bin/); the script is run from that directory with GATEWAY_BIN_DIR (where the commands go,
 * /usr/local/bin by default) and GATEWAY_LIB_DIR (the app directory, lib/gateway next to it). Before it runs,
 * what it may replace is saved: the commands of the same names in GATEWAY_BIN_DIR (files or symbolic links, or
 * their absence) and GATEWAY_LIB_DIR (hard-linked next to itself), so a failed upgrade puts back exactly what was
 * there. The install script must replace files (write a new one, rename it over), never write into one: the
 * running service has them open, and the hard links must keep the old bytes. The release's script (scripts/package/
 * tarball.mjs) installs the app into GATEWAY_LIB_DIR/<version> and then the commands, which point at it.
 */
import { createReadStream } from 'node:fs';
import { chmod, copyFile, lstat, mkdir, readdir, readlink, rename, rm, stat, symlink, unlink } from 'node:fs/promises';
import { createGunzip } from 'node:zlib';
import { basename, dirname, join } from 'node:path';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { fetchThroughDialer } from '../dial/agent.js';
import { trustedCas } from './client.js';
import { download, releaseServerIdentity } from './download.js';
import { describeExit, lastLines, runCommand } from './exec.js';
import { progressBar } from './progress.js';
import type { TarballArch } from './settings.js';
import { TarScanner, type TarLimits, type TarSummary } from './tarentries.js';

export function tarballName(version: string, arch: TarballArch, fips: boolean): string {
  return `gateway-ent-v${version.replace(/^v/, '')}-linux-${arch}${fips ? '-fips' : ''}-bin.tar.gz`;
}

/** The hex digest from a .sha256 file ("<hex>  <name>" as sha256sum writes it, or the bare digest). */
export function parseSha256File(text: string, url: string): string {
  const m = /^\s*([0-9a-fA-F]{64})(?:\s+\*?(\S+))?\s*$/m.exec(text);
  if (!m) throw new GatewayError('GW_ERR_UPGRADE_DOWNLOAD', `${url} is not a SHA-256 checksum file (expected "<64 hex digits>  <file name>")`, { details: { url } });
  return m[1]!.toLowerCase();
}

export interface TarballDeps {
  dialer: Dialer;
  ca?: string[];
  stderr: NodeJS.WritableStream & { isTTY?: boolean };
  downloadUrl: string;
  arch: TarballArch;
  fips: boolean;
  binDir: string;
  /** A fresh directory for this run (download, extraction, backups). */
  workDir: string;
  commandTimeoutMs: number;
  env?: NodeJS.ProcessEnv;
  /** Caps of the entry check (defaults: tarentries.ts). */
  tarLimits?: Partial<TarLimits>;
  /** Cap of the download (default: download.ts). */
  maxDownloadBytes?: number;
}

/** Downloads and checks the tarball; returns its path. Throws GW_ERR_UPGRADE_DOWNLOAD / GW_ERR_UPGRADE_CHECKSUM. */
export async function fetchVerifiedTarball(version: string, deps: TarballDeps): Promise<string> {
  const name = tarballName(version, deps.arch, deps.fips);
  const url = `${deps.downloadUrl}/${name}`;
  const sumUrl = `${url}.sha256`;
  const ca = trustedCas(deps.ca);
  let sumText: string;
  try {
    const r = await fetchThroughDialer(sumUrl, { dialer: deps.dialer, timeoutMs: 30_000, maxBodyBytes: 4096, ...(ca ? { ca } : {}), checkServerIdentity: releaseServerIdentity });
    if (r.status !== 200) throw new GatewayError('GW_ERR_UPGRADE_DOWNLOAD', `cannot download ${sumUrl}: HTTP ${r.status}`, { details: { url: sumUrl } });
    sumText = r.body.toString('utf8');
  } catch (err) {
    // A cluster member's certificate at the download location keeps its own code and hint (releaseServerIdentity).
    if (err instanceof GatewayError && (err.code === 'GW_ERR_UPGRADE_DOWNLOAD' || err.code === 'GW_ERR_TLS_WRONG_ROLE')) throw err;
    throw new GatewayError('GW_ERR_UPGRADE_DOWNLOAD', `cannot download ${sumUrl}: ${toGatewayError(err).message}`, { cause: err, details: { url: sumUrl } });
  }
  const expected = parseSha256File(sumText, sumUrl);
  const dest = join(deps.workDir, name);
  let bar: ReturnType<typeof progressBar> | undefined;
  const got = await download(url, dest, {
    dialer: deps.dialer,
    ...(deps.ca ? { ca: deps.ca } : {}),
    ...(deps.maxDownloadBytes !== undefined ? { maxBytes: deps.maxDownloadBytes } : {}),
    onStart: (total) => (bar = progressBar(deps.stderr, name, total)),
    onProgress: (bytes) => bar?.update(bytes),
  });
  bar?.done();
  if (got.sha256 !== expected) {
    await unlink(dest).catch(() => undefined);
    throw new GatewayError(
      'GW_ERR_UPGRADE_CHECKSUM',
      `checksum mismatch for ${name}: ${basename(sumUrl)} says sha256 ${expected}, the download has ${got.sha256}; nothing was extracted or installed`,
      { details: { url, expected, actual: got.sha256 } },
    );
  }
  return dest;
}

export interface TarballInstall {
  /** Puts back what the install replaced: the commands in the bin directory (files or links) and the app directory. */
  restore(): Promise<void>;
  /** The upgrade went through: removes the copy of the previous app directory. */
  discard(): Promise<void>;
}

/**
 * Reads the whole (verified) tarball through gunzip and TarScanner: nothing is extracted unless every entry stays
 * inside, and it is a gzip tar of bounded size. Throws GW_ERR_UPGRADE_TARBALL.
 */
export async function checkTarballEntries(tarball: string, limits: Partial<TarLimits> = {}): Promise<TarSummary> {
  const scanner = new TarScanner(limits);
  const input = createReadStream(tarball);
  const gunzip = createGunzip();
  try {
    await new Promise<void>((resolve, reject) => {
      const fail = (err: unknown) => {
        input.destroy();
        gunzip.destroy();
        reject(err);
      };
      input.on('error', fail);
      gunzip.on('error', (err) =>
        fail(err instanceof GatewayError ? err : new GatewayError('GW_ERR_UPGRADE_TARBALL', `the release tarball is not safe to extract: ${basename(tarball)} is not a gzip file (${err.message}); nothing was extracted or installed`)),
      );
      gunzip.on('data', (chunk: Buffer) => {
        try {
          scanner.push(chunk);
        } catch (err) {
          fail(err);
        }
      });
      gunzip.on('end', resolve);
      input.pipe(gunzip);
    });
  } finally {
    input.destroy();
  }
  return scanner.end();
}

/** One path the install may replace, as it was: a file (copied aside), a symbolic link, a directory, or nothing. */
interface Saved {
  path: string;
  kind: 'file' | 'symlink' | 'dir' | 'absent';
  mode?: number;
  link?: string;
  copy?: string;
}

async function save(path: string, copy: string, timeoutMs: number): Promise<Saved> {
  const st = await lstat(path).catch(() => undefined);
  if (!st) return { path, kind: 'absent' };
  if (st.isSymbolicLink()) return { path, kind: 'symlink', link: await readlink(path) };
  if (st.isDirectory()) {
    // Next to it (same file system: put back with a rename), as hard links: nothing is copied, and since an
    // install replaces files (writes new ones, renames) rather than writing into them, the links keep the old bytes.
    await rm(copy, { recursive: true, force: true });
    const r = await runCommand(['cp', '-al', path, copy], { timeoutMs });
    if (r.code !== 0) throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `cannot copy ${path} aside before installing: ${lastLines(r)}; nothing was installed`);
    return { path, kind: 'dir', copy };
  }
  await copyFile(path, copy);
  return { path, kind: 'file', mode: st.mode & 0o7777, copy };
}

/** Puts one saved path back; each step replaces by rename, never writes into a file a running process has open. */
async function putBack(s: Saved): Promise<void> {
  const tmp = `${s.path}.gateway-upgrade-restore`;
  await rm(tmp, { recursive: true, force: true });
  if (s.kind === 'absent') return rm(s.path, { recursive: true, force: true });
  if ((await lstat(s.path).catch(() => undefined))?.isDirectory() && s.kind !== 'dir') await rm(s.path, { recursive: true, force: true });
  if (s.kind === 'symlink') {
    await symlink(s.link!, tmp);
    return rename(tmp, s.path);
  }
  if (s.kind === 'file') {
    await copyFile(s.copy!, tmp);
    await chmod(tmp, s.mode!);
    return rename(tmp, s.path);
  }
  await rename(s.path, tmp).catch(() => undefined);
  await rename(s.copy!, s.path);
  await rm(tmp, { recursive: true, force: true });
}

/** The install script: `install`, or `install.sh`, in the tarball's top directory. */
async function findScript(top: string, tarball: string): Promise<string> {
  for (const name of ['install', 'install.sh']) {
    const st = await stat(join(top, name)).catch(() => undefined);
    if (st?.isFile()) return join(top, name);
  }
  throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `${basename(tarball)} has no install script (expected ${basename(top)}/install or install.sh); nothing was installed`);
}

/** The commands the tarball carries (executables at its top or in bin/): the names the install puts in binDir. */
async function commandNames(top: string): Promise<string[]> {
  const names = new Set<string>();
  for (const dir of [top, join(top, 'bin')]) {
    for (const e of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
      if (e.name === 'install' || e.name === 'install.sh' || !(e.isFile() || e.isSymbolicLink())) continue;
      const st = await stat(join(dir, e.name)).catch(() => undefined);
      if (st?.isFile() && (st.mode & 0o111) !== 0) names.add(e.name); // README, examples: not commands
    }
  }
  return [...names].sort();
}

/** The app directory a tarball install uses: lib/gateway next to the bin directory (/usr/local/lib/gateway). */
export const tarballLibDir = (binDir: string): string => join(dirname(binDir), 'lib', 'gateway');

/**
 * Extracts a verified tarball and runs its install script with GATEWAY_BIN_DIR and GATEWAY_LIB_DIR. What it may
 * replace (the tarball's commands in the bin directory, the app directory) is saved first. Throws
 * GW_ERR_UPGRADE_INSTALL (after putting everything back).
 */
export async function installTarball(tarball: string, deps: TarballDeps): Promise<TarballInstall> {
  try {
    await checkTarballEntries(tarball, deps.tarLimits);
  } catch (err) {
    // The hint names the release as downloaded (the registry's can only name the setting it came from).
    if (!(err instanceof GatewayError) || err.code !== 'GW_ERR_UPGRADE_TARBALL') throw err;
    const url = `${deps.downloadUrl}/${basename(tarball)}`;
    throw new GatewayError(err.code, err.message, {
      hint: `A release tarball never holds these: ${url} is broken or not genuine. Tell its publisher, do not install it by hand, and run 'gateway-upgrade run' again once it is replaced.`,
      cause: err,
      details: { ...(err.details ?? {}), url },
    });
  }
  const into = join(deps.workDir, 'extract');
  await mkdir(into, { recursive: true });
  const x = await runCommand(['tar', '-xzf', tarball, '-C', into, '--no-same-owner', '--no-same-permissions', '--no-overwrite-dir'], { timeoutMs: deps.commandTimeoutMs, ...(deps.env ? { env: deps.env } : {}) });
  if (x.code !== 0) {
    throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `cannot extract ${basename(tarball)}: tar ${describeExit('tar', x)}: ${lastLines(x)}; nothing was installed`);
  }
  const entries = await readdir(into, { withFileTypes: true });
  const dirs = entries.filter((e) => e.isDirectory());
  const top = dirs.length === 1 && entries.length === 1 ? join(into, dirs[0]!.name) : into;
  const script = await findScript(top, tarball);
  const libDir = tarballLibDir(deps.binDir);
  const backupDir = join(deps.workDir, 'previous');
  await mkdir(backupDir, { recursive: true });
  const saved: Saved[] = [];
  for (const name of await commandNames(top)) saved.push(await save(join(deps.binDir, name), join(backupDir, name), deps.commandTimeoutMs));
  saved.push(await save(libDir, `${libDir}.gateway-upgrade-previous`, deps.commandTimeoutMs));
  const restore = async () => {
    await mkdir(deps.binDir, { recursive: true });
    for (const s of saved) await putBack(s);
  };
  const discard = async () => {
    for (const s of saved) if (s.kind === 'dir') await rm(s.copy!, { recursive: true, force: true });
  };
  await chmod(script, 0o755);
  const r = await runCommand([script], {
    cwd: top,
    env: { ...(deps.env ?? process.env), GATEWAY_BIN_DIR: deps.binDir, GATEWAY_LIB_DIR: libDir },
    echo: deps.stderr,
    timeoutMs: deps.commandTimeoutMs,
  });
  if (r.code !== 0) {
    let restored = 'the previous files were put back';
    try {
      await restore();
    } catch (err) {
      restored = `putting the previous files back failed too (${toGatewayError(err).message})`;
    }
    throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `the install script of ${basename(tarball)} failed (${describeExit('install', r, deps.commandTimeoutMs)}): ${lastLines(r)}; ${restored}`);
  }
  return { restore, discard };
}
