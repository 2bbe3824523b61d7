/**
 * Real database servers from Debian packages for tests, each with its own data directory in a fresh temp dir,
 * running as its own system user, listening on 127.0.0.1 of a network namespace (or of this one):
 *
 *   PostgreSQL  initdb + postgres (/usr/lib/postgresql/<newest>/bin) as "postgres"; local socket trust (for the
 *               set-up), TCP scram-sha-256; a login role and a database of the same name
 *   MariaDB     mariadb-install-db + mariadbd, switching to "mysql"; socket, pid file and datadir in the temp
 *               dir; a user 'NAME'@'%' with a password and all rights on a database NAME
 *   Redis       redis-server as "redis" with a temp config: requirepass, no persistence, a unix socket
 *
 * Set-up and readiness checks use each server's unix socket in the temp dir, so they work from any namespace.
 * stop() ends the server (SIGTERM, SIGKILL after 10 s) and removes the temp dir.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface DatabaseServer {
  kind: 'postgres' | 'mysql' | 'redis';
  /** TCP address inside its namespace. */
  host: string;
  port: number;
  user: string;
  password: string;
  database: string;
  dir: string;
  pid: number;
  /** The server's own log so far. */
  log(): string;
  stop(): Promise<void>;
}

export interface DatabaseOptions {
  /** Network namespace to run the server in (ip netns exec); this one when absent. */
  netns?: string;
  /** TCP port on 127.0.0.1 (of the namespace). */
  port: number;
  user?: string;
  password?: string;
  database?: string;
  startTimeoutMs?: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function account(name: string): { uid: number; gid: number } {
  const line = readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith(`${name}:`));
  if (!line) throw new Error(`no system user "${name}" (is its Debian package installed?)`);
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

/** The newest /usr/lib/postgresql/<version>/bin that has a postgres binary. */
export function postgresBinDir(): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root) ? readdirSync(root).filter((v) => existsSync(join(root, v, 'bin', 'postgres'))) : [];
  const newest = versions.sort((a, b) => Number(b) - Number(a))[0];
  if (!newest) throw new Error('no PostgreSQL server in /usr/lib/postgresql/*/bin (apt-get install postgresql)');
  return join(root, newest, 'bin');
}

function wrap(netns: string | undefined, command: string[]): [string, string[]] {
  const full = netns ? ['ip', 'netns', 'exec', netns, ...command] : command;
  return [full[0]!, full.slice(1)];
}

/** Runs a set-up command to completion (asynchronously, so that servers can be prepared in parallel). */
function run(command: string, args: string[], what: string, options: { cwd?: string; input?: string } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd, stdio: ['pipe', 'pipe', 'pipe'], env: { PATH: process.env.PATH ?? '', LANG: 'C' } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
    child.once('error', reject);
    child.once('close', (status, signal) => {
      clearTimeout(timer);
      if (status === 0) resolve(stdout);
      else reject(new Error(`${what} failed (${status ?? signal}): ${command} ${args.join(' ')}\n${stdout}\n${stderr}`));
    });
    child.stdin.on('error', () => undefined); // a probe may exit before reading its (empty) input
    child.stdin.end(options.input ?? '');
  });
}

/** True when a probe command exits 0 (and, with expect, prints it). */
function probe(command: string, args: string[], expect?: string): Promise<boolean> {
  return run(command, args, 'probe').then(
    (out) => expect === undefined || out.trim() === expect,
    () => false,
  );
}

/** Spawns a server; its stdout+stderr are kept; rejects waitReady if it exits first. */
function launch(netns: string | undefined, command: string[], cwd: string): { child: ChildProcess; output: () => string } {
  const [cmd, args] = wrap(netns, command);
  const child = spawn(cmd, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'], env: { PATH: process.env.PATH ?? '', LANG: 'C' } });
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output = (output + c.toString()).slice(-20_000)));
  child.stderr!.on('data', (c: Buffer) => (output = (output + c.toString()).slice(-20_000)));
  return { child, output: () => output };
}

async function waitReady(child: ChildProcess, ready: () => Promise<boolean>, timeoutMs: number, what: string, log: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`${what} exited during start-up (${child.exitCode ?? child.signalCode}):\n${log()}`);
    if (await ready()) return;
    if (Date.now() > deadline) throw new Error(`${what} not ready after ${timeoutMs} ms:\n${log()}`);
    await sleep(100);
  }
}

function stopper(child: ChildProcess, dir: string, signal: NodeJS.Signals = 'SIGTERM'): () => Promise<void> {
  let done: Promise<void> | undefined;
  return () =>
    (done ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        child.kill(signal);
        const killer = setTimeout(() => child.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(killer);
      }
      await rm(dir, { recursive: true, force: true });
    })());
}

