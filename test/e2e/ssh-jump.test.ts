/**
 * Separate listeners: the agent's reverse tunnel uses raw SSH on the tunnel port (3024-style), and plain
 * OpenSSH reaches the node through the Proxy's SSH port (3023-style) as a jump host, with the configuration
 * `gwsh config` prints for such a cluster (ProxyJump instead of ProxyCommand). Real daemons on loopback. The
 * login is the user running the tests (root in CI): a node run by a normal user can only start its sessions as
 * that user.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { separateListenLines } from '../helpers/listeners.js';
import { startOtlpReceiver, type OtlpReceiver } from '../helpers/otlp.js';
import { waitUntil } from '../helpers/wait.js';

const HOST = '127.0.0.9';
const LOGIN = userInfo().username;
let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let env: Record<string, string>;
let sshPort: number;
let collector: OtlpReceiver;

function ssh(args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn('ssh', args, { env: { PATH: process.env.PATH ?? '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.on('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-jump-'));
  const ports = await Promise.all(['web', 'ssh', 'tunnel'].map(() => getPort({ host: HOST })));
  const [webPort, sshP, tunnelPort] = ports as [number, number, number];
  sshPort = sshP;
  collector = await startOtlpReceiver();
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      `  tracing: { otlp_endpoint: "${collector.url}" }`,
      'auth_service:',
      '  cluster_name: jump.example',
      '  listen_addr: 127.0.0.1:0',
      '  proxy_listener_mode: separate',
      'proxy_service:',
      `  public_addr: ${HOST}:${webPort}`,
      `  web_listen_addr: ${HOST}:${webPort}`,
      ...separateListenLines(HOST, { ports: { listen_addr: sshPort, tunnel_listen_addr: tunnelPort } }),
      '',
    ].join('\n'),
  );
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
  await admin(['users', 'add', 'alice', '--roles=access', `--logins=${LOGIN}`], 'correct horse battery\n');
  agent = await startGateway(['gateway:', '  nodename: web-1', '  data_dir: DATA_DIR', '  log: { format: json }', `  tracing: { otlp_endpoint: "${collector.url}" }`, 'ssh_service:', '  enabled: yes', ''].join('\n'), {
    args: ['--token', token, '--ca-pin', pin, '--proxy', `${HOST}:${webPort}`],
  });
  await agent.waitForLog('reverse tunnel ready');
  env = { HOME: dir, GWSH_HOME: join(dir, 'alice') };
  expect((await runCli('gwsh', ['login', `--proxy=${HOST}:${webPort}`, '--user=alice', `--ca-pin=${pin}`], { env, input: 'correct horse battery\n' })).status).toBe(0);
}, 60_000);

afterAll(async () => {
  await agent?.stop();
  await cluster?.stop();
  await collector?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('separate listeners: SSH through the jump host', () => {
  it('the reverse tunnel came up over raw SSH on the tunnel port', async () => {
    const nodes = JSON.parse((await runCli('gwctl', ['--data-dir', cluster.dataDir, 'get', 'nodes', '--format', 'json'], { env: { HOME: dir } })).stdout) as Array<{ spec: { status: string } }>;
    expect(nodes[0]?.spec.status).toBe('online');
  });

  it('gwsh config uses ProxyJump to the SSH port, and plain ssh reaches the node', async () => {
    const config = (await runCli('gwsh', ['config'], { env })).stdout;
    expect(config).toContain(`ProxyJump gateway@${HOST}:${sshPort}`);
    const file = join(dir, 'ssh_config');
    await writeFile(file, config);
    const r = await ssh(['-F', file, `${LOGIN}@web-1`, 'echo ok; exit 4']);
    expect(r.stdout).toBe('ok\n');
    expect(r.status).toBe(4);
  });

  it('traced: SSH carries no trace context, so each jump starts a trace at the Proxy (proxy.ssh_jump) that the agent continues', async () => {
    await waitUntil('the jump span', () => collector.spans.some((s) => s.name === 'proxy.ssh_jump'), 30_000, 200);
    const jump = collector.spans.find((s) => s.name === 'proxy.ssh_jump')!;
    expect(jump.parentSpanId).toBe('');
    expect(jump.attributes).toMatchObject({ 'gateway.route': 'ssh-jump', 'gateway.service': 'ssh', 'gateway.resource': 'web-1' });
    // The chain: the jump, the router's way to the agent (its own tunnel here), the agent's dial.
    const of = (name: string) => collector.spans.find((s) => s.traceId === jump.traceId && s.name === name);
    await waitUntil('the router and agent spans of that trace', () => of('proxy.route') !== undefined && of('agent.dial') !== undefined, 30_000, 200);
    expect(of('proxy.route')!.parentSpanId).toBe(jump.spanId);
    expect(of('proxy.route')!.attributes).toMatchObject({ 'gateway.router.via': 'local' });
    const dial = of('agent.dial')!;
    expect(dial.parentSpanId).toBe(of('proxy.route')!.spanId);
    expect(dial.resource['gateway.nodename']).toBe('web-1');
  });

  it('an unknown node is refused by the jump host', async () => {
    const file = join(dir, 'ssh_config');
    const r = await ssh(['-F', file, '-o', 'ConnectTimeout=10', `${LOGIN}@nope`, 'echo never']);
    expect(r.status).toBe(255);
    expect(r.stdout).toBe('');
  });
});
