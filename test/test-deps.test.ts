/**
 * Every program a test or a benchmark spawns is installed by scripts/install-test-deps.sh (or comes with every
 * Debian system), so that a fresh machine passes `npm test` and runs `npm run bench:*`.
 *
 * The scan reads test/ and bench/ for the ways they start programs: Node's child_process calls and the local
 * `run`/`runOk` helpers with a literal program name, and absolute paths of system programs in string literals.
 */
import { spawnSync } from 'node:child_process';
import { accessSync, constants, existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = new URL('../', import.meta.url).pathname;

/** Programs that are not Debian packages' and need no install: Node.js and the project's own commands. */
const OURS = new Set(['node', 'npm', 'npx', 'tsx', 'gateway', 'gwctl', 'gwsh', 'gateway-upgrade', 'gateway-kube-updater']);

/** Words the scan reads as programs that are not: arguments of the tests' own `run(subcommand, ...)` helpers. */
const NOT_PROGRAMS = new Set(['dial-plan', 'frobnicate']);

/** Programs that come with the package of a command the install script checks for. */
const ALSO_FROM: Record<string, string> = {
  initdb: 'postgres',
  pg_isready: 'psql',
  'mariadb-install-db': 'mariadbd',
  'mariadb-admin': 'mariadb',
  'sftp-server': 'sshd',
  'ssh-keygen': 'ssh',
  scp: 'ssh',
  sftp: 'ssh',
  // the package manager the install script itself runs
  'apt-get': 'apt-get',
  // Debian's rpm package: rpmbuild, rpm, rpm2archive
  rpm: 'rpmbuild',
  rpm2archive: 'rpmbuild',
};

/** Where tests look for programs besides PATH. */
const PROGRAM_DIRS = [
  ...(process.env.PATH ?? '').split(':').filter(Boolean),
  '/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin', '/usr/lib/openssh',
  ...(existsSync('/usr/lib/postgresql') ? readdirSync('/usr/lib/postgresql').map((v) => `/usr/lib/postgresql/${v}/bin`) : []),
];

function files(dir: string, ext = '.ts'): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? files(join(dir, e.name), ext) : e.name.endsWith(ext) ? [join(dir, e.name)] : [],
  );
}

