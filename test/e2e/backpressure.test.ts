/**
 * Back-pressure through every hop: a TCP app behind an agent sends 1 GiB as fast as it can to a client that
 * reads slowly. If any hop (agent, tunnel, Proxy, gwsh) buffered without bound, its memory would grow towards
 * the gigabyte; with back-pressure the writer is slowed down instead and memory stays flat. Real daemons on
 * loopback; the source is a separate process so that nothing in this process competes with the slow reader.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { waitForPort } from '../helpers/netns.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';

const GIB = 1 << 30;
let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let source: ChildProcess;
let sourcePort: number;
const children: ChildProcess[] = [];

async function rssKb(pid: number): Promise<number> {
  return Number(/VmRSS:\s+(\d+)/.exec(await readFile(`/proc/${pid}/status`, 'utf8'))![1]);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-bp-'));
  // The source: on each connection, 1 GiB of a repeating pattern, written with back-pressure, then end.
  sourcePort = await getPort({ host: '127.0.0.1' });
  source = spawn(
    process.execPath,
    [
      '-e',
      `const net=require('net');const chunk=Buffer.alloc(1<<20);for(let i=0;i<chunk.length;i++)chunk[i]=i*7&255;
       net.createServer(s=>{let left=${GIB};const pump=()=>{while(left>0){left-=chunk.length;if(!s.write(chunk))return s.once('drain',pump);}s.end();};pump();s.on('error',()=>{});}).listen(${sourcePort},'127.0.0.1');`,
    ],
    { stdio: 'ignore' },
  );
  await waitForPort('127.0.0.1', sourcePort);
  const port = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: bp.example', '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: localhost:${port}`, ''].join('\n'),
  );
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
  await admin(['users', 'add', 'alice', '--roles=access'], 'correct horse battery\n');
  agent = await startGateway(
    ['gateway:', '  nodename: agent-bp', '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: firehose, uri: "tcp://127.0.0.1:${sourcePort}" }`, ''].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `localhost:${port}`] },
  );
  await agent.waitForLog('reverse tunnel ready');
  const env = { HOME: dir, GWSH_HOME: join(dir, 'alice') };
  expect((await runCli('gwsh', ['login', `--proxy=localhost:${port}`, '--user=alice', `--ca-pin=${pin}`], { env, input: 'correct horse battery\n' })).status).toBe(0);
  // gwsh's local listener, in its own process (the slow reader is this process).
  const local = (await startGwshProxy(['app', 'firehose'], env, children)).port;
  (globalThis as { localPort?: number }).localPort = local;
}, 90_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGTERM');
  source?.kill('SIGKILL');
  await agent?.stop();
  await cluster?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('back-pressure', () => {
  it('1 GiB to a slow reader: every byte arrives and no hop buffers it', async () => {
    const port = (globalThis as { localPort?: number }).localPort!;
    const pids = { proxy: cluster.process.pid!, agent: agent.process.pid!, gwsh: children[0]!.pid! };
    const before = { proxy: await rssKb(pids.proxy), agent: await rssKb(pids.agent), gwsh: await rssKb(pids.gwsh) };
    const peak = { ...before };
    const sampler = setInterval(() => {
      void (async () => {
        for (const k of Object.keys(pids) as Array<keyof typeof pids>) peak[k] = Math.max(peak[k], await rssKb(pids[k]).catch(() => 0));
      })();
    }, 100);
    const hash = createHash('sha256');
    let received = 0;
    await new Promise<void>((resolve, reject) => {
      const socket = net.connect({ port, host: '127.0.0.1' });
      // Read slowly: pause after every chunk and resume a moment later (the writer must wait for us).
      socket.on('data', (chunk: Buffer) => {
        hash.update(chunk);
        received += chunk.length;
        socket.pause();
        setTimeout(() => socket.resume(), 1);
      });
      socket.once('end', resolve);
      socket.once('error', reject);
    });
    clearInterval(sampler);
    expect(received).toBe(GIB);
    const expected = createHash('sha256');
    const chunk = Buffer.alloc(1 << 20);
    for (let i = 0; i < chunk.length; i++) chunk[i] = (i * 7) & 255;
    for (let i = 0; i < 1024; i++) expected.update(chunk);
    expect(hash.digest('hex')).toBe(expected.digest('hex'));
    // Flat: each process grew by far less than the gigabyte that went through it (64 MiB is generous for
    // buffers of a few MiB per hop plus the garbage collector's slack).
    for (const k of Object.keys(pids) as Array<keyof typeof pids>) {
      expect(peak[k] - before[k], `${k} grew by ${peak[k] - before[k]} KiB`).toBeLessThan(64 * 1024);
    }
  }, 180_000);
});
