/**
 * A cut download is an error at the client, never a complete file (issue 23, "A broken stream is never a clean
 * end"; docs/security.md). Real daemons in their own processes: an Auth Service and Proxy in one, agents A and B
 * whose only way to the Proxy is each its own real squid (the Proxy's name is known to squid only), a TCP app in its own process that sends as many bytes as it is asked for and then ends, and `gwsh proxy
 * app` for each agent's app in its own process. The client is this process, reading from gwsh's local port.
 *
 *   a clean end      64 MiB arrive, then an end (no false reset)
 *   agent A killed   kill -9 mid-download: the client sees its connection reset, not an end
 *   squid killed     kill -9 of agent B's squid mid-download: the same
 *   Proxy killed     kill -9 mid-download (its kernel closes gwsh's TLS connection with a FIN): the same
 *
 * How the client tells a reset: an error (ECONNRESET), or an end after which a zero-length write fails (libuv
 * reports an RST that arrives behind data as an end; the kernel's socket then holds the error). Bytes are
 * counted; nothing here waits for a time.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { waitForPort } from '../helpers/netns.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'cut.gw.test';
const PASSWORD = 'correct horse battery';
const MIB = 1024 * 1024;

let dir: string;
/** Agent A's way to the Proxy, and agent B's (the one killed). */
let squidA: Squid;
let squid: Squid;
let cluster: RunningGateway;
let agentA: RunningGateway;
let agentB: RunningGateway;
let sourcePort: number;
let webPort: number;
let pin: string;
let userEnv: Record<string, string>;
const locals: Record<string, number> = {};
const children: ChildProcess[] = [];
/** Every daemon started, for afterAll (agent A twice). */
const gateways: RunningGateway[] = [];

async function started(...args: Parameters<typeof startGateway>): Promise<RunningGateway> {
  const g = await startGateway(...args);
  gateways.push(g);
  return g;
}

/** The app: reads "N\n", sends N bytes, ends. */
const SOURCE = `const net=require('net');const chunk=Buffer.alloc(1<<20,0x61);
net.createServer({allowHalfOpen:true},s=>{s.on('error',()=>{});let head='';s.on('data',d=>{if(head.includes('\\n'))return;head+=d;if(!head.includes('\\n'))return;
let left=Number(head.split('\\n')[0]);const pump=()=>{while(left>0&&!s.destroyed){const n=Math.min(left,chunk.length);left-=n;if(!s.write(n===chunk.length?chunk:chunk.subarray(0,n)))return s.once('drain',pump);}if(!s.destroyed)s.end();};pump();});}).listen(Number(process.argv[1]),'127.0.0.1');`;

