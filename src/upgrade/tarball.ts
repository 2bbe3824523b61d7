/**
 * Tarball installs:
 *
 *   {download_url}/gateway-ent-v<version>-linux-<arch>[-fips]-bin.tar.gz   and the same name + ".sha256"
 *
 * The tarball is downloaded through the Dialer (a progress bar on a terminal), its SHA-256 compared with the
 * .sha256 file, and only then extracted (GNU tar, no owners kept) and its install script run. The tarball holds
 * one top directory with an `install` script and the binaries; the script is run from that directory with
 * GATEWAY_BIN_DIR set to where the binaries go (/usr/local/bin by default). Before it runs, the binaries it is
 * about to replace are copied aside, so a failed upgrade can put them back.
 */
import { createReadStream } from 'node:fs';
import { chmod, copyFile, mkdir, readdir, rename, stat, unlink } from 'node:fs/promises';
import { createGunzip } from 'node:zlib';
import { basename, join } from 'node:path';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { fetchThroughDialer } from '../dial/agent.js';
import { trustedCas } from './client.js';
import { download } from './download.js';
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
    const r = await fetchThroughDialer(sumUrl, { dialer: deps.dialer, timeoutMs: 30_000, maxBodyBytes: 4096, ...(ca ? { ca } : {}) });
    if (r.status !== 200) throw new GatewayError('GW_ERR_UPGRADE_DOWNLOAD', `cannot download ${sumUrl}: HTTP ${r.status}`, { details: { url: sumUrl } });
    sumText = r.body.toString('utf8');
  } catch (err) {
    if (err instanceof GatewayError && err.code === 'GW_ERR_UPGRADE_DOWNLOAD') throw err;
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
  /** The binaries that were replaced, copied aside: puts them back. */
  restore(): Promise<void>;
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

/** Extracts a verified tarball and runs its install script. Throws GW_ERR_UPGRADE_INSTALL (after restoring). */
export async function installTarball(tarball: string, deps: TarballDeps): Promise<TarballInstall> {
  await checkTarballEntries(tarball, deps.tarLimits);
  const into = join(deps.workDir, 'extract');
  await mkdir(into, { recursive: true });
  const x = await runCommand(['tar', '-xzf', tarball, '-C', into, '--no-same-owner', '--no-same-permissions', '--no-overwrite-dir'], { timeoutMs: deps.commandTimeoutMs, ...(deps.env ? { env: deps.env } : {}) });
  if (x.code !== 0) {
    throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `cannot extract ${basename(tarball)}: tar ${describeExit('tar', x)}: ${lastLines(x)}; nothing was installed`);
  }
  const entries = await readdir(into, { withFileTypes: true });
  const dirs = entries.filter((e) => e.isDirectory());
  const top = dirs.length === 1 && entries.length === 1 ? join(into, dirs[0]!.name) : into;
  const script = join(top, 'install');
  const st = await stat(script).catch(() => undefined);
  if (!st?.isFile()) {
    throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `${basename(tarball)} has no install script (expected ${basename(top)}/install); nothing was installed`);
  }
  // Copy aside what the install is about to replace.
  const backupDir = join(deps.workDir, 'previous');
  await mkdir(backupDir, { recursive: true });
  const saved: Array<{ name: string; mode: number }> = [];
  for (const e of await readdir(top, { withFileTypes: true })) {
    if (!e.isFile() || e.name === 'install') continue;
    const mode = (await stat(join(top, e.name))).mode;
    if ((mode & 0o111) === 0) continue; // README, examples: not binaries
    const existing = await stat(join(deps.binDir, e.name)).catch(() => undefined);
    if (!existing?.isFile()) continue;
    await copyFile(join(deps.binDir, e.name), join(backupDir, e.name));
    saved.push({ name: e.name, mode: existing.mode & 0o7777 });
  }
  const restore = async () => {
    await mkdir(deps.binDir, { recursive: true });
    for (const s of saved) {
      const dest = join(deps.binDir, s.name);
      // Replace, not overwrite in place: a running binary cannot be written ("text file busy").
      const tmp = `${dest}.gateway-upgrade-restore`;
      await copyFile(join(backupDir, s.name), tmp);
      await chmod(tmp, s.mode);
      await rename(tmp, dest);
    }
  };
  await chmod(script, 0o755);
  const r = await runCommand([script], {
    cwd: top,
    env: { ...(deps.env ?? process.env), GATEWAY_BIN_DIR: deps.binDir },
    echo: deps.stderr,
    timeoutMs: deps.commandTimeoutMs,
  });
  if (r.code !== 0) {
    let restored = 'the previous binaries were put back';
    try {
      await restore();
    } catch (err) {
      restored = `putting the previous binaries back failed too (${toGatewayError(err).message})`;
    }
    throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `the install script of ${basename(tarball)} failed (${describeExit('install', r, deps.commandTimeoutMs)}): ${lastLines(r)}; ${restored}`);
  }
  return { restore };
}