/** Ways of starting a program: child_process calls and the local run/runOk helpers, join(bin, ...), a system path. */
export const CALL = /\b(?:spawn|spawnSync|execFile|execFileSync|execSync|run|runOk|probe|launch)\(\s*(?:[\w.]+,\s*)?\[?\s*(['"`])([a-z][a-z0-9._+-]*)(?=[\s'"`])|\bjoin\(bin, '([a-z][a-z0-9._+-]*)'\)/g;
export const SYSTEM_PATH = /['"`](\/(?:usr\/)?s?bin\/[a-z][a-z0-9._+-]*|\/usr\/lib\/openssh\/[a-z][a-z0-9._+-]*)['"`]/g;
/** program -> the files that start it */
export function spawnedPrograms(sourceFiles: string[]): Map<string, string[]> {
  const found = new Map<string, string[]>();
  const add = (program: string, file: string): void => {
    const list = found.get(program) ?? [];
    if (!list.includes(file)) list.push(file);
    found.set(program, list);
  };
  for (const file of sourceFiles) {
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(CALL)) add((m[2] ?? m[3])!, file);
    for (const m of text.matchAll(SYSTEM_PATH)) add(basename(m[1]!), file);
  }
  return found;
}

const located = new Map<string, string | undefined>();
/** The path of a program of that name on this machine, if any. */
function locate(program: string): string | undefined {
  if (!located.has(program)) {
    const hit = PROGRAM_DIRS.map((d) => join(d, program)).find((p) => {
      try {
        accessSync(p, constants.X_OK);
        return statSync(p).isFile();
      } catch {
        return false;
      }
    });
    located.set(program, hit);
  }
  return located.get(program);
}

/** The Debian package of each path, and whether that package is on every Debian system (Essential or required). */
function packagesOf(paths: string[]): Map<string, { pkg: string; base: boolean }> {
  const out = new Map<string, { pkg: string; base: boolean }>();
  if (paths.length === 0) return out;
  // With merged /usr, dpkg knows /bin/bash but not /usr/bin/bash: ask for any path ending in <dir>/<name>.
  const glob = (p: string): string => `*/${basename(dirname(p))}/${basename(p)}`;
  const owners = spawnSync('dpkg', ['-S', ...paths.map(glob)], { encoding: 'utf8' }).stdout;
  const byGlob = new Map<string, string>();
  for (const line of owners.split('\n')) {
    const m = /^([^:,\s]+)(?:[^:]*)?: (\S+)$/.exec(line);
    if (m) byGlob.set(glob(m[2]!), m[1]!);
  }
  const pkgs = [...new Set(byGlob.values())];
  const info = spawnSync('dpkg-query', ['-W', '-f', '${Package} ${Essential} ${Priority}\n', ...pkgs], { encoding: 'utf8' }).stdout;
  const base = new Set(info.split('\n').filter((l) => / yes /.test(l) || / required$/.test(l)).map((l) => l.split(' ')[0]!));
  for (const p of paths) {
    const pkg = byGlob.get(glob(p));
    if (pkg) out.set(p, { pkg, base: base.has(pkg) });
  }
  return out;
}

/** The `[command]=package` entries of the install script. */
function installed(): Map<string, string> {
  const script = readFileSync(join(ROOT, 'scripts/install-test-deps.sh'), 'utf8');
  return new Map([...script.matchAll(/^\s*\[([a-z0-9._+-]+)\]=([a-z0-9.+-]+)/gm)].map((m) => [m[1]!, m[2]!]));
}

describe('test dependencies', () => {
  // test/, bench/, and `npm run package` (scripts/package/, which test/helpers/packages.ts runs).
  const sources = [...files(join(ROOT, 'test')), ...files(join(ROOT, 'bench')), ...files(join(ROOT, 'scripts/package'), '.mjs')].filter((f) => !f.endsWith('test-deps.test.ts'));
  const programs = spawnedPrograms(sources);
  const script = installed();
  const scriptPackages = new Set(script.values());

  it('the scan finds the programs the suites are known to start (so that it cannot pass by finding nothing)', () => {
    for (const p of ['squid', 'haproxy', 'sshd', 'ssh', 'scp', 'openssl', 'ip', 'socat', 'psql', 'initdb', 'mariadbd', 'tmux', 'chromium', 'certutil', 'lintian', 'rpmbuild', 'dpkg-deb']) {
      expect(programs.has(p), p).toBe(true);
    }
  });

  it('every spawned program is installed by scripts/install-test-deps.sh or comes with every Debian system', () => {
    const onMachine = [...programs.keys()].filter((p) => !OURS.has(p) && locate(p));
    const owners = packagesOf(onMachine.map((p) => locate(p)!));
    const uncovered: string[] = [];
    for (const [program, where] of programs) {
      if (OURS.has(program) || NOT_PROGRAMS.has(program) || script.has(program)) continue;
      if (ALSO_FROM[program] === 'apt-get' || (program in ALSO_FROM && script.has(ALSO_FROM[program]!))) continue;
      const path = locate(program);
      const owner = path ? owners.get(path) : undefined;
      if (owner && (owner.base || scriptPackages.has(owner.pkg))) continue;
      const from = owner ? `package ${owner.pkg}` : path ? `${path}, in no Debian package` : 'not on this machine';
      uncovered.push(`${program} (${from}; in ${where.map((f) => f.slice(ROOT.length)).join(', ')})`);
    }
    expect(uncovered, 'add these to NEED in scripts/install-test-deps.sh').toEqual([]);
  });

  it('each file the install script looks for (NEED_FILES: fonts for the browser) belongs to the package it installs', () => {
    const text = readFileSync(join(ROOT, 'scripts/install-test-deps.sh'), 'utf8');
    const files = [...text.matchAll(/^\s*\[(\/[^\]]+)\]=([a-z0-9.+-]+)/gm)].map((m) => ({ path: m[1]!, pkg: m[2]! }));
    expect(files.map((f) => f.pkg)).toContain('fonts-dejavu-core');
    for (const { path, pkg } of files) {
      if (!existsSync(path)) continue; // not installed here: the script installs it (as root) or names it
      const owner = spawnSync('dpkg', ['-S', path], { encoding: 'utf8' }).stdout.split(':')[0];
      expect(owner, path).toBe(pkg);
    }
  });

  it('reads a program out of each way of starting one', () => {
    const sample = "spawn('squid', []); spawnSync(`ip`, ['netns']); run('tmux', x); const s = '/usr/sbin/sshd'; sh('alice'); exec('CREATE'); join(bin, 'initdb'); launch(ns, ['setpriv', x]);";
    expect([...sample.matchAll(CALL)].map((x) => x[2] ?? x[3])).toEqual(['squid', 'ip', 'tmux', 'initdb', 'setpriv']);
    expect([...sample.matchAll(SYSTEM_PATH)].map((x) => basename(x[1]!))).toEqual(['sshd']);
  });
});
