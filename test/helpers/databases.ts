/**
 * Real database servers from Debian packages for tests, each with its own data directory in a fresh temp dir,
 * running as its own system user, listening on 127.0.0.1 of a network namespace (or of this one):
 *
 *   PostgreSQL  initdb + postgres (/usr/lib/postgresql/<newest>/bin) as "postgres"; local socket trust (for the
 *               set-up), TCP scram-sha-256; a login role and a database of the same name. Optionally TLS (a test
 *               CA's certificate, client certificates accepted for one role), and halt()/resume() of the server
 *               on its data for restart tests
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
import type { TestPki } from './tls.js';

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

export interface PostgresTlsOptions {
  /** Signs the server's certificate (for 127.0.0.1 and localhost) and the client certificates it accepts. */
  pki: TestPki;
  /** A login role without a password, allowed in over TLS with a client certificate whose CN is its name. */
  certUser: string;
}

export interface PostgresOptions extends DatabaseOptions {
  /** ssl=on with a certificate from pki, and a hostssl "cert" line for certUser in pg_hba.conf. */
  tls?: PostgresTlsOptions;
  /** Server settings over the test defaults (e.g. fsync: 'on' for a benchmark; the default is off). */
  settings?: Record<string, string>;
}

export interface PostgresServer extends DatabaseServer {
  kind: 'postgres';
  /** The unix socket directory (the superuser "postgres" logs in there without a password). */
  socketDir: string;
  /** postgresql://user:password@host:port/database (the server's own database unless named). */
  url(database?: string): string;
  /** Runs SQL as the superuser over the socket (psql -qAt); resolves with its output. */
  sql(sql: string, database?: string): Promise<string>;
  /** Stops the server (fast shutdown) and keeps its data directory; resume() starts it again on the same port. */
  halt(): Promise<void>;
  resume(): Promise<void>;
}

const PG_HBA_TLS = (certUser: string) => `local all all trust
hostssl all ${certUser} 127.0.0.1/32 cert
host all all 127.0.0.1/32 scram-sha-256
`;

/** Copies the server's TLS files into its data directory (the key must be the server user's, 0600) and says how to use them. */
async function preparePostgresTls(tls: PostgresTlsOptions, data: string, pg: { uid: number; gid: number }): Promise<string[]> {
  const cert = await tls.pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
  const files = { 'server.crt': cert.certPem, 'server.key': cert.keyPem, 'root.crt': tls.pki.caPem };
  for (const [name, content] of Object.entries(files)) {
    await writeFile(join(data, name), content, { mode: 0o600 });
    await chown(join(data, name), pg.uid, pg.gid);
  }
  await writeFile(join(data, 'pg_hba.conf'), PG_HBA_TLS(tls.certUser));
  await chown(join(data, 'pg_hba.conf'), pg.uid, pg.gid);
  return ['-c', 'ssl=on', '-c', 'ssl_cert_file=server.crt', '-c', 'ssl_key_file=server.key', '-c', 'ssl_ca_file=root.crt'];
}

export async function startPostgres(o: PostgresOptions): Promise<PostgresServer> {
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
  let tlsArgs: string[] = [];
  try {
    await run(asPg[0]!, [...asPg.slice(1), join(bin, 'initdb'), '-D', data, '-U', 'postgres', '--auth-local=trust', '--auth-host=scram-sha-256', '-E', 'UTF8', '--locale=C', '--no-sync', '--no-instructions'], 'initdb', { cwd: dir });
    if (o.tls) tlsArgs = await preparePostgresTls(o.tls, data, pg);
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  const command = [...asPg, join(bin, 'postgres'), '-D', data, '-k', sock, '-p', String(o.port), '-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off', '-c', 'shared_buffers=16MB', '-c', 'max_connections=60', '-c', 'log_min_messages=warning', ...tlsArgs, ...Object.entries(o.settings ?? {}).flatMap(([k, v]) => ['-c', `${k}=${v}`])];
  let server = launch(o.netns, command, dir);
  const ready = () => waitReady(server.child, () => probe(join(bin, 'pg_isready'), ['-q', '-h', sock, '-p', String(o.port)]), o.startTimeoutMs ?? 30_000, 'postgres', server.output);
  /** Fast shutdown (SIGINT): sessions are ended, nothing is waited for. */
  const halt = async () => {
    const { child } = server;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGINT');
    const killer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(killer);
  };
  let stopped: Promise<void> | undefined;
  const stop = () => (stopped ??= halt().then(() => rm(dir, { recursive: true, force: true })));
  const sql = (text: string, db = 'postgres') =>
    run(join(bin, 'psql'), ['-h', sock, '-p', String(o.port), '-U', 'postgres', '-d', db, '-v', 'ON_ERROR_STOP=1', '-qAt', '-c', text], 'psql (set-up)');
  try {
    await ready();
    await sql(`CREATE ROLE ${user} LOGIN PASSWORD '${password}'`);
    await sql(`CREATE DATABASE ${database} OWNER ${user}`);
    if (o.tls) await sql(`CREATE ROLE ${o.tls.certUser} LOGIN`);
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    kind: 'postgres',
    host: '127.0.0.1',
    port: o.port,
    user,
    password,
    database,
    dir,
    get pid() {
      return server.child.pid!;
    },
    log: () => server.output(),
    stop,
    socketDir: sock,
    url: (db = database) => `postgresql://${user}:${password}@127.0.0.1:${o.port}/${db}`,
    sql,
    halt,
    resume: async () => {
      if (server.child.exitCode === null && server.child.signalCode === null) return;
      server = launch(o.netns, command, dir);
      await ready();
    },
  };
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
