/**
 * gwsh's --e2e modes with the real binaries: a cluster (auth + proxy) and an agent serving a TCP app and SSH,
 * `gwsh --debug proxy app` and `gwsh ssh` (real OpenSSH, ProxyCommand `gwsh proxy ssh`) in each mode. Whichever
 * path this cluster gives (end to end: its Proxy and agent are of this version; the classic route's branches stay
 * for a cluster that gives that), the modes must agree with it: auto carries the stream and says which path with the agent's host ID; require
 * carries it end to end or refuses with GW_ERR_E2E_UNAVAILABLE and the same reason auto printed (for `gwsh ssh`
 * too: the mode reaches its ProxyCommand); off carries it by the classic route without asking.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startEchoServer, type EchoServer } from '../helpers/servers.js';
import { sessionLogin } from '../helpers/sessionlogin.js';
import { waitUntil } from '../helpers/wait.js';

const LOGIN = sessionLogin();
const PASSWORD = 'e2e modes passw0rd';
const NODE = 'e2e-node';

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let echo: EchoServer;
let proxyAddr: string;
const children: ChildProcess[] = [];
const env = () => ({ HOME: dir, GWSH_HOME: join(dir, 'gwsh') });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-modes-'));
  await chmod(dir, 0o755);
  echo = await startEchoServer('127.0.0.1');
  proxyAddr = `127.0.0.3:${await getPort({ host: '127.0.0.3' })}`;
  cluster = await startGateway(['gateway:', '  data_dir: DATA_DIR', 'auth_service:', '  cluster_name: modes.example', '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: ${proxyAddr}`, `  public_addr: ${proxyAddr}`, ''].join('\n'));
  const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
  const pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
  expect((await gwctl(['users', 'add', 'bob', '--roles=access', `--logins=${LOGIN}`], `${PASSWORD}\n`)).status).toBe(0);
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=node,app', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(
    ['gateway:', `  nodename: ${NODE}`, '  data_dir: DATA_DIR', 'ssh_service:', '  enabled: yes', 'app_service:', '  enabled: yes', '  apps:', `    - { name: echo-tcp, uri: "tcp://127.0.0.1:${echo.port}" }`, ''].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr] },
  );
  await agent.waitForLog('reverse tunnel ready', 20_000);
  const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=bob', `--ca-pin=${pin}`], { env: env(), input: `${PASSWORD}\n` });
  expect(login.status, login.stderr).toBe(0);
}, 90_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  await agent?.stop();
  await cluster?.stop();
  await echo?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** `gwsh --debug proxy app echo-tcp --e2e MODE`, one connection through it: what it echoed and what gwsh printed. */
async function throughApp(mode: string): Promise<{ echoed: string; output: string }> {
  const child = spawn(process.execPath, [BIN('gwsh'), '--debug', 'proxy', 'app', 'echo-tcp', '--port', '0', '--e2e', mode], { env: { PATH: process.env.PATH ?? '', ...env() } });
  children.push(child);
  let output = '';
  child.stdout.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr.on('data', (c: Buffer) => (output += c.toString()));
  await waitUntil('gwsh proxy app to listen', () => /127\.0\.0\.1:(\d+)/.test(output) || child.exitCode !== null);
  const port = Number(/127\.0\.0\.1:(\d+)/.exec(output)?.[1]);
  const socket = net.connect(port, '127.0.0.1');
  socket.on('error', () => undefined);
  let echoed = '';
  socket.on('data', (c: Buffer) => (echoed += c.toString()));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  socket.write('ping');
  // Either the echo comes back or gwsh resets the connection (a refusal): both end the wait.
  await Promise.race([waitUntil('the echo', () => echoed.includes('ping'), 20_000), closed]);
  socket.destroy();
  child.kill('SIGTERM');
  return { echoed, output };
}

describe('gwsh --e2e against a real cluster', () => {
  let path: { e2e: true } | { e2e: false; reason: string };

  it('auto: the stream is carried, and --debug says which path (end to end names the agent)', async () => {
    const r = await throughApp('auto');
    expect(r.output).toContain('(end-to-end: auto)');
    expect(r.echoed).toBe('ping');
    const e2e = new RegExp(`^gwsh: echo-tcp: end-to-end to agent ${agent.hostId}$`, 'm').test(r.output);
    const classic = /^gwsh: echo-tcp: the classic route \(the Proxy sees the stream\): (.+)$/m.exec(r.output);
    expect(e2e !== (classic !== null), r.output).toBe(true);
    // This cluster's Proxy and agent are of this version, directly connected: the stream goes end to end.
    expect(e2e, r.output).toBe(true);
    path = e2e ? { e2e: true } : { e2e: false, reason: classic![1]! };
  });

  it('require: end to end when auto went so, else GW_ERR_E2E_UNAVAILABLE with the same reason', async () => {
    const r = await throughApp('require');
    if (path.e2e) {
      expect(r.echoed).toBe('ping');
    } else {
      expect(r.echoed).toBe('');
      expect(r.output).toContain('code: GW_ERR_E2E_UNAVAILABLE');
      expect(r.output).toContain(path.reason);
    }
  });

  it('off: the classic route, no grant asked (no line about the path)', async () => {
    const r = await throughApp('off');
    expect(r.echoed).toBe('ping');
    expect(r.output).not.toMatch(/gwsh: echo-tcp:/);
  });

  it('gwsh ssh: the mode reaches its ProxyCommand (require refuses where auto fell back; off works)', async () => {
    const ssh = (mode: string) => runCli('gwsh', ['ssh', '--e2e', mode, '-o', 'BatchMode=yes', `${LOGIN}@${NODE}`, 'echo', 'through-ssh'], { env: env() });
    const off = await ssh('off');
    expect(off.stdout, off.stderr).toContain('through-ssh');
    const required = await ssh('require');
    if (path.e2e) {
      expect(required.stdout, required.stderr).toContain('through-ssh');
    } else {
      expect(required.status).toBe(1);
      expect(required.stderr.trimEnd().split('\n').at(-1)).toBe('code: GW_ERR_E2E_UNAVAILABLE');
    }
  });
});
