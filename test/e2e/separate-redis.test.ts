/**
 * Redis with separate listeners (proxy_listener_mode: separate), end to end with the real binaries and clients: a
 * cluster (auth + proxy) whose listeners are the protocol table's (test/helpers/listeners.ts), an agent serving a
 * real redis-server, and real redis-cli through `gwsh proxy db`.
 *
 * Every protocol has its own address in this mode (docs/proxy.md): /webapi/ping reports redis_public_addr, and gwsh
 * sends gateway-redis there. Before the table was declared once (issue 24), ping had no redis_public_addr and gwsh
 * sent gateway-redis to the web listener, which does not serve it: redis-cli got no answer.
 * Nothing here asserts how fast anything happens.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startRedis, type DatabaseServer } from '../helpers/databases.js';
import { BIN, runCli, runProgram, startGateway, type RunningGateway, type RunResult } from '../helpers/gateway.js';
import { separateListenLines } from '../helpers/listeners.js';
import { rootSuite } from '../helpers/root.js';
import { waitUntil } from '../helpers/wait.js';

const describeAsRoot = rootSuite(['dbUsers']);
const PROXY_IP = '127.0.0.7';
const PASSWORD = 'correct horse battery';

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let redisServer: DatabaseServer;
let webAddr: string;
let redisListenPort: number;
let localPort: number;
const children: ChildProcess[] = [];

const env = () => ({ HOME: dir, GWSH_HOME: join(dir, 'gwsh-alice') });

const client = (command: string, args: string[]): Promise<RunResult> => runProgram(command, args, { env: { HOME: dir } });

const redisCli = (...args: string[]) => client('redis-cli', ['-h', '127.0.0.1', '-p', String(localPort), '-a', redisServer.password, '--no-auth-warning', ...args]);

/** GET /webapi/ping on the web listener, trusting the cluster's host CA. */
async function ping(): Promise<{ proxy: { tls_routing_enabled: boolean; db: Record<string, string> } }> {
  const ca = await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'));
  const [host, port] = [PROXY_IP, Number(webAddr.split(':')[1])];
  return new Promise((resolve, reject) => {
    https
      .get({ host, port, path: '/webapi/ping', ca }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve(JSON.parse(body) as never));
      })
      .on('error', reject);
  });
}

/** `gwsh proxy db NAME --port 0`; resolves with its local port. */
async function dbProxy(name: string): Promise<number> {
  const child = spawn(process.execPath, [BIN('gwsh'), 'proxy', 'db', name, '--port', '0'], { env: { PATH: process.env.PATH ?? '', ...env() }, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  await waitUntil(`gwsh proxy db ${name}`, () => /127\.0\.0\.1:(\d+)/.test(output) || child.exitCode !== null, 20_000);
  const m = /127\.0\.0\.1:(\d+)/.exec(output);
  if (!m) throw new Error(`gwsh proxy db ${name} failed: ${output}`);
  return Number(m[1]);
}

describeAsRoot('Redis through its own listener (proxy_listener_mode separate)', () => {
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-e2e-separate-redis-'));
    await chmod(dir, 0o755);
    const [dbPort, webPort, listenPort] = await Promise.all([getPort(), getPort({ host: PROXY_IP }), getPort({ host: PROXY_IP })]);
    webAddr = `${PROXY_IP}:${webPort}`;
    redisListenPort = listenPort!;
    const started = await Promise.allSettled([
      startRedis({ port: dbPort! }).then((db) => (redisServer = db)),
      startGateway(
        ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: sepredis.example', '  listen_addr: 127.0.0.1:0',
          '  proxy_listener_mode: separate', 'proxy_service:', `  web_listen_addr: ${webAddr}`, `  public_addr: ${webAddr}`,
          ...separateListenLines(PROXY_IP, { ports: { redis_listen_addr: redisListenPort } }), ''].join('\n'),
      ).then((gw) => (cluster = gw)),
    ]);
    const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
    const pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
    expect((await gwctl(['users', 'add', 'alice', '--roles=access', '--db-users=default'], `${PASSWORD}\n`)).stderr).toBe('');
    const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=db', '--format', 'json'])).stdout) as { token: string }).token;
    agent = await startGateway(
      ['gateway:', '  nodename: db-agent', '  data_dir: DATA_DIR', '  log: { format: json }', 'db_service:', '  enabled: yes', '  databases:',
        `    - { name: cache, protocol: redis, uri: 127.0.0.1:${dbPort} }`, ''].join('\n'),
      { args: ['--token', token, '--ca-pin', pin, '--proxy', webAddr] },
    );
    await agent.waitForLog('reverse tunnel ready', 20_000);
    const login = await runCli('gwsh', ['login', `--proxy=${webAddr}`, '--user=alice', `--ca-pin=${pin}`], { env: env(), input: `${PASSWORD}\n` });
    expect(login.stderr).toBe('');
    localPort = await dbProxy('cache');
  }, 180_000);

  afterAll(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await agent?.stop();
    await cluster?.stop();
    await redisServer?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  }, 60_000);

  it('ping reports redis_public_addr: the public host with the Redis listener’s port', async () => {
    const answer = await ping();
    expect(answer.proxy.tls_routing_enabled).toBe(false);
    expect(answer.proxy.db.redis_public_addr).toBe(`${PROXY_IP}:${redisListenPort}`);
  });

  it('redis-cli through gwsh proxy db: ping, set, get (gwsh dials the Redis listener: the web listener does not serve gateway-redis)', async () => {
    expect((await redisCli('ping')).stdout.trim()).toBe('PONG');
    expect((await redisCli('set', 'greeting', 'hello over 6379')).stdout.trim()).toBe('OK');
    expect((await redisCli('get', 'greeting')).stdout.trim()).toBe('hello over 6379');
  });
});
