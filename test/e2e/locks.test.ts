/**
 * Locks and removals close what is already open, end to end with the real binaries: a cluster (auth + proxy),
 * an agent serving a TCP app and SSH, a user with an app stream open through `gwsh proxy app` and an SSH session
 * open through OpenSSH's ssh with `gwsh config` (ProxyCommand `gwsh proxy ssh`). `gwctl lock` must close both,
 * refuse new ones while it lasts, and `gwctl unlock` restore access; a lock on the agent drops its tunnel and
 * refuses its reconnects; removing a user closes its streams.
 *
 * Nothing here asserts how fast: every "closed" is awaited with a generous bound.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sessionLogin } from '../helpers/sessionlogin.js';
import { rootTest } from '../helpers/root.js';
import { waitUntil } from '../helpers/wait.js';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startEchoServer, type EchoServer } from '../helpers/servers.js';

/** The OS account sessions log in as (see test/helpers/sessionlogin.ts: not root's own dotfiles). */
const LOGIN = sessionLogin();

const PROXY_IP = '127.0.0.3';
const PASSWORD = 'correct horse battery';
const NODE = 'lock-node';

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let echo: EchoServer;
let proxyAddr: string;
let pin: string;
const children: ChildProcess[] = [];

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const envOf = (user: string) => ({ HOME: dir, GWSH_HOME: join(dir, `gwsh-${user}`) });
const gwsh = (user: string, args: string[], input?: string) => runCli('gwsh', args, { env: envOf(user), ...(input === undefined ? {} : { input }) });

/** A child process whose output is collected; exit resolves with its code. */
function start(command: string, args: string[], env: Record<string, string>) {
  const child = spawn(command, args, { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
  children.push(child);
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
  const exit = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { child, output: () => output, exit, exited: () => child.exitCode !== null || child.signalCode !== null };
}

/** `gwsh proxy app echo-tcp` for a user; resolves with its local port and its output. */
async function appProxy(user: string) {
  const p = start(process.execPath, [BIN('gwsh'), 'proxy', 'app', 'echo-tcp', '--port', '0'], envOf(user));
  await waitUntil('gwsh proxy to listen', () => /127\.0\.0\.1:(\d+)/.test(p.output()) || p.exited());
  const m = /127\.0\.0\.1:(\d+)/.exec(p.output());
  if (!m) throw new Error(`gwsh proxy failed: ${p.output()}`);
  return { ...p, port: Number(m[1]) };
}

/** A TCP stream through the local proxy that has echoed once; `closed` resolves when the far end closes it. */
async function openStream(port: number) {
  const socket = net.connect({ port, host: '127.0.0.1' });
  socket.on('error', () => undefined);
  let got = '';
  socket.on('data', (c: Buffer) => (got += c.toString()));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  socket.write('ping');
  await waitUntil('the echo', () => got.includes('ping'), 20_000);
  return { socket, closed, received: () => got };
}

/** Resolves true if p settles within ms (a generous bound), false otherwise. */
async function within(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const result = await Promise.race([p.then(() => true), new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms)))]);
  clearTimeout(timer);
  return result;
}

async function signIn(user: string): Promise<void> {
  const login = await gwsh(user, ['login', `--proxy=${proxyAddr}`, `--user=${user}`, `--ca-pin=${pin}`], `${PASSWORD}\n`);
  expect(login.stderr).toBe('');
  expect(login.status).toBe(0);
}