export async function startPostgres(o: DatabaseOptions): Promise<DatabaseServer> {
  const bin = postgresBinDir();
  const user = o.user ?? 'gwtest';
  const password = o.password ?? 'pg-secret-1';
  const database = o.database ?? user;
  const pg = account('postgres');
  const dir = await mkdtemp(join(tmpdir(), 'gw-pg-'));
  const data = join(dir, 'data');
  const sock = join(dir, 'sock');
  await mkdir(data, { mode: 0o700 });
  await mkdir(sock);
  for (const d of [dir, data, sock]) await chown(d, pg.uid, pg.gid);
  await chmod(dir, 0o755);
  const asPg = ['setpriv', `--reuid=${pg.uid}`, `--regid=${pg.gid}`, '--clear-groups', '--'];
  try {
    await run(asPg[0]!, [...asPg.slice(1), join(bin, 'initdb'), '-D', data, '-U', 'postgres', '--auth-local=trust', '--auth-host=scram-sha-256', '-E', 'UTF8', '--locale=C', '--no-sync', '--no-instructions'], 'initdb', { cwd: dir });
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  const { child, output } = launch(
    o.netns,
    [...asPg, join(bin, 'postgres'), '-D', data, '-k', sock, '-p', String(o.port), '-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off', '-c', 'shared_buffers=16MB', '-c', 'max_connections=40', '-c', 'log_min_messages=warning'],
    dir,
  );
  const stop = stopper(child, dir, 'SIGINT'); // SIGINT: "fast" shutdown
  try {
    await waitReady(child, () => probe(join(bin, 'pg_isready'), ['-q', '-h', sock, '-p', String(o.port)]), o.startTimeoutMs ?? 30_000, 'postgres', output);
    const psql = (sql: string) => run(join(bin, 'psql'), ['-h', sock, '-p', String(o.port), '-U', 'postgres', '-d', 'postgres', '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', sql], 'psql (set-up)');
    await psql(`CREATE ROLE ${user} LOGIN PASSWORD '${password}'`);
    await psql(`CREATE DATABASE ${database} OWNER ${user}`);
  } catch (err) {
    await stop();
    throw err;
  }
  return { kind: 'postgres', host: '127.0.0.1', port: o.port, user, password, database, dir, pid: child.pid!, log: output, stop };
}

export async function startMariadb(o: DatabaseOptions): Promise<DatabaseServer> {
  const user = o.user ?? 'gwtest';
  const password = o.password ?? 'maria-secret-1';
  const database = o.database ?? user;
  const my = account('mysql');
  const dir = await mkdtemp(join(tmpdir(), 'gw-maria-'));
  const data = join(dir, 'data');
  const socket = join(dir, 'mysqld.sock');
  await mkdir(data, { mode: 0o700 });
  for (const d of [dir, data]) await chown(d, my.uid, my.gid);
  await chmod(dir, 0o755);
  try {
    await run('mariadb-install-db', ['--no-defaults', '--user=mysql', `--datadir=${data}`, '--auth-root-authentication-method=socket', '--skip-test-db', '--skip-name-resolve'], 'mariadb-install-db', {
      cwd: dir,
    });
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  const { child, output } = launch(
    o.netns,
    [
      'mariadbd',
      '--no-defaults',
      '--user=mysql',
      `--datadir=${data}`,
      `--socket=${socket}`,
      `--pid-file=${join(dir, 'mysqld.pid')}`,
      `--port=${o.port}`,
      '--bind-address=127.0.0.1',
      '--skip-name-resolve',
      '--skip-log-bin',
      '--innodb-buffer-pool-size=16M',
      '--innodb-log-file-size=8M',
      '--innodb-flush-log-at-trx-commit=0',
      '--max-connections=40',
    ],
    dir,
  );
  const stop = stopper(child, dir);
  try {
    await waitReady(child, () => probe('mariadb-admin', ['--no-defaults', `--socket=${socket}`, '-uroot', 'ping']), o.startTimeoutMs ?? 60_000, 'mariadbd', output);
    await run(
      'mariadb',
      ['--no-defaults', `--socket=${socket}`, '-uroot'],
      'mariadb (set-up)',
      { input: `CREATE DATABASE ${database}; CREATE USER '${user}'@'%' IDENTIFIED BY '${password}'; GRANT ALL ON ${database}.* TO '${user}'@'%';\n` },
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { kind: 'mysql', host: '127.0.0.1', port: o.port, user, password, database, dir, pid: child.pid!, log: output, stop };
}

export async function startRedis(o: DatabaseOptions): Promise<DatabaseServer> {
  const password = o.password ?? 'redis-secret-1';
  const rd = account('redis');
  const dir = await mkdtemp(join(tmpdir(), 'gw-redis-'));
  const socket = join(dir, 'redis.sock');
  const conf = join(dir, 'redis.conf');
  await writeFile(
    conf,
    [
      `port ${o.port}`,
      'bind 127.0.0.1',
      `unixsocket ${socket}`,
      'unixsocketperm 700',
      `dir ${dir}`,
      'daemonize no',
      'save ""',
      'appendonly no',
      `requirepass ${password}`,
      'loglevel warning',
      'logfile ""',
      '',
    ].join('\n'),
  );
  await chown(dir, rd.uid, rd.gid);
  await chown(conf, rd.uid, rd.gid);
  await chmod(dir, 0o755);
  const { child, output } = launch(o.netns, ['setpriv', `--reuid=${rd.uid}`, `--regid=${rd.gid}`, '--clear-groups', '--', 'redis-server', conf], dir);
  const stop = stopper(child, dir);
  try {
    await waitReady(
      child,
      () => probe('redis-cli', ['-s', socket, '-a', password, '--no-auth-warning', 'ping'], 'PONG'),
      o.startTimeoutMs ?? 20_000,
      'redis-server',
      output,
    );
  } catch (err) {
    await stop();
    throw err;
  }
  return { kind: 'redis', host: '127.0.0.1', port: o.port, user: 'default', password, database: '0', dir, pid: child.pid!, log: output, stop };
}