function agentConfig(name: string, app: string): string {
  return ['gateway:', `  nodename: ${name}`, '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: ${app}, uri: "tcp://127.0.0.1:${sourcePort}" }`, ''].join('\n');
}

/** `gwsh proxy app APP` in its own process; resolves with its local port. */
async function localProxy(app: string): Promise<number> {
  return (await startGwshProxy(['app', app], userEnv, children)).port;
}

interface Download {
  /** Bytes received so far. */
  bytes(): number;
  /** How it ended: 'end' (clean), or 'reset' with the code seen. */
  outcome: Promise<{ how: 'end' | 'reset'; code?: string; bytes: number }>;
}

/** Asks the app, through gwsh's local port, for `size` bytes. */
function download(port: number, size: number): Download {
  const socket = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  let bytes = 0;
  socket.on('data', (d: Buffer) => (bytes += d.length));
  socket.on('error', () => undefined);
  const outcome = new Promise<{ how: 'end' | 'reset'; code?: string; bytes: number }>((resolve) => {
    socket.once('error', (err: NodeJS.ErrnoException) => resolve({ how: 'reset', code: err.code ?? err.message, bytes }));
    socket.once('end', () =>
      socket.write(Buffer.alloc(0), (err) => {
        resolve(err ? { how: 'reset', code: (err as NodeJS.ErrnoException).code ?? err.message, bytes } : { how: 'end', bytes });
        socket.destroy();
      }),
    );
  });
  socket.write(`${size}\n`);
  return { bytes: () => bytes, outcome };
}

async function until(check: () => boolean, what: string, limitMs = 60_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`not reached: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** kill -9 and wait for the exit. */
async function kill9(child: ChildProcess | number): Promise<void> {
  if (typeof child === 'number') {
    process.kill(child, 'SIGKILL');
    await until(() => {
      try {
        process.kill(child, 0);
        return false;
      } catch {
        return true;
      }
    }, `pid ${child} gone`);
    return;
  }
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGKILL');
  await exited;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-cut-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  squidA = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  squid = await startSquid({ host: '127.0.0.4', extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  sourcePort = await getPort({ host: '127.0.0.1' });
  const source = spawn(process.execPath, ['-e', SOURCE, String(sourcePort)], { stdio: 'ignore' });
  children.push(source);
  await waitForPort('127.0.0.1', sourcePort);

  webPort = await getPort({ host: PROXY_IP });
  cluster = await started(
    ['gateway:', '  nodename: proxy-cut', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: cut.example', '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: ${PROXY_IP}:${webPort}`, `  public_addr: ${PROXY_NAME}:${webPort}`, ''].join('\n'),
  );
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  await admin(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`);
  const token = async () => (JSON.parse((await admin(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
  // Each agent's only way to the Proxy is its own squid (only squid knows the Proxy's name).
  agentA = await started(agentConfig('agent-a', 'firehose-a'), { args: ['--token', await token(), '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`], env: { HTTPS_PROXY: squidA.url } });
  agentB = await started(agentConfig('agent-b', 'firehose-b'), { args: ['--token', await token(), '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`], env: { HTTPS_PROXY: squid.url } });
  for (const [name, agent] of [['A', agentA], ['B', agentB]] as const) {
    await agent.waitForLog('reverse tunnel ready', 30_000).catch((err: Error) => {
      throw new Error(`agent ${name}: ${err.message}\n${agent.logs().slice(-3000)}`);
    });
  }
  userEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice') };
  const login = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${webPort}`, '--user=alice', `--ca-pin=${pin}`], { env: userEnv, input: `${PASSWORD}\n` });
  expect(login.status, login.stderr).toBe(0);
  locals.a = await localProxy('firehose-a');
  locals.b = await localProxy('firehose-b');
}, 120_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  // A daemon killed above has exited already (stop() would wait for an exit that came): only its files go.
  for (const g of gateways) {
    if (g.process.exitCode === null && g.process.signalCode === null) await g.stop();
    await rm(g.dir, { recursive: true, force: true });
  }
  await squid?.stop();
  await squidA?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('a cut download is a reset at the client, a whole one an end', () => {
  it('a download that ends ends cleanly with every byte (no false reset)', async () => {
    const got = await download(locals.a!, 64 * MIB).outcome;
    expect(got).toEqual({ how: 'end', bytes: 64 * MIB });
  }, 120_000);

  it('HOSTILE: agent A killed with SIGKILL mid-download: the client sees a reset, not an end', async () => {
    const d = download(locals.a!, 4096 * MIB);
    await until(() => d.bytes() >= 16 * MIB, '16 MiB through agent A');
    await kill9(agentA.process);
    const got = await d.outcome;
    expect(got.how, `after ${got.bytes} bytes`).toBe('reset');
    expect(got.bytes).toBeLessThan(4096 * MIB);
  }, 120_000);

  it('HOSTILE: squid killed with SIGKILL mid-download (agent B tunnels through it): the client sees a reset', async () => {
    const d = download(locals.b!, 4096 * MIB);
    await until(() => d.bytes() >= 16 * MIB, '16 MiB through squid');
    await kill9(squid.pid);
    const got = await d.outcome;
    expect(got.how, `after ${got.bytes} bytes`).toBe('reset');
  }, 120_000);

  it('HOSTILE: the Proxy killed with SIGKILL mid-download (a FIN on gwsh\'s TLS connection): the client sees a reset', async () => {
    // Agent A again, back from its kill (its identity is in its data directory).
    agentA = await started(agentConfig('agent-a', 'firehose-a'), { dataDir: agentA.dataDir, args: ['--proxy', `${PROXY_NAME}:${webPort}`], env: { HTTPS_PROXY: squidA.url } });
    await agentA.waitForLog('reverse tunnel ready', 60_000);
    const d = download(locals.a!, 4096 * MIB);
    await until(() => d.bytes() >= 16 * MIB, '16 MiB through the Proxy');
    await kill9(cluster.process);
    const got = await d.outcome;
    expect(got.how, `after ${got.bytes} bytes`).toBe('reset');
  }, 180_000);
});
