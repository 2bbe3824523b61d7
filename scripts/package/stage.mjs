// The staging tree: the app directory (Node.js runtime, dist/, production node_modules) and the wrappers.
//
// - node: the runtime of the Node.js that runs this build (process.execPath), stripped of its symbol table (the
//   dynamic symbols native modules link against stay).
// - dist/: the built app (`npm run build`: bundles, the web UI), without source maps, with the version rewritten
//   when --version asks for another one (the same app under version N+1 for the upgrade tests).
// - node_modules/: the packages package-lock.json marks as not dev-only, copied from the installed node_modules
//   (so the native modules are the ones built for this very Node.js), without what is not needed at run time
//   (native build leftovers, other platforms' prebuilds, TypeScript declarations, source maps).
import { spawnSync } from 'node:child_process';
import { chmodSync, closeSync, cpSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { build } from 'esbuild';
import { ROOT, run, sourceVersion } from './common.mjs';

/** What is left out of node_modules: not run by the app (tests, benchmarks, linters' and editors' files, pages). */
const PRUNE_FILES = /(?:\.d\.ts|\.d\.mts|\.d\.cts|\.map|\.tsbuildinfo|\.a|\.html|^\.eslintrc.*|^\.npmignore|^\.git.*|^\.travis\.yml|^\.editorconfig|^\.prettierrc.*)$/;
const PRUNE_DIRS = new Set(['test', 'tests', '__tests__', 'benchmarks', 'bench', '.github', 'obj', 'obj.target', '.deps']);
/** Native build leftovers, in the packages that have a binding.gyp at their top. */
const NATIVE_LEFTOVERS = ['build/Release/test_extension.node', 'deps', 'src', 'third_party', 'build/deps'];
const ELF = Buffer.from([0x7f, 0x45, 0x4c, 0x46]);

function productionPackages() {
  const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8'));
  return Object.entries(lock.packages)
    .filter(([path, entry]) => path.startsWith('node_modules/') && !entry.dev)
    .map(([path]) => path);
}

function head(path, n) {
  const fd = openSync(path, 'r');
  try {
    const b = Buffer.alloc(n);
    return b.subarray(0, readSync(fd, b, 0, n, 0));
  } finally {
    closeSync(fd);
  }
}

/**
 * Leaves out what PRUNE_* name and other platforms' prebuilt binaries; strips the shared objects; sets modes as
 * Debian wants them (0755 for scripts, 0644 for everything else, shared objects included). Returns the ELF files.
 */
function prune(dir, platform, elves = []) {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) {
      if (PRUNE_DIRS.has(e.name) || (basename(dir) === 'prebuilds' && e.name !== platform)) rmSync(p, { recursive: true });
      else prune(p, platform, elves);
    } else if (e.isFile()) {
      if (PRUNE_FILES.test(e.name)) {
        rmSync(p);
        continue;
      }
      const h = head(p, 4);
      if (h.equals(ELF)) elves.push(p);
      chmodSync(p, h.subarray(0, 2).toString() === '#!' ? 0o755 : 0o644);
    }
  }
  return elves;
}

function copyNodeModules(appDir) {
  for (const path of productionPackages()) {
    const src = join(ROOT, path);
    if (!existsSync(src)) continue; // an optional package for another platform
    cpSync(src, join(appDir, path), { recursive: true, dereference: true, filter: (s) => !s.slice(src.length).startsWith('/node_modules/') });
  }
  const nm = join(appDir, 'node_modules');
  for (const pkg of readdirSync(nm)) {
    const dir = join(nm, pkg);
    if (!existsSync(join(dir, 'binding.gyp'))) continue;
    for (const left of NATIVE_LEFTOVERS) rmSync(join(dir, left), { recursive: true, force: true });
  }
  rmSync(join(nm, '.bin'), { recursive: true, force: true });
  rmSync(join(nm, '.package-lock.json'), { force: true });
  const elves = prune(nm, `linux-${process.arch}`);
  // Debug symbols out; the dynamic symbols the modules link with stay.
  if (elves.length > 0) run('strip', ['--strip-unneeded', ...elves]);
}

/** Every .js file under dir. */
function jsFiles(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? jsFiles(join(dir, e.name)) : e.name.endsWith('.js') ? [join(dir, e.name)] : []));
}

/** Copies dist/ without source maps; writes `version` where the build says package.json's version. */
function copyDist(appDir, version) {
  const dist = join(ROOT, 'dist');
  if (!existsSync(join(dist, 'cli', 'gateway.js')) || !existsSync(join(dist, 'web', 'index.html'))) {
    throw new Error('dist/ is not built: run `npm run build` first (npm run package does)');
  }
  // Not the source maps, nor earlier packages (dist/packages/, where `npm run package` writes).
  cpSync(dist, join(appDir, 'dist'), { recursive: true, filter: (s) => !s.endsWith('.map') && s !== join(dist, 'packages') });
  const from = sourceVersion();
  if (version === from) return;
  let changed = 0;
  for (const f of jsFiles(join(appDir, 'dist'))) {
    const text = readFileSync(f, 'utf8');
    if (!text.includes(from)) continue;
    writeFileSync(f, text.replaceAll(from, version));
    changed++;
  }
  if (changed === 0) throw new Error(`no file of dist/ holds the version ${from}: cannot build version ${version}`);
}

