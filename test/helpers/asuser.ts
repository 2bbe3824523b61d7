/**
 * Runs a piece of the project as another, unprivileged user.
 *
 * The checkout may live where that user cannot enter (a clone under /root is mode 0700), so nothing is run from
 * it: esbuild bundles a small entry script and the project modules it imports into one file, in a fresh
 * directory under the system's temporary directory that everyone can read. Native packages cannot be bundled;
 * the ones named are copied beside the bundle, into its own node_modules.
 */
import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { chmodSync, cpSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildSync } from 'esbuild';
import { IS_ROOT } from './root.js';

const ROOT = new URL('../../', import.meta.url).pathname;

/** Native packages and the pure-JS packages they load at run time, copied rather than bundled. */
const NATIVE: Record<string, string[]> = {
  'better-sqlite3': ['better-sqlite3', 'bindings', 'file-uri-to-path'],
};

/**
 * The unprivileged user a test acts as: "nobody" when the tests run as root (as in CI), else the user running
 * them, who already is one. Spawning as its uid and gid works either way: setting one's own ids needs no
 * privilege.
 */
export const UNPRIVILEGED_USER: { uid: number; gid: number } = IS_ROOT ? { uid: 65534, gid: 65534 } : { uid: process.getuid!(), gid: process.getgid!() };

export interface AsUserOptions {
  /** ES module source; import project modules with `src(...)`-made absolute paths. */
  script: string;
  uid: number;
  gid: number;
  /** Keys of NATIVE that the script needs. */
  native?: (keyof typeof NATIVE)[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
}

/** The absolute path of a source module, for an import in a script given to runAsUser. */
export function src(relative: string): string {
  return join(ROOT, 'src', relative);
}

function openUp(path: string): void {
  const st = statSync(path);
  chmodSync(path, st.isDirectory() ? 0o755 : st.mode | 0o444);
  if (st.isDirectory()) for (const entry of readdirSync(path)) openUp(join(path, entry));
}

/** Bundles `script` into a directory every user can read and returns the bundle's path. */
export function bundleForUser(script: string, native: (keyof typeof NATIVE)[] = []): string {
  const dir = mkdtempSync(join(tmpdir(), 'gw-asuser-'));
  const entry = join(dir, 'entry.mts');
  writeFileSync(entry, script);
  const packages = native.flatMap((n) => NATIVE[n]!);
  buildSync({
    entryPoints: [entry],
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    outfile: join(dir, 'run.mjs'),
    external: packages,
    logLevel: 'silent',
    // Bundled CommonJS packages call require(); give the ES module one.
    banner: { js: "import { createRequire as __gwCreateRequire } from 'node:module'; const require = __gwCreateRequire(import.meta.url);" },
  });
  for (const p of packages) cpSync(join(ROOT, 'node_modules', p), join(dir, 'node_modules', p), { recursive: true });
  openUp(dir);
  return join(dir, 'run.mjs');
}

/**
 * A copy of the built project (package.json, dist/, node_modules/) in a directory every user can read, for
 * running the real CLIs as another user. node_modules is hard-linked where the file system allows it (fast, and
 * the files keep their own modes), else copied. Call once per suite; remove the directory afterwards.
 */
export function publicCopyOfBuild(): string {
  const dir = mkdtempSync(join(tmpdir(), 'gw-public-'));
  chmodSync(dir, 0o755);
  cpSync(join(ROOT, 'package.json'), join(dir, 'package.json'));
  cpSync(join(ROOT, 'dist'), join(dir, 'dist'), { recursive: true });
  const linked = spawnSync('cp', ['-al', join(ROOT, 'node_modules'), join(dir, 'node_modules')]);
  if (linked.status !== 0) cpSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'), { recursive: true });
  openUp(join(dir, 'dist'));
  return dir;
}

let shared: string | undefined;
/**
 * The gateway program of one public copy of the build, made once per test process and removed when it exits:
 * for tests that run `gateway ...` as another user (the checkout may be where that user cannot enter).
 */
export function gatewayForAnyUser(): string {
  if (!shared) {
    const dir = publicCopyOfBuild();
    shared = dir;
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  }
  return join(shared, 'dist', 'cli', 'gateway.js');
}

/** Runs `script` with node as uid/gid, from a bundle outside the checkout. */
export function runAsUser(opts: AsUserOptions): SpawnSyncReturns<string> {
  const bundle = bundleForUser(opts.script, opts.native);
  return spawnSync(process.execPath, [bundle], {
    uid: opts.uid,
    gid: opts.gid,
    encoding: 'utf8',
    cwd: opts.cwd ?? tmpdir(),
    env: opts.env ?? { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: tmpdir(), GATEWAY_LOG_LEVEL: 'silent' },
  });
}