async function nodeStatus(): Promise<string | undefined> {
  const r = await gwctl(['get', 'nodes', '--format', 'json']);
  const nodes = JSON.parse(r.stdout) as Array<{ metadata: { name: string }; spec: { status: string } }>;
  return nodes.find((n) => n.metadata.name === agent.hostId)?.spec.status;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-locks-'));
  await chmod(dir, 0o755);
  echo = await startEchoServer('127.0.0.1');
  const webPort = await getPort({ host: PROXY_IP });
  proxyAddr = `${PROXY_IP}:${webPort}`;
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: locks.example',
      '  listen_addr: 127.0.0.1:0',
      '  keep_alive_interval: 1s',
      'proxy_service:',
      `  web_listen_addr: ${proxyAddr}`,
      `  public_addr: ${proxyAddr}`,
      '',
    ].join('\n'),
  );
  pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
  for (const user of ['bob', 'dave']) expect((await gwctl(['users', 'add', user, '--roles=access', `--logins=${LOGIN}`], `${PASSWORD}\n`)).status).toBe(0);
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=node,app', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(
    [
      'gateway:',
      `  nodename: ${NODE}`,
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'ssh_service:',
      '  enabled: yes',
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: echo-tcp, uri: "tcp://127.0.0.1:${echo.port}" }`,
      '',
    ].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr] },
  );
  await agent.waitForLog('reverse tunnel ready', 20_000);
  await signIn('bob');
  await signIn('dave');
  const config = await gwsh('bob', ['config']);
  expect(config.status).toBe(0);
  await writeFile(join(dir, 'ssh_config-bob'), config.stdout);
}, 90_000);

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await agent?.stop();
  await cluster?.stop();
  await echo?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('gwctl lock --user closes what the user has open', () => {
  // The SSH session runs its shell as the login user: the agent must be root to start it.
  rootTest(['setuid'])('an app stream and an SSH session are closed, new ones refused with the lock named; unlock restores', async () => {
    const proxy = await appProxy('bob');
    const stream = await openStream(proxy.port);
    const session = start('ssh', ['-F', join(dir, 'ssh_config-bob'), '-o', 'BatchMode=yes', `${LOGIN}@${NODE}`, 'echo session-open; exec cat'], { HOME: dir });
    await waitUntil('the SSH session to start', () => session.output().includes('session-open') || session.exited(), 30_000);
    expect(session.output()).toContain('session-open');

    const lock = await gwctl(['lock', '--user', 'bob', '--message', 'incident 42', '--format', 'json']);
    expect(lock.stderr).toBe('');
    const name = (JSON.parse(lock.stdout) as { metadata: { name: string } }).metadata.name;

    expect(await within(stream.closed, 20_000)).toBe(true);
    expect(await within(session.exit, 20_000)).toBe(true);
    expect(session.output()).not.toContain('exit status 0');

    // A new connection through the running local proxy is refused, and says why.
    const again = net.connect({ port: proxy.port, host: '127.0.0.1' });
    again.on('error', () => undefined);
    again.write('ping');
    let echoed = '';
    again.on('data', (c: Buffer) => (echoed += c.toString()));
    expect(await within(new Promise((r) => again.once('close', r)), 20_000)).toBe(true);
    expect(echoed).toBe('');
    await waitUntil('gwsh proxy to print the refusal', () => proxy.output().includes('GW_ERR_ACCESS_LOCKED'), 10_000);
    expect(proxy.output()).toContain(name);

    const refused = await gwsh('bob', ['proxy', 'app', 'echo-tcp', '--port', '0']);
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain('GW_ERR_ACCESS_LOCKED');
    expect(refused.stderr).toContain('incident 42');
    // dave is not concerned.
    const daveProxy = await appProxy('dave');
    await openStream(daveProxy.port);

    const unlock = await gwctl(['unlock', '--user', 'bob']);
    expect(unlock.stdout).toContain(name);
    const after = await openStream(proxy.port);
    after.socket.destroy();
    const ssh = start('ssh', ['-F', join(dir, 'ssh_config-bob'), '-o', 'BatchMode=yes', `${LOGIN}@${NODE}`, 'echo back'], { HOME: dir });
    expect(await within(ssh.exit, 30_000)).toBe(true);
    expect(ssh.output()).toContain('back');
  });

  it('a lock on a role closes the streams of users holding it', async () => {
    const proxy = await appProxy('dave');
    const stream = await openStream(proxy.port);
    const lock = await gwctl(['lock', '--role', 'access', '--name', 'freeze-access']);
    expect(lock.status).toBe(0);
    expect(await within(stream.closed, 20_000)).toBe(true);
    expect((await gwctl(['unlock', 'freeze-access'])).status).toBe(0);
    const after = await openStream(proxy.port);
    after.socket.destroy();
  });

  it('removing a user closes its open stream at once', async () => {
    const proxy = await appProxy('dave');
    const stream = await openStream(proxy.port);
    expect((await gwctl(['users', 'rm', 'dave'])).status).toBe(0);
    expect(await within(stream.closed, 20_000)).toBe(true);
    const r = await gwsh('dave', ['apps', 'ls']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_AUTH_IDENTITY_REVOKED');
  });
});

describe('gwctl lock --node', () => {
  it("drops the agent's tunnel and refuses its reconnects; unlock lets it back", async () => {
    expect(await nodeStatus()).toBe('online');
    const lock = await gwctl(['lock', '--node', agent.hostId!, '--message', 'compromised host']);
    expect(lock.status).toBe(0);
    await waitUntil('the agent to be offline', async () => (await nodeStatus()) === 'offline');
    // The agent keeps trying (every few seconds at most) and is refused each time while the lock lasts.
    await cluster.waitForLog('"agent refused"', 30_000);
    expect(cluster.logs()).toMatch(/is locked by lock.*"msg":"agent refused"/);
    expect(await nodeStatus()).toBe('offline');
    const r = await gwsh('bob', ['proxy', 'app', 'echo-tcp', '--port', '0']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_TUNNEL_NOT_FOUND');

    expect((await gwctl(['unlock', '--node', agent.hostId!])).status).toBe(0);
    await waitUntil('the agent to be back online', async () => (await nodeStatus()) === 'online', 60_000);
  });
});
