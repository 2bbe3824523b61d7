/**
 * Database access rules (db_users, db_names) enforced at the agent, end to end with the real binaries and the
 * real clients: a cluster (auth + proxy) and an agent serving PostgreSQL, MariaDB and Redis; users signed in with
 * `gwsh login`, and psql, mysql and redis-cli through `gwsh proxy db`.
 *
 *   alice  role access, traits db_users [gwtest, default], db_names [gwtest]: her own user and database work;
 *          another database user or database name is refused, and the client prints the gateway's code
 *   bob    role access and no database traits: every database user is refused (what issue 23 found let in)
 *   carol  a role of her own: db_users ['*'] denied 'other', db_names ['*']: any user but the denied one
 *
 * These fail on a gateway that does not enforce db_users/db_names (before issue 23): bob got in as gwtest.
 * Nothing here asserts how fast anything happens.
 */
import type { ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startMariadb, startPostgres, startRedis, type DatabaseServer, type PostgresServer } from '../helpers/databases.js';
import { runCli, runProgram, startGateway, type RunningGateway, type RunResult } from '../helpers/gateway.js';
import { rootSuite } from '../helpers/root.js';
import { waitUntil } from '../helpers/wait.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';

const describeAsRoot = rootSuite(['dbUsers']);
const PROXY_IP = '127.0.0.4';
const PASSWORD = 'correct horse battery';
const USERS = ['alice', 'bob', 'carol'] as const;
type User = (typeof USERS)[number];

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let proxyAddr: string;
let pin: string;
const dbs = {} as { pg: PostgresServer; maria: DatabaseServer; redis: DatabaseServer };
const children: ChildProcess[] = [];
/** The local port of `gwsh proxy db NAME` for each user. */
const ports = {} as Record<User, Record<'pg' | 'maria' | 'cache', number>>;

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const envOf = (user: string) => ({ HOME: dir, GWSH_HOME: join(dir, `gwsh-${user}`) });

const client = (command: string, args: string[], env: Record<string, string> = {}): Promise<RunResult> => runProgram(command, args, { env: { HOME: dir, ...env } });

const psql = (user: User, dbUser: string, dbName: string, sql: string, password = dbs.pg.password, sslmode = 'disable') =>
  client('psql', [`host=127.0.0.1 port=${ports[user].pg} user=${dbUser} dbname=${dbName} sslmode=${sslmode} connect_timeout=10`, '-X', '-At', '-v', 'ON_ERROR_STOP=1', '-c', sql], { PGPASSWORD: password });
const mysql = (user: User, dbUser: string, dbName: string | undefined, sql: string, password = dbs.maria.password) =>
  client('mysql', ['--no-defaults', '-h', '127.0.0.1', '-P', String(ports[user].maria), '-u', dbUser, `-p${password}`, '--connect-timeout=10', '-N', '-s', ...(dbName ? [dbName] : []), '-e', sql]);
const redis = (user: User, ...args: string[]) => client('redis-cli', ['-h', '127.0.0.1', '-p', String(ports[user].cache), '--no-auth-warning', ...args]);

/** `gwsh proxy db NAME --port 0` for a user; resolves with its local port. */
async function dbProxy(user: User, name: string): Promise<number> {
  return (await startGwshProxy(['db', name], envOf(user), children, { timeoutMs: 20_000 })).port;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-dbrules-'));
  await chmod(dir, 0o755);
  const [pgPort, myPort, redisPort, webPort] = await Promise.all([getPort(), getPort(), getPort(), getPort({ host: PROXY_IP })]);
  proxyAddr = `${PROXY_IP}:${webPort}`;
  const started = await Promise.allSettled([
    startPostgres({ port: pgPort! }).then((db) => (dbs.pg = db)),
    startMariadb({ port: myPort! }).then((db) => (dbs.maria = db)),
    startRedis({ port: redisPort! }).then((db) => (dbs.redis = db)),
    startGateway(
      ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: dbrules.example', '  listen_addr: 127.0.0.1:0',
        'proxy_service:', `  web_listen_addr: ${proxyAddr}`, `  public_addr: ${proxyAddr}`, ''].join('\n'),
    ).then((gw) => (cluster = gw)),
  ]);
  const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) throw failed.reason;
  // A second database user and database on PostgreSQL, with the same password: only the gateway tells them apart.
  await dbs.pg.sql(`CREATE ROLE other LOGIN PASSWORD '${dbs.pg.password}'`);
  await dbs.pg.sql(`CREATE DATABASE otherdb OWNER ${dbs.pg.user}`);

  pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
  expect((await gwctl(['users', 'add', 'alice', '--roles=access', '--db-users=gwtest,default', '--db-names=gwtest'], `${PASSWORD}\n`)).stderr).toBe('');
  expect((await gwctl(['users', 'add', 'bob', '--roles=access'], `${PASSWORD}\n`)).stderr).toBe('');
  const role = join(dir, 'role.yaml');
  await writeFile(role, ['kind: role', 'version: v7', 'metadata: { name: db-any }', 'spec:', '  allow:', "    db_labels: { '*': '*' }", "    db_users: ['*']", "    db_names: ['*']", '  deny:', '    db_users: [other]', ''].join('\n'));
  expect((await gwctl(['create', role])).stderr).toBe('');
  expect((await gwctl(['users', 'add', 'carol', '--roles=db-any'], `${PASSWORD}\n`)).stderr).toBe('');

  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=db', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(
    ['gateway:', '  nodename: db-agent', '  data_dir: DATA_DIR', '  log: { format: json }', 'db_service:', '  enabled: yes', '  databases:',
      `    - { name: pg, protocol: postgres, uri: 127.0.0.1:${pgPort} }`,
      `    - { name: maria, protocol: mysql, uri: 127.0.0.1:${myPort} }`,
      `    - { name: cache, protocol: redis, uri: 127.0.0.1:${redisPort} }`, ''].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr] },
  );
  await agent.waitForLog('reverse tunnel ready', 20_000);
  for (const user of USERS) {
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, `--user=${user}`, `--ca-pin=${pin}`], { env: envOf(user), input: `${PASSWORD}\n` });
    expect(login.stderr).toBe('');
    ports[user] = { pg: await dbProxy(user, 'pg'), maria: await dbProxy(user, 'maria'), cache: await dbProxy(user, 'cache') };
  }
}, 180_000);

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await agent?.stop();
  await cluster?.stop();
  await Promise.all([dbs.pg?.stop(), dbs.maria?.stop(), dbs.redis?.stop()]);
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