/** The app directory: node, package.json, dist/, node_modules/. Checks that the staged app runs. */
export function stageApp(appDir, version) {
  mkdirSync(appDir, { recursive: true });
  run('strip', ['-o', join(appDir, 'node'), process.execPath]);
  chmodSync(join(appDir, 'node'), 0o755);
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
  writeFileSync(join(appDir, 'package.json'), `${JSON.stringify({ name: pkg.name, version, private: true, type: 'module', license: pkg.license }, null, 2)}\n`);
  copyDist(appDir, version);
  copyNodeModules(appDir);
  const got = run(join(appDir, 'node'), [join(appDir, 'dist/cli/gateway.js'), '--version'], { cwd: '/' }).trim();
  if (got !== version) throw new Error(`the staged gateway says ${JSON.stringify(got)}, not ${version}`);
  // The native modules load with this runtime (a module built for another Node.js would throw here).
  run(join(appDir, 'node'), ['-e', "require('better-sqlite3'); require('node-pty'); require('cpu-features'); require('ssh2'); new (require('better-sqlite3'))(':memory:').close()"], { cwd: appDir });
}

/**
 * gateway-upgrade as one file: everything it runs is loaded when it starts, so a package manager replacing the
 * gateway's files while it runs (the upgrade it drives) cannot hand it a module of another version.
 */
export async function bundleUpdater(file, version) {
  mkdirSync(dirname(file), { recursive: true });
  await build({
    entryPoints: [join(ROOT, 'dist/cli/gateway-upgrade.js')],
    outfile: file,
    bundle: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    banner: { js: "import { createRequire as __gatewayCreateRequire } from 'node:module'; const require = __gatewayCreateRequire(import.meta.url);" },
    logLevel: 'warning',
  });
  // Run by the wrapper, never directly: no "#!" line (a script that is not executable, lintian says).
  const from = sourceVersion();
  let text = readFileSync(file, 'utf8').replace(/^#!.*\n/, '');
  if (version !== from) text = text.replaceAll(from, version);
  writeFileSync(file, text, { mode: 0o644 });
  chmodSync(file, 0o644);
}

/** Whether this Node.js can run in OpenSSL FIPS mode (it needs an OpenSSL FIPS provider). */
export function runtimeHasFips() {
  return spawnSync(process.execPath, ['--enable-fips', '-e', ''], { stdio: 'ignore' }).status === 0;
}

/**
 * A wrapper in a bin directory. `app` is a shell expression for the app directory, `$here` being the directory
 * the wrapper really is in (symbolic links resolved), so that an install under another root (dpkg --root, a
 * chroot being prepared) runs too. The -fips wrappers say FIPS in --version (gateway-upgrade picks the -fips
 * package and tarball from it) and start Node.js in FIPS mode when the runtime can.
 */
export function wrapper({ command, app, entry, fips, fipsMode, nodePath }) {
  const lines = [
    '#!/bin/sh',
    `# ${command}: runs ${entry.replace('$app/', '')} with the Node.js runtime shipped with the gateway (docs/install.md).`,
    'self=$(readlink -f "$0")',
    'here=${self%/*}',
    `app=${app}`,
  ];
  // The daemon's hand-over starts its successor through this wrapper (src/handover.ts successorCommand): after an
  // upgrade it names the new version's app directory, which the running process's own paths do not.
  if (command === 'gateway') lines.push('case $0 in /*) GATEWAY_LAUNCHER=$0 ;; *) GATEWAY_LAUNCHER=$PWD/$0 ;; esac', 'export GATEWAY_LAUNCHER');
  if (nodePath) lines.push(`NODE_PATH="${nodePath}\${NODE_PATH:+:$NODE_PATH}"`, 'export NODE_PATH');
  const flag = fips && fipsMode ? ' --enable-fips' : '';
  if (fips && command !== 'gateway-upgrade') {
    const mode = fipsMode ? 'on' : 'unavailable: this Node.js runtime has no OpenSSL FIPS provider';
    lines.push(
      'case "${1:-}" in',
      `  -v|--version) v=$("$app/node"${flag} "${entry}" --version) || exit $?; echo "$v FIPS (gateway-ent-fips; OpenSSL FIPS mode ${mode})"; exit 0 ;;`,
      'esac',
    );
  }
  lines.push(`exec "$app/node"${flag} "${entry}" "$@"`, '');
  return lines.join('\n');
}

export function writeExecutable(path, text) {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
  chmodSync(path, 0o755);
}

export function isFile(p) {
  return existsSync(p) && statSync(p).isFile();
}
