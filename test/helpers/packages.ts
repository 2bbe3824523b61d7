/**
 * The real packages (`npm run package`, scripts/package/build.mjs) for tests, built once per set of inputs and
 * shared by every test file and worktree run on the machine:
 *
 *   const pkgs = await buildPackages({ version: '17.0.1' });
 *   pkgs.debs.gateway, pkgs.rpms['gateway-ent-updater'], pkgs.tarballs.default.tarball, ...
 *
 * The cache directory is <tmpdir>/gateway-packages-<uid>/<version>-<hash>, the hash covering every input: the built
 * dist/ (without source maps), scripts/package/, package.json, package-lock.json, and this Node.js (its version
 * and path: the runtime packed into the packages). A build in progress in another process (another test file,
 * another vitest worker) is waited for rather than repeated: a lock directory holds the builder's pid, and a lock
 * whose process is gone is taken over. The build writes into a temporary directory renamed into place at the end,
 * so a half-built cache is never seen.
 *
 * dist/ must be built (`npm test` builds it first; otherwise `npm run build`).
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const ROOT = new URL('../../', import.meta.url).pathname;

export type ServerPackage = 'gateway' | 'gateway-ent-fips';
export type PackageName = ServerPackage | 'gateway-ent-updater';

export interface BuiltTarball {
  tarball: string;
  sha256: string;
}

export interface BuiltPackages {
  /** The cache directory holding everything below. */
  dir: string;
  /** The semver version (17.0.1, 17.0.0-dev). */
  version: string;
  /** As Debian and RPM spell it (17.0.0~dev); no Debian revision, RPM release 1. */
  packageVersion: string;
  /** amd64 / arm64 / arm. */
  arch: string;
  /** Whether the -fips wrappers start Node.js in OpenSSL FIPS mode (only with a FIPS provider). */
  fipsMode: boolean;
  debs: Record<PackageName, string>;
  rpms: Record<PackageName, string>;
  tarballs: { default: BuiltTarball; fips: BuiltTarball };
  /** How long each step of the build took, in seconds (only when this call built them). */
  seconds: Record<string, number>;
}

interface Manifest {
  version: string;
  packageVersion: string;
  arch: string;
  fipsMode: boolean;
  packages: Record<PackageName, { deb: string; rpm: string }>;
  tarballs: { default: BuiltTarball; fips: BuiltTarball };
  seconds: Record<string, number>;
}

function hashTree(hash: ReturnType<typeof createHash>, dir: string, skip: (path: string) => boolean): void {
  for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const p = join(dir, e.name);
    if (skip(p)) continue;
    if (e.isDirectory()) hashTree(hash, p, skip);
    else if (e.isFile()) hash.update(`${p.slice(ROOT.length)}\0`).update(readFileSync(p)).update('\0');
  }
}

/** The hash of every input of a build (see above). */
export function packageInputsHash(): string {
  const dist = join(ROOT, 'dist');
  if (!existsSync(join(dist, 'cli', 'gateway.js'))) throw new Error('dist/ is not built: run `npm run build` first (npm test does)');
  const hash = createHash('sha256');
  hash.update(`${process.version}\0${process.execPath}\0`);
  for (const f of ['package.json', 'package-lock.json']) hash.update(readFileSync(join(ROOT, f)));
  hashTree(hash, join(ROOT, 'scripts/package'), () => false);
  hashTree(hash, dist, (p) => p.endsWith('.map') || p === join(dist, 'packages'));
  return hash.digest('hex').slice(0, 16);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Takes the lock, or returns false while another live process holds it. */
function tryLock(lock: string): boolean {
  try {
    mkdirSync(lock);
    writeFileSync(join(lock, 'pid'), String(process.pid));
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    let pid = NaN;
    try {
      pid = Number(readFileSync(join(lock, 'pid'), 'utf8'));
    } catch {
      return false; // just created by another process, its pid not written yet
    }
    if (Number.isInteger(pid) && alive(pid)) return false;
    rmSync(lock, { recursive: true, force: true }); // its builder died
    return tryLock(lock);
  }
}

function readBuilt(dir: string, seconds: Record<string, number> = {}): BuiltPackages {
  const m = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as Manifest;
  const pick = (kind: 'deb' | 'rpm') => Object.fromEntries(Object.entries(m.packages).map(([k, v]) => [k, join(dir, v[kind].split('/').pop()!)])) as Record<PackageName, string>;
  const tar = (t: BuiltTarball): BuiltTarball => ({ tarball: join(dir, t.tarball.split('/').pop()!), sha256: join(dir, t.sha256.split('/').pop()!) });
  return {
    dir,
    version: m.version,
    packageVersion: m.packageVersion,
    arch: m.arch,
    fipsMode: m.fipsMode,
    debs: pick('deb'),
    rpms: pick('rpm'),
    tarballs: { default: tar(m.tarballs.default), fips: tar(m.tarballs.fips) },
    seconds,
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Builds of other inputs not used for a day (about 300 MB each) go; a locked or recent one stays. */
function pruneCache(cache: string): void {
  const dayAgo = Date.now() - 24 * 3600_000;
  for (const name of readdirSync(cache)) {
    const p = join(cache, name);
    if (name.endsWith('.lock')) continue;
    try {
      if (existsSync(`${p.replace(/\.tmp-\d+$/, '')}.lock`) || statSync(p).mtimeMs > dayAgo) continue;
      rmSync(p, { recursive: true, force: true });
    } catch {
      // another process removed it first
    }
  }
}

/**
 * This user's cache directory, <tmpdir>/gateway-packages-<uid>, mode 0700 and owned by this user: never one another
 * user made (in a shared /tmp another user could hand root's tests packages of their own, or the two would fight
 * over one directory's times and locks, as a normal user's run after root's did).
 */
function packageCache(): string {
  const uid = process.getuid?.() ?? 0;
  const cache = join(tmpdir(), `gateway-packages-${uid}`);
  mkdirSync(cache, { recursive: true, mode: 0o700 });
  const st = statSync(cache);
  if (st.uid !== uid || (st.mode & 0o077) !== 0) throw new Error(`${cache} must belong to uid ${uid} and be private (mode 0700): remove it`);
  return cache;
}

/**
 * The packages of this tree's app under `version` (default: package.json's), built now or taken from the cache.
 * Give the test a timeout of several minutes: a build takes about a minute on two busy cores.
 */
export async function buildPackages(options: { version?: string } = {}): Promise<BuiltPackages> {
  const version = options.version ?? (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
  const cache = packageCache();
  const dir = join(cache, `${version}-${packageInputsHash()}`);
  const lock = `${dir}.lock`;
  for (;;) {
    if (existsSync(join(dir, 'manifest.json'))) {
      utimesSync(dir, new Date(), new Date()); // in use: not pruned
      return readBuilt(dir);
    }
    if (tryLock(lock)) break;
    await sleep(500);
  }
  try {
    if (existsSync(join(dir, 'manifest.json'))) return readBuilt(dir);
    const tmp = `${dir}.tmp-${process.pid}`;
    rmSync(tmp, { recursive: true, force: true });
    await run(process.execPath, [join(ROOT, 'scripts/package/build.mjs'), '--version', version, '--out', tmp], { cwd: ROOT, maxBuffer: 16 << 20 });
    const seconds = (JSON.parse(readFileSync(join(tmp, 'manifest.json'), 'utf8')) as Manifest).seconds;
    rmSync(dir, { recursive: true, force: true });
    renameSync(tmp, dir);
    pruneCache(cache);
    return readBuilt(dir, seconds);
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}