describeAsRoot('PostgreSQL (psql) through gwsh proxy db', () => {
  it('alice: her database user and database work', async () => {
    const r = await psql('alice', 'gwtest', 'gwtest', 'select current_user, current_database()');
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('gwtest|gwtest');
  });

  it('alice: also with sslmode=prefer (the agent declines TLS: the tunnel encrypts up to it)', async () => {
    const r = await psql('alice', 'gwtest', 'gwtest', 'select 7', dbs.pg.password, 'prefer');
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('7');
  });

  it('alice: another database user is refused, psql prints the code (the database password is right)', async () => {
    const r = await psql('alice', 'other', 'gwtest', 'select 1');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('GW_ERR_DB_USER_DENIED');
    expect(r.stderr).toContain('"other"');
  });

  it('alice: another database name is refused with its own code', async () => {
    const r = await psql('alice', 'gwtest', 'otherdb', 'select 1');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('GW_ERR_DB_NAME_DENIED');
  });

  it('bob (access, no db_users trait): refused even as a real database user with its password', async () => {
    const r = await psql('bob', 'gwtest', 'gwtest', 'select 1');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('GW_ERR_DB_USER_DENIED');
  });

  it("carol: '*' allows any user and name, and her role's deny still wins", async () => {
    const ok = await psql('carol', 'gwtest', 'otherdb', 'select current_database()');
    expect(ok.stderr).toBe('');
    expect(ok.stdout.trim()).toBe('otherdb');
    const denied = await psql('carol', 'other', 'gwtest', 'select 1');
    expect(denied.stderr).toContain('GW_ERR_DB_USER_DENIED');
  });

  it('the agent logs the refusal with the Proxy user, the database user asked for and the code', async () => {
    await waitUntil('the refusal in the agent log', () => agent.logs().includes('database connection refused'));
    const line = agent.logs().split('\n').find((l) => l.includes('database connection refused') && l.includes('"bob"'));
    expect(line).toBeDefined();
    expect(line).toContain('GW_ERR_DB_USER_DENIED');
  });
});

describeAsRoot('MariaDB (mysql) through gwsh proxy db', () => {
  it('alice: her user and database work', async () => {
    const r = await mysql('alice', 'gwtest', 'gwtest', 'select current_user(), database()');
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toMatch(/^gwtest@%\s+gwtest$/);
  });

  it('alice: another user is refused with ERROR 1045 and the code', async () => {
    const r = await mysql('alice', 'root', 'gwtest', 'select 1');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('1045');
    expect(r.stderr).toContain('GW_ERR_DB_USER_DENIED');
  });

  it('alice: another database is refused with ERROR 1044 and the code', async () => {
    const r = await mysql('alice', 'gwtest', 'mysql', 'select 1');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('1044');
    expect(r.stderr).toContain('GW_ERR_DB_NAME_DENIED');
  });

  it('bob: refused', async () => {
    const r = await mysql('bob', 'gwtest', 'gwtest', 'select 1');
    expect(r.stderr).toContain('GW_ERR_DB_USER_DENIED');
  });
});

describeAsRoot('Redis (redis-cli) through gwsh proxy db', () => {
  it('alice (db_users has default): AUTH with the password, then commands work', async () => {
    const r = await redis('alice', '-a', dbs.redis.password, 'set', 'k', 'v');
    expect(r.stdout.trim()).toBe('OK');
  });

  it('alice: AUTH as another Redis user is refused with NOPERM and the code, before the server sees it', async () => {
    const r = await redis('alice', '--user', 'admin', '--pass', 'whatever', 'get', 'k');
    expect(r.stdout + r.stderr).toContain('GW_ERR_DB_USER_DENIED');
  });

  it('bob: the default user is refused', async () => {
    const r = await redis('bob', '-a', dbs.redis.password, 'get', 'k');
    expect(r.stdout + r.stderr).toContain('GW_ERR_DB_USER_DENIED');
    expect(r.stdout).not.toContain('v');
  });
});
