/**
 * bench:tunnel — the gateway's reverse tunnel through a real squid, against two baselines measured in the same run:
 *
 *   raw TCP    client -> sink/echo server on 127.0.0.3 (the floor)
 *   gateway    client (this process: openResource, TLS with ALPN gateway-tcp and a gwsh profile) -> Proxy daemon
 *              (auth + proxy, real `gateway start`) -> the agent's reverse tunnel (SSH over TLS over squid CONNECT)
 *              -> agent daemon (real `gateway start`, app_service with tcp:// apps) -> sink/echo
 *   OpenSSH    client -> sshd (own config, 127.0.0.4) -> `ssh -N -R` (ProxyCommand socat PROXY: through the same
 *              squid) -> sink/echo. The peer.
 *
 * In both tunnels only the agent's leg goes through squid; the client reaches the Proxy / sshd directly. Both SSH
 * connections use the same cipher (ssh2's first choice on this machine, passed to ssh with -c) and ECDSA P-256
 * keys. The agent dials a Proxy name (proxy.gw.test) and ssh dials an sshd name (sshd.gw.test) that only squid's
 * hosts file resolves, so both tunnels really use the CONNECT proxy.
 *
 * Figures:
 *   throughput        BENCH_MIB MiB pushed on one stream until the sink has them all (median of BENCH_RUNS, paths
 *                     interleaved run by run), and BENCH_STREAMS parallel streams carrying BENCH_MIB MiB together
 *                     (aggregate MiB/s, median of BENCH_RUNS)
 *   round trip        64 bytes written and echoed back over one established stream, BENCH_RTTS samples (p50, p99)
 *   CPU per GiB       user+system CPU of every process on the path (from /proc) during the single-stream runs
 *   tunnel ready      from spawning the agent daemon (stored identity, no token) to its "reverse tunnel ready" log
 *                     line (and the Proxy's "agent connected"); for OpenSSH from spawning ssh to both "remote
 *                     forward success" lines. Median of BENCH_STARTS.
 *   idle memory       a fresh Proxy daemon; BENCH_AGENTS host identities joined with one multi-use token through
 *                     POST /webapi/join; then BENCH_AGENTS TunnelAgent instances in this process (direct, not through
 *                     squid: what is measured is the Proxy) connect to it in batches of 50; the Proxy's VmRSS
 *                     before, with half of them and with all of them connected and idle: per agent overall and
 *                     over the second half (which leaves out what the joins left in the heap).
 *   profile           (BENCH_PROFILE=1, the default) the Proxy and the agent restarted under the V8 sampling
 *                     profiler (what --cpu-prof uses; started by a preload, see PROFILER_PRELOAD), one
 *                     single-stream run of BENCH_PROFILE_MIB MiB and 2 000 round trips; the heaviest self-time
 *                     frames of each are recorded. Its figures are not the measured ones.
 *
 * Settings (environment): BENCH_MIB (512), BENCH_RUNS (3), BENCH_STREAMS (8), BENCH_RTTS (5000), BENCH_STARTS (3),
 * BENCH_AGENTS (1000), BENCH_PROFILE (1), BENCH_PROFILE_MIB (256), BENCH_PROFILE_KEEP (a directory to copy the two
 * .cpuprofile files to, for Chrome DevTools), BENCH_DAEMON_NODE_OPTIONS (Node options for the data path's Proxy and
 * agent daemons, e.g. "--max-semi-space-size=32"; recorded in the section when set), BENCH_RECORD (0: print the
 * section, do not write bench/RESULTS.md).
 *
 * Writes the figures, ratios and the machine to bench/RESULTS.md (section "tunnel"). Runs as root (sshd; creates
 * /run/sshd if missing). sshd uses GatewayPorts clientspecified so that the forwards listen on 127.0.0.4 only.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createCipheriv, randomBytes } from 'node:crypto';
import dns from 'node:dns';
import { createRequire } from 'node:module';
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { chmod, copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { basename, join } from 'node:path';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import getPort from 'get-port';
import type { HostIdentity } from '../src/agent/identity.js';
import { generateKeyPair, identityFromCert } from '../src/auth/pki.js';
import type { CertBundle } from '../src/auth/service.js';
import { ApiClient, fetchPinnedCas } from '../src/client/api.js';
import { loadProfile, type Profile } from '../src/client/profile.js';
import { openResource } from '../src/client/resources.js';
import { Dialer } from '../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../src/log.js';
import { TunnelAgent } from '../src/agent/tunnel.js';
import { runCli, startGateway, type RunningGateway } from '../test/helpers/gateway.js';
import { startEchoServer, type TestServer } from '../test/helpers/servers.js';
import { startSquid, type Squid } from '../test/helpers/squid.js';
import { waitForPort } from '../test/helpers/netns.js';
import { recordSection } from './record.js';
import { envNumber, spawnSshd } from './common.js';


const MIB = envNumber('BENCH_MIB', 512);
const RUNS = envNumber('BENCH_RUNS', 3);
const STREAMS = envNumber('BENCH_STREAMS', 8);
const RTTS = envNumber('BENCH_RTTS', 5000);
const STARTS = envNumber('BENCH_STARTS', 3);
const AGENTS = envNumber('BENCH_AGENTS', 1000);
const PROFILE = envNumber('BENCH_PROFILE', 1, 0) > 0;
const PROFILE_MIB = envNumber('BENCH_PROFILE_MIB', 256);
const MSG = 64;

const TARGET_IP = '127.0.0.3';
const SSHD_IP = '127.0.0.4';
const PROXY_IP = '127.0.0.5';
const PROXY_NAME = 'proxy.gw.test';
const SSHD_NAME = 'sshd.gw.test';
const PASSWORD = 'bench password, long enough';

// The agents of the memory test log errors only (1 000 "reverse tunnel ready" and "closed" lines otherwise).
setRootLogger(createLogger({ level: 'error' }));

// ---------------------------------------------------------------------------------------------------------------
// small helpers

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

function withTimeout<T>(what: string, p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: no result within ${ms} ms`)), ms))),
  ]);
}

async function rssKiB(pid: number): Promise<number> {
  const text = await readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(text)![1]);
}

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** pid and every descendant (sshd forks per connection, ssh runs its ProxyCommand as a child). */
function processTree(pid: number): number[] {
  const out = [pid];
  try {
    for (const task of readdirSync(`/proc/${pid}/task`)) {
      const children = readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8').trim();
      if (children) for (const c of children.split(/\s+/)) out.push(...processTree(Number(c)));
    }
  } catch {
    // gone
  }
  return out;
}

/** CPU seconds (user + system) used so far by a process (not its children). */
function cpuSeconds(pid: number | 'self'): number {
  if (pid === 'self') {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK; // utime, stime (fields 14 and 15)
  } catch {
    return 0;
  }
}

type CpuProbe = Record<string, () => number[] | 'self'>;

/** CPU seconds per named component between two snapshots (process trees re-read at each snapshot). */
function cpuSnapshot(probe: CpuProbe): Map<string, Map<number | 'self', number>> {
  const snap = new Map<string, Map<number | 'self', number>>();
  for (const [name, pids] of Object.entries(probe)) {
    const list = pids();
    const m = new Map<number | 'self', number>();
    for (const pid of list === 'self' ? (['self'] as const) : list) m.set(pid, cpuSeconds(pid));
    snap.set(name, m);
  }
  return snap;
}

function cpuDelta(before: ReturnType<typeof cpuSnapshot>, probe: CpuProbe): Record<string, number> {
  const after = cpuSnapshot(probe);
  const out: Record<string, number> = {};
  for (const [name, pids] of after) {
    let total = 0;
    for (const [pid, s] of pids) total += s - (before.get(name)?.get(pid) ?? 0);
    out[name] = total;
  }
  return out;
}

function accepts(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/**
 * CPU seconds per GiB for one pass of an AES-GCM cipher over 16 KiB records: `openssl speed -evp` (libcrypto, as
 * TLS in Node and OpenSSH use it; divided by user CPU time, so other load does not skew it). Falls back to Node's
 * own cipher (one context, which also allocates an output buffer per record: an upper bound).
 */
function cipherSecondsPerGiB(algorithm: 'aes-128-gcm' | 'aes-256-gcm'): number {
  const r = spawnSync('openssl', ['speed', '-evp', algorithm, '-bytes', '16384', '-seconds', '1'], { encoding: 'utf8' });
  const m = /^AES-\d+-GCM\s+([\d.]+)k\s*$/m.exec(r.stdout ?? '');
  if (r.status === 0 && m) return 2 ** 30 / (Number(m[1]) * 1000);
  const record = Buffer.alloc(16 * 1024, 0x33);
  const cipher = createCipheriv(algorithm, randomBytes(algorithm === 'aes-128-gcm' ? 16 : 32), randomBytes(12));
  const rounds = (256 * 2 ** 20) / record.length;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < rounds; i++) cipher.update(record);
  cipher.final();
  return (Number(process.hrtime.bigint() - t0) / 1e9) * 4;
}

// ---------------------------------------------------------------------------------------------------------------
// sink and echo

interface CountingSink extends TestServer {
  /** Resets the count; resolves (hrtime ns) when `bytes` more bytes have arrived over all connections. */
  expect(bytes: number): Promise<bigint>;
}

async function startCountingSink(host: string): Promise<CountingSink> {
  let got = 0;
  let waiter: { bytes: number; resolve: (t: bigint) => void } | undefined;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    s.on('error', () => undefined);
    s.on('data', (c: Buffer) => {
      got += c.length;
      if (waiter && got >= waiter.bytes) {
        const w = waiter;
        waiter = undefined;
        w.resolve(process.hrtime.bigint());
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, host, r));
  return {
    host,
    port: (server.address() as net.AddressInfo).port,
    expect: (bytes) => {
      got = 0;
      return new Promise((resolve) => (waiter = { bytes, resolve }));
    },
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

// ---------------------------------------------------------------------------------------------------------------
// the measurements

type Connect = () => Promise<Duplex>;

const CHUNK = Buffer.alloc(256 * 1024, 0x5a);

function push(stream: Duplex, bytes: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let sent = 0;
    stream.once('error', reject);
    const pump = () => {
      while (sent < bytes) {
        const n = Math.min(CHUNK.length, bytes - sent);
        sent += n;
        if (!stream.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n))) return void stream.once('drain', pump);
      }
      resolve();
    };
    pump();
  });
}

/** MiB/s of `streams` streams carrying `bytes` together, from the first write until the sink has them all. */
async function throughputOnce(connect: Connect, sink: CountingSink, bytes: number, streams: number): Promise<number> {
  const conns = await Promise.all(Array.from({ length: streams }, () => connect()));
  const per = Math.floor(bytes / streams / CHUNK.length) * CHUNK.length;
  const total = per * streams;
  const arrived = sink.expect(total);
  const t0 = process.hrtime.bigint();
  await Promise.all(conns.map((c) => push(c, per)));
  const t1 = await withTimeout('throughput', arrived, 300_000);
  for (const c of conns) c.destroy();
  return total / (Number(t1 - t0) / 1e9) / 2 ** 20;
}

async function roundTrips(connect: Connect, count: number): Promise<{ p50: number; p99: number }> {
  const stream = await connect();
  const msg = Buffer.alloc(MSG, 0x61);
  const once = () =>
    new Promise<void>((resolve, reject) => {
      let got = 0;
      const onData = (c: Buffer) => {
        got += c.length;
        if (got >= MSG) {
          stream.off('data', onData);
          stream.off('error', reject);
          resolve();
        }
      };
      stream.on('data', onData);
      stream.once('error', reject);
      stream.write(msg);
    });
  for (let i = 0; i < 200; i++) await once(); // warm-up
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    const t0 = process.hrtime.bigint();
    await once();
    times.push(Number(process.hrtime.bigint() - t0) / 1e3);
  }
  stream.destroy();
  times.sort((a, b) => a - b);
  return { p50: percentile(times, 50), p99: percentile(times, 99) };
}

// ---------------------------------------------------------------------------------------------------------------
// OpenSSH

interface Sshd {
  pid: number;
  port: number;
  process: ChildProcess;
  stop(): Promise<void>;
}

function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const killer = setTimeout(() => child.kill('SIGKILL'), 5000);
  await exited(child);
  clearTimeout(killer);
}

async function startSshd(dir: string): Promise<Sshd> {
  // sshd refuses to start without its privilege separation directory (the package creates it at boot only).
  if (!existsSync('/run/sshd')) mkdirSync('/run/sshd', { mode: 0o755 });
  const port = await getPort({ host: SSHD_IP });
  const cfg = join(dir, 'sshd_config');
  await writeFile(
    cfg,
    [
      `ListenAddress ${SSHD_IP}:${port}`,
      `HostKey ${join(dir, 'host_key')}`,
      `AuthorizedKeysFile ${join(dir, 'authorized_keys')}`,
      `PidFile ${join(dir, 'sshd.pid')}`,
      'UsePAM no',
      'StrictModes no',
      'AllowTcpForwarding yes',
      // clientspecified: the forward listens on the loopback address ssh -R names (127.0.0.4), not on all addresses.
      'GatewayPorts clientspecified',
      'PermitRootLogin prohibit-password',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'X11Forwarding no',
      'PrintMotd no',
      'UseDNS no',
      '',
    ].join('\n'),
  );
  const child = await spawnSshd(cfg);
  return { pid: child.pid!, port, process: child, stop: () => stopChild(child) };
}

interface SshTunnel {
  process: ChildProcess;
  /** ms from spawn until both remote forwards were confirmed. */
  readyMs: number;
  stop(): Promise<void>;
}

async function startSshTunnel(dir: string, squid: Squid, sshd: Sshd, cipher: string, forwards: Array<{ listen: number; to: number }>): Promise<SshTunnel> {
  const args = [
    '-v',
    '-N',
    '-F',
    '/dev/null',
    '-i',
    join(dir, 'user_key'),
    '-o',
    'IdentitiesOnly=yes',
    '-o',
    'BatchMode=yes',
    '-o',
    'StrictHostKeyChecking=no',
    '-o',
    'UserKnownHostsFile=/dev/null',
    '-o',
    'ExitOnForwardFailure=yes',
    '-o',
    `ProxyCommand=socat - PROXY:${squid.host}:%h:%p,proxyport=${squid.port}`,
    '-c',
    cipher,
    '-p',
    String(sshd.port),
    ...forwards.flatMap((f) => ['-R', `${SSHD_IP}:${f.listen}:${TARGET_IP}:${f.to}`]),
    `root@${SSHD_NAME}`,
  ];
  const t0 = process.hrtime.bigint();
  const child = spawn('ssh', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const readyMs = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`ssh -R did not come up:\n${log}`)), 20_000);
    child.once('exit', (code) => reject(new Error(`ssh exited with ${code}:\n${log}`)));
    const onData = (c: Buffer) => {
      log = (log + c.toString()).slice(-20_000);
      const ok = forwards.every((f) => log.includes(`remote forward success for: listen ${SSHD_IP}:${f.listen},`));
      if (ok) {
        clearTimeout(timer);
        resolve(Number(process.hrtime.bigint() - t0) / 1e6);
      }
    };
    child.stderr!.on('data', onData);
  });
  if (!log.includes(`cipher: ${cipher}`)) throw new Error(`ssh did not negotiate ${cipher}:\n${log}`);
  child.stderr!.resume();
  return { process: child, readyMs, stop: () => stopChild(child) };
}

// ---------------------------------------------------------------------------------------------------------------
// gateway

function proxyConfig(cluster: string, webPort: number): string {
  return [
    'gateway:',
    '  nodename: proxy-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: info }',
    'auth_service:',
    `  cluster_name: ${cluster}`,
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    `  web_listen_addr: ${PROXY_IP}:${webPort}`,
    `  public_addr: ${PROXY_NAME}:${webPort}`,
    '',
  ].join('\n');
}

function agentConfig(sinkPort: number, echoPort: number): string {
  return [
    'gateway:',
    '  nodename: agent-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: info }',
    'app_service:',
    '  enabled: yes',
    '  apps:',
    `    - { name: sink, uri: "tcp://${TARGET_IP}:${sinkPort}" }`,
    `    - { name: echo, uri: "tcp://${TARGET_IP}:${echoPort}" }`,
    '',
  ].join('\n');
}

/** Resolves the names only squid knows, for the ones who do not go through squid (the client, the idle agents). */
const benchLookup: net.LookupFunction = (hostname, options, callback) => {
  if (hostname !== PROXY_NAME) return dns.lookup(hostname, options, callback);
  if (options.all) callback(null, [{ address: PROXY_IP, family: 4 }]);
  else callback(null, PROXY_IP, 4);
};

async function stopGateway(gw: RunningGateway | undefined): Promise<void> {
  if (!gw) return;
  const killer = setTimeout(() => gw.process.kill('SIGKILL'), 15_000);
  await gw.stop();
  clearTimeout(killer);
}

function logTime(line: string): number {
  return (JSON.parse(line) as { time: number }).time;
}

interface AgentStart {
  agent: RunningGateway;
  /** spawn -> "gateway started" (process start, configuration, identity). */
  startedMs: number;
  /** spawn -> "reverse tunnel ready" in the agent's log. */
  readyMs: number;
  /** spawn -> "agent connected" in the Proxy's log. */
  proxyMs: number;
}

async function startAgent(proxy: RunningGateway, yaml: string, dataDir: string, squid: Squid, env: Record<string, string> = {}): Promise<AgentStart> {
  const from = proxy.logs().length;
  const t0 = Date.now();
  const agent = await startGateway(yaml, { dataDir, env: { HTTPS_PROXY: squid.url, ...env } });
  const ready = await agent.waitForLog('reverse tunnel ready', 30_000).catch(async (err: unknown) => {
    await stopGateway(agent);
    throw new Error(`${(err as Error).message}\n${agent.logs()}`);
  });
  const started = agent.logs().split('\n').find((l) => l.includes('"gateway started"'))!;
  let connected: string | undefined;
  for (let i = 0; i < 100 && !connected; i++) {
    connected = proxy.logs().slice(from).split('\n').find((l) => l.includes('"agent connected"'));
    if (!connected) await sleep(20);
  }
  return { agent, startedMs: logTime(started) - t0, readyMs: logTime(ready) - t0, proxyMs: connected ? logTime(connected) - t0 : NaN };
}

// ---------------------------------------------------------------------------------------------------------------
// CPU profiles

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

interface FrameShare {
  frame: string;
  share: number;
}

const NATIVE_WRITES = new Set(['writev', 'writeBuffer', 'writeUtf8String', 'writeLatin1String', 'writeAsciiString']);
const NATIVE_SSH2 = new Set(['GenericCipher', 'GenericDecipher', 'AESGCMCipher', 'AESGCMDecipher', 'ChaChaPolyCipher', 'ChaChaPolyDecipher']);

const PROFILE_GROUPS = ['socket writes', 'ssh2', 'node streams', 'garbage collector', 'other'] as const;

/**
 * Self time per frame (function, file:line) as a share of the busy (non-idle) samples, and per group, by the
 * frame a sample was in: "socket writes" = the native writev/writeBuffer of a socket (for a TLS socket the record
 * encryption, then the write syscall, which on loopback also runs the receiver's TCP input); "ssh2" = ssh2's
 * JavaScript and its native cipher binding, or anything called from ssh2 except socket writes and GC (padding
 * bytes, buffer allocation); "node streams" = Node's own JavaScript (streams, net, tls). The profiler's own
 * stop-and-serialize at exit is left out.
 */
function summarizeProfile(path: string): {
  top: FrameShare[];
  groups: Record<(typeof PROFILE_GROUPS)[number], number>;
  /** Of the socket writes: the share made by a spliced stream's pipe (agent -> resource, Proxy -> client) rather than for the tunnel. */
  splicedWrites: number;
  busyMs: number;
} {
  const prof = JSON.parse(readFileSync(path, 'utf8')) as { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] };
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const stack = (id: number) => {
    const out: ProfileNode[] = [];
    for (let c: number | undefined = id; c !== undefined; c = parent.get(c)) out.push(byId.get(c)!);
    return out;
  };
  const self = new Map<number, number>();
  prof.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (prof.timeDeltas[i] ?? 0)));
  const frames = new Map<string, number>();
  const groups = Object.fromEntries(PROFILE_GROUPS.map((g) => [g, 0])) as Record<(typeof PROFILE_GROUPS)[number], number>;
  let busy = 0;
  let spliced = 0;
  for (const [id, us] of self) {
    const f = byId.get(id)!.callFrame;
    if (f.functionName === '(idle)') continue;
    const frames_ = stack(id);
    if (frames_.some((n) => n.callFrame.url.endsWith('profiler.cjs'))) continue;
    busy += us;
    const file = f.url ? `${f.url.includes('node_modules/') ? f.url.slice(f.url.lastIndexOf('node_modules/') + 13) : basename(f.url)}:${f.lineNumber + 1}` : '';
    const key = `${f.functionName || '(anonymous)'}${file ? ` (${file})` : ''}`;
    frames.set(key, (frames.get(key) ?? 0) + us);
    if (!f.url && NATIVE_WRITES.has(f.functionName)) {
      groups['socket writes'] += us;
      // Walking up from the write: pipe()'s ondata before any ssh2 frame is the plain side of a splice; ssh2 first is the tunnel.
      const first = frames_.find((n) => n.callFrame.functionName === 'ondata' || n.callFrame.url.includes('/ssh2/'));
      if (first?.callFrame.functionName === 'ondata') spliced += us;
    }
    else if (f.functionName === '(garbage collector)') groups['garbage collector'] += us;
    else if (f.url.includes('/ssh2/') || (!f.url && NATIVE_SSH2.has(f.functionName)) || frames_.some((n) => n.callFrame.url.includes('/ssh2/'))) groups.ssh2 += us;
    else if (f.url.startsWith('node:')) groups['node streams'] += us;
    else groups.other += us;
  }
  const top = [...frames.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 6)
    .map(([frame, us]) => ({ frame, share: us / busy }));
  const splicedWrites = groups['socket writes'] > 0 ? spliced / groups['socket writes'] : 0;
  for (const g of PROFILE_GROUPS) groups[g] = groups[g] / busy;
  return { top, groups, splicedWrites, busyMs: busy / 1000 };
}

/**
 * A preload (NODE_OPTIONS=--require; Node 20 refuses --cpu-prof there, and the daemons are started by the test
 * helper) that starts the inspector's CPU profiler (the sampler --cpu-prof uses) on SIGUSR2, so start-up is left
 * out, and writes $BENCH_CPU_PROF_DIR/<pid>.cpuprofile when the process exits.
 */
const PROFILER_PRELOAD = `
const { Session } = require('node:inspector');
const { mkdirSync, writeFileSync } = require('node:fs');
const dir = process.env.BENCH_CPU_PROF_DIR;
const session = new Session();
session.connect();
session.post('Profiler.enable');
let started = false;
process.on('SIGUSR2', () => {
  if (started) return;
  started = true;
  session.post('Profiler.start');
});
process.once('exit', () => {
  if (!started) return;
  // A session in the same thread answers synchronously, so this runs before the process is gone.
  session.post('Profiler.stop', (err, res) => {
    if (err || !res) return;
    mkdirSync(dir, { recursive: true });
    writeFileSync(dir + '/' + process.pid + '.cpuprofile', JSON.stringify(res.profile));
  });
});
`;

/** Extra Node options for the Proxy and agent daemons of the data path (BENCH_DAEMON_NODE_OPTIONS), e.g. GC settings. */
const DAEMON_NODE_OPTIONS = process.env.BENCH_DAEMON_NODE_OPTIONS?.trim() ?? '';

function daemonEnv(extraNodeOptions = ''): Record<string, string> {
  const opts = [DAEMON_NODE_OPTIONS, extraNodeOptions].filter(Boolean).join(' ');
  return opts ? { NODE_OPTIONS: opts } : {};
}

function profilerEnv(preload: string, dir: string): Record<string, string> {
  return { ...daemonEnv(`--require ${preload}`), BENCH_CPU_PROF_DIR: dir };
}

function newestProfile(dir: string): string | undefined {
  if (!existsSync(dir)) return undefined;
  const files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
  return files.length ? join(dir, files.sort().at(-1)!) : undefined;
}

// ---------------------------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const began = Date.now();
  const load0 = loadavg()[0]!;
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-tunnel-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n${SSHD_IP} ${SSHD_NAME}\n`, { mode: 0o644 });
  const require = createRequire(import.meta.url);
  const ssh2Constants = require('ssh2/lib/protocol/constants.js') as { DEFAULT_CIPHER: string[] };
  const cipher = ssh2Constants.DEFAULT_CIPHER[0]!;
  const sshVersion = spawnSync('ssh', ['-V'], { encoding: 'utf8' }).stderr.trim().split(',')[0]!;

  let squid: Squid | undefined;
  let proxy: RunningGateway | undefined;
  let agent: RunningGateway | undefined;
  let memProxy: RunningGateway | undefined;
  let sshd: Sshd | undefined;
  let ssh: SshTunnel | undefined;
  const servers: TestServer[] = [];
  const idleAgents: TunnelAgent[] = [];
  const say = (s: string) => process.stdout.write(`[${((Date.now() - began) / 1000).toFixed(1)} s] ${s}\n`);
  try {
    squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
    const sink = await startCountingSink(TARGET_IP);
    const echo = await startEchoServer(TARGET_IP);
    servers.push(sink, echo);

    // --- the gateway: Proxy, a user, a join token, the agent (joined once through squid, then restarted) -------
    const webPort = await getPort({ host: PROXY_IP });
    const proxyAddr = `${PROXY_NAME}:${webPort}`;
    const proxyYaml = proxyConfig('bench.example', webPort);
    const proxyDataDir = join(dir, 'proxy-data');
    proxy = await startGateway(proxyYaml, { dataDir: proxyDataDir, env: daemonEnv() });
    const adminEnv = { HOME: dir };
    const gwctl = async (args: string[], input?: string) => {
      const r = await runCli('gwctl', ['--data-dir', proxyDataDir, ...args], { env: adminEnv, ...(input === undefined ? {} : { input }) });
      if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.stderr}`);
      return r.stdout;
    };
    const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(await gwctl(['status']))![1]!;
    await gwctl(['users', 'add', 'bench', '--roles=access'], `${PASSWORD}\n`);
    const gwshHome = join(dir, 'gwsh');
    const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=bench', `--ca-pin=${pin}`], {
      env: { HOME: dir, GWSH_HOME: gwshHome, HTTPS_PROXY: squid.url },
      input: `${PASSWORD}\n`,
    });
    if (login.status !== 0) throw new Error(`gwsh login: ${login.stderr}`);
    const profile: Profile = loadProfile(gwshHome)!;
    const token = (JSON.parse(await gwctl(['tokens', 'add', '--type=app', '--uses=0', '--ttl=1h', '--format', 'json'])) as { token: string }).token;

    const agentYaml = agentConfig(sink.port, echo.port);
    const agentDataDir = join(dir, 'agent-data');
    await mkdir(agentDataDir, { recursive: true });
    agent = await startGateway(agentYaml, { dataDir: agentDataDir, args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr], env: { HTTPS_PROXY: squid.url } });
    await agent.waitForLog('reverse tunnel ready', 30_000);
    await stopGateway(agent);
    agent = undefined;
    say('gateway: Proxy up, agent joined through squid');

    const starts: AgentStart[] = [];
    for (let i = 0; i < STARTS; i++) {
      const s = await startAgent(proxy, agentYaml, agentDataDir, squid, daemonEnv());
      starts.push(s);
      if (i < STARTS - 1) await stopGateway(s.agent);
      else agent = s.agent;
      await sleep(200);
    }
    if (!(await squid.readAccessLog()).some((l) => l.includes(`CONNECT ${proxyAddr} 200`))) throw new Error('the agent did not go through squid');
    say(`gateway: tunnel ready in ${starts.map((s) => s.readyMs).join(', ')} ms`);

    const clientDialer = new Dialer({ env: {}, lookup: benchLookup });
    const viaGateway = (resource: 'sink' | 'echo'): Connect => () => openResource(profile, profile.proxy, { alpn: 'gateway-tcp', resource, kind: 'app' }, clientDialer);
    const probe = await viaGateway('echo')();
    const clientTls = `${(probe as TLSSocket).getProtocol()} ${(probe as TLSSocket).getCipher().standardName}`;
    probe.destroy();

    // --- OpenSSH ------------------------------------------------------------------------------------------------
    spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', join(dir, 'host_key')]);
    spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', join(dir, 'user_key')]);
    await writeFile(join(dir, 'authorized_keys'), await readFile(join(dir, 'user_key.pub')));
    sshd = await startSshd(dir);
    const fwd = { sink: await getPort({ host: SSHD_IP, exclude: [sshd.port] }), echo: 0 };
    fwd.echo = await getPort({ host: SSHD_IP, exclude: [sshd.port, fwd.sink] });
    const forwards = [
      { listen: fwd.sink, to: sink.port },
      { listen: fwd.echo, to: echo.port },
    ];
    const sshStarts: number[] = [];
    for (let i = 0; i < STARTS; i++) {
      const t = await startSshTunnel(dir, squid, sshd, cipher, forwards);
      sshStarts.push(t.readyMs);
      if (i < STARTS - 1) {
        await t.stop();
        // the forward's port is free again once sshd has closed the session
        for (let k = 0; k < 100 && (await accepts(SSHD_IP, fwd.sink)); k++) await sleep(20);
      } else ssh = t;
    }
    await waitForPort(SSHD_IP, fwd.sink);
    say(`OpenSSH: ssh -R ready in ${sshStarts.map((n) => n.toFixed(0)).join(', ')} ms`);

    const direct = (host: string, port: number): Connect => () =>
      new Promise((resolve, reject) => {
        const s = net.connect({ host, port, noDelay: true }, () => resolve(s));
        s.once('error', reject);
      });

    type PathName = 'raw TCP' | 'gateway' | 'OpenSSH ssh -R';
    const paths: Array<{ name: PathName; sink: Connect; echo: Connect; cpu: CpuProbe }> = [
      { name: 'raw TCP', sink: direct(TARGET_IP, sink.port), echo: direct(TARGET_IP, echo.port), cpu: { 'client+sink (bench)': () => 'self' } },
      {
        name: 'gateway',
        sink: viaGateway('sink'),
        echo: viaGateway('echo'),
        cpu: { 'client+sink (bench)': () => 'self', 'Proxy daemon': () => [proxy!.process.pid!], squid: () => [squid!.pid], 'agent daemon': () => [agent!.process.pid!] },
      },
      {
        name: 'OpenSSH ssh -R',
        sink: direct(SSHD_IP, fwd.sink),
        echo: direct(SSHD_IP, fwd.echo),
        cpu: { 'client+sink (bench)': () => 'self', sshd: () => processTree(sshd!.pid), squid: () => [squid!.pid], 'ssh + socat': () => processTree(ssh!.process.pid!) },
      },
    ];

    // --- throughput (paths interleaved run by run) -----------------------------------------------------------
    const bytes = MIB * 2 ** 20;
    const single = new Map<PathName, number[]>();
    const multi = new Map<PathName, number[]>();
    const cpuPerGiB = new Map<PathName, Record<string, number>>();
    for (const p of paths) await throughputOnce(p.sink, sink, 32 * 2 ** 20, 1); // warm-up
    for (let run = 0; run < RUNS; run++) {
      for (const p of paths) {
        const before = cpuSnapshot(p.cpu);
        const rate = await throughputOnce(p.sink, sink, bytes, 1);
        const used = cpuDelta(before, p.cpu);
        const acc = cpuPerGiB.get(p.name) ?? {};
        for (const [k, v] of Object.entries(used)) acc[k] = (acc[k] ?? 0) + v;
        cpuPerGiB.set(p.name, acc);
        single.set(p.name, [...(single.get(p.name) ?? []), rate]);
      }
      say(`single stream run ${run + 1}: ${paths.map((p) => `${p.name} ${single.get(p.name)!.at(-1)!.toFixed(0)}`).join(', ')} MiB/s`);
    }
    const gibMoved = (RUNS * bytes) / 2 ** 30;
    for (const acc of cpuPerGiB.values()) for (const k of Object.keys(acc)) acc[k] = acc[k]! / gibMoved;
    for (let run = 0; run < RUNS; run++) {
      for (const p of paths) multi.set(p.name, [...(multi.get(p.name) ?? []), await throughputOnce(p.sink, sink, bytes, STREAMS)]);
      say(`${STREAMS} streams run ${run + 1}: ${paths.map((p) => `${p.name} ${multi.get(p.name)!.at(-1)!.toFixed(0)}`).join(', ')} MiB/s`);
    }

    // --- round trips -----------------------------------------------------------------------------------------
    const rtt = new Map<PathName, { p50: number; p99: number }>();
    for (const p of paths) {
      rtt.set(p.name, await roundTrips(p.echo, RTTS));
      say(`round trip ${p.name}: p50 ${rtt.get(p.name)!.p50.toFixed(1)} µs, p99 ${rtt.get(p.name)!.p99.toFixed(1)} µs`);
    }
    const load1 = loadavg()[0]!;

    await ssh?.stop();
    ssh = undefined;
    // squid logs a CONNECT when it closes: proof that ssh's connection went through it.
    await squid.waitForAccessLog((l) => l.includes(`CONNECT ${SSHD_NAME}:${sshd!.port} 200`), 10_000);
    await sshd.stop();
    sshd = undefined;

    // --- profile: where the gateway's time goes ----------------------------------------------------------------
    let profiles: { proxy?: ReturnType<typeof summarizeProfile>; agent?: ReturnType<typeof summarizeProfile> } = {};
    let profiledRate: number | undefined;
    if (PROFILE) {
      const profDir = { proxy: join(dir, 'prof-proxy'), agent: join(dir, 'prof-agent') };
      const preload = join(dir, 'profiler.cjs');
      await writeFile(preload, PROFILER_PRELOAD);
      await stopGateway(agent);
      agent = undefined;
      await stopGateway(proxy);
      proxy = await startGateway(proxyYaml, { dataDir: proxyDataDir, env: profilerEnv(preload, profDir.proxy) });
      agent = (await startAgent(proxy, agentYaml, agentDataDir, squid, profilerEnv(preload, profDir.agent))).agent;
      await throughputOnce(viaGateway('sink'), sink, 32 * 2 ** 20, 1);
      proxy.process.kill('SIGUSR2');
      agent.process.kill('SIGUSR2');
      await sleep(200);
      profiledRate = await throughputOnce(viaGateway('sink'), sink, PROFILE_MIB * 2 ** 20, 1);
      await roundTrips(viaGateway('echo'), 2000);
      await stopGateway(agent);
      agent = undefined;
      await stopGateway(proxy);
      proxy = undefined;
      const pp = newestProfile(profDir.proxy);
      const ap = newestProfile(profDir.agent);
      const keep = process.env.BENCH_PROFILE_KEEP;
      if (keep) {
        await mkdir(keep, { recursive: true });
        if (pp) await copyFile(pp, join(keep, 'proxy.cpuprofile'));
        if (ap) await copyFile(ap, join(keep, 'agent.cpuprofile'));
      }
      profiles = { ...(pp ? { proxy: summarizeProfile(pp) } : {}), ...(ap ? { agent: summarizeProfile(ap) } : {}) };
      say(`profiled: ${JSON.stringify(profiles, null, 1)}`);
    } else {
      await stopGateway(agent);
      agent = undefined;
      await stopGateway(proxy);
      proxy = undefined;
    }

    // --- memory per idle agent at BENCH_AGENTS agents ------------------------------------------------------------
    const memPort = await getPort({ host: PROXY_IP });
    const memAddr = `${PROXY_NAME}:${memPort}`;
    const memDataDir = join(dir, 'mem-data');
    memProxy = await startGateway(proxyConfig('idle.example', memPort), { dataDir: memDataDir });
    const memPid = memProxy.process.pid!;
    const memGwctl = async (args: string[]) => {
      const r = await runCli('gwctl', ['--data-dir', memDataDir, ...args], { env: adminEnv });
      if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.stderr}`);
      return r.stdout;
    };
    const memToken = JSON.parse(await memGwctl(['tokens', 'add', '--type=app', '--uses=0', '--ttl=1h', '--format', 'json'])) as { token: string; ca_pin: string };
    const agentDialer = new Dialer({ env: {}, lookup: benchLookup });
    const cas = await fetchPinnedCas(memAddr, memToken.ca_pin, agentDialer);
    const identities: HostIdentity[] = new Array(AGENTS);
    let next = 0;
    const tJoin = Date.now();
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        for (let i = next++; i < AGENTS; i = next++) {
          const keys = generateKeyPair();
          const nodename = `idle-${i}`;
          const bundle = await new ApiClient({ address: memAddr, dialer: agentDialer, ca: cas.host_ca }).call<CertBundle & { hostId: string }>('POST', '/webapi/join', {
            token: memToken.token,
            roles: ['app'],
            nodename,
            public_addrs: [],
            public_key: keys.publicKeyPem,
            ssh_public_key: keys.sshPublicKey,
          });
          identities[i] = {
            hostId: bundle.hostId,
            cluster: bundle.clusterName,
            roles: ['app'],
            nodename,
            server: memAddr,
            joinedVia: 'proxy',
            key: keys.privateKeyPem,
            cert: bundle.tlsCert,
            sshCert: bundle.sshCert,
            hostCa: bundle.hostCaPem,
            userCa: bundle.userCaPem,
            sshUserCa: bundle.sshUserCa,
            identity: identityFromCert(bundle.tlsCert),
          };
        }
      }),
    );
    say(`memory: ${AGENTS} identities joined in ${((Date.now() - tJoin) / 1000).toFixed(1)} s`);
    await sleep(2000);
    const rssBefore = await rssKiB(memPid);
    let tConnect = Date.now();
    const BATCH = 50;
    const half = Math.floor(AGENTS / 2 / BATCH) * BATCH;
    let rssHalf: number | undefined;
    let connectSecs = 0;
    for (let i = 0; i < AGENTS; i += BATCH) {
      if (i === half && half > 0) {
        // Midway reading: the slope between it and the last one leaves out whatever the joins left in the heap.
        connectSecs += (Date.now() - tConnect) / 1000;
        await sleep(3000);
        rssHalf = await rssKiB(memPid);
        tConnect = Date.now();
      }
      const batch = identities.slice(i, i + BATCH).map(
        (identity) =>
          new TunnelAgent({
            identity,
            dialer: agentDialer,
            services: ['app'],
            resources: { databases: [], apps: [{ name: `app-${identity.nodename}`, kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] },
            connectResource: () => Promise.reject(new Error('idle agent')),
          }),
      );
      idleAgents.push(...batch);
      await withTimeout(
        'idle agents connecting',
        Promise.all(
          batch.map((a) => {
            const connected = new Promise<void>((r) => a.once('connected', () => r()));
            a.start();
            return connected;
          }),
        ),
        120_000,
      );
    }
    connectSecs += (Date.now() - tConnect) / 1000;
    say(`memory: ${AGENTS} agents connected in ${connectSecs.toFixed(1)} s`);
    await sleep(3000);
    const allUp = idleAgents.every((a) => a.getState() === 'connected');
    const rssAfter = await rssKiB(memPid);
    const perAgentKiB = (rssAfter - rssBefore) / AGENTS;
    const slopeKiB = rssHalf === undefined ? NaN : (rssAfter - rssHalf) / (AGENTS - half);
    say(`memory: Proxy RSS ${rssBefore} KiB -> ${rssHalf ?? '-'} KiB at ${half} -> ${rssAfter} KiB at ${AGENTS}: ${perAgentKiB.toFixed(1)} KiB per agent, ${slopeKiB.toFixed(1)} KiB per agent over the second half (all connected: ${allUp})`);
    for (const a of idleAgents) a.stop();
    idleAgents.length = 0;
    await sleep(500);
    await stopGateway(memProxy);
    memProxy = undefined;

    // --- the section ------------------------------------------------------------------------------------------
    const med = (m: Map<PathName, number[]>, n: PathName) => median(m.get(n)!);
    const G = 'gateway' as const;
    const O = 'OpenSSH ssh -R' as const;
    const R = 'raw TCP' as const;
    const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;
    const f0 = (n: number) => n.toFixed(0);
    const f1 = (n: number) => n.toFixed(1);
    const rows: Array<[string, (p: PathName) => number, (n: number) => string, 'higher' | 'lower']> = [
      ['throughput, 1 stream (MiB/s, median of ' + RUNS + ')', (p) => med(single, p), f0, 'higher'],
      [`throughput, ${STREAMS} streams (MiB/s aggregate, median of ${RUNS})`, (p) => med(multi, p), f0, 'higher'],
      ['64-byte round trip p50 (µs)', (p) => rtt.get(p)!.p50, f1, 'lower'],
      ['64-byte round trip p99 (µs)', (p) => rtt.get(p)!.p99, f1, 'lower'],
    ];
    const table = [
      `| figure | raw TCP | gateway | OpenSSH ssh -R (peer) | gateway / OpenSSH | gateway / raw |`,
      '|---|---|---|---|---|---|',
      ...rows.map(([label, get, fmt]) => `| ${label} | ${fmt(get(R))} | ${fmt(get(G))} | ${fmt(get(O))} | ${ratio(get(G), get(O))} | ${ratio(get(G), get(R))} |`),
      `| agent start -> tunnel ready (ms, median of ${STARTS}) | – | ${f0(median(starts.map((s) => s.readyMs)))} | ${f0(median(sshStarts))} | ${ratio(median(starts.map((s) => s.readyMs)), median(sshStarts))} | – |`,
      `| Proxy memory per idle connected agent at ${AGENTS} agents (KiB of VmRSS) | – | ${f1(perAgentKiB)} | – | – | – |`,
    ];
    const wins = rows.map(([label, get, , better]) => ({ label, win: better === 'higher' ? get(G) > get(O) : get(G) < get(O) }));
    const components = (p: PathName) =>
      Object.entries(cpuPerGiB.get(p)!)
        .map(([k, v]) => `${k} ${v.toFixed(2)}`)
        .join(', ');
    const cpuTotal = (p: PathName) => Object.values(cpuPerGiB.get(p)!).reduce((a, b) => a + b, 0);
    const fmtTop = (s: ReturnType<typeof summarizeProfile>) => s.top.slice(0, 5).map((t) => `\`${t.frame}\` ${(t.share * 100).toFixed(0)}%`).join(', ');
    const fmtGroups = (s: ReturnType<typeof summarizeProfile>) =>
      Object.entries(s.groups)
        .map(([k, v]) => `${k} ${(v * 100).toFixed(0)}%`)
        .join(', ');
    const lost = wins.filter((w) => !w.win).map((w) => w.label.replace(/ \(.*$/, ''));
    const startMed = { started: median(starts.map((s) => s.startedMs)), ready: median(starts.map((s) => s.readyMs)), proxy: median(starts.map((s) => s.proxyMs)) };
    const cpu = cpus();
    const section = [
      '## tunnel',
      '',
      `Run ${new Date(began).toISOString()} with \`npm run bench:tunnel\` (${Math.round((Date.now() - began) / 1000)} s). ` +
        `Client in the bench process; sink and echo servers on ${TARGET_IP} (same process); squid 5 (Debian) on ${squid.host}; ` +
        `gateway: real \`gateway start\` daemons, the Proxy (auth + proxy) on ${PROXY_IP} and an app_service agent whose reverse tunnel ` +
        `(SSH over TLS, ALPN gateway-reversetunnel) goes through squid to ${PROXY_NAME}, a name only squid resolves; the client opens ` +
        `gateway-tcp streams with a gwsh profile (openResource, ${clientTls}). ` +
        `Peer: ${sshVersion} \`sshd\` on ${SSHD_IP} and \`ssh -N -R\` with \`ProxyCommand=socat - PROXY:\` through the same squid ` +
        `to ${SSHD_NAME}; the client connects to the forwarded port. Both SSH connections: ${cipher}, ECDSA P-256 keys. ` +
        `Throughput: ${MIB} MiB per run (${STREAMS} streams share it in the parallel case), median of ${RUNS}, paths interleaved; ` +
        `round trip: ${RTTS} samples of ${MSG} bytes on one established stream; nothing pinned to a CPU` +
        `${DAEMON_NODE_OPTIONS ? `; daemons run with NODE_OPTIONS="${DAEMON_NODE_OPTIONS}"` : ''}.`,
      `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}, ${sshVersion}, ` +
        `cipher ${cipher}; load average ${load0.toFixed(2)} at the start, ${load1.toFixed(2)} after the data-path figures (other work shared the machine).`,
      '',
      ...table,
      '',
      `- Ratios: throughput above 1 and times below 1 are better for the gateway. The gateway ${lost.length === 0 ? 'beats OpenSSH on every throughput and latency figure' : `does not beat OpenSSH on: ${lost.join('; ')}`}.`,
      `- Tunnel ready: spawn -> "gateway started" ${f0(startMed.started)} ms (Node start, configuration, stored identity), -> "reverse tunnel ready" ${f0(startMed.ready)} ms, ` +
        `the Proxy logged "agent connected" at ${f0(startMed.proxy)} ms (each start: ${starts.map((s) => f0(s.readyMs)).join(', ')} ms; ssh: ${sshStarts.map(f0).join(', ')} ms).`,
      `- Idle memory: a fresh Proxy daemon went from ${(rssBefore / 1024).toFixed(1)} MiB to ${(rssAfter / 1024).toFixed(1)} MiB VmRSS with ${AGENTS} idle agents connected ` +
        `(${rssHalf === undefined ? '' : `${(rssHalf / 1024).toFixed(1)} MiB at ${half}, so ${f1(slopeKiB)} KiB per agent over the second half; `}` +
        `identities joined through POST /webapi/join with one --uses=0 token before the first reading; the agents are TunnelAgent instances in the bench process, dialing the Proxy directly ` +
        `(TLS with ALPN gateway-reversetunnel, SSH, control channel), connected in ${f1(connectSecs)} s in batches of 50; all still connected at the last reading: ${allUp ? 'yes' : 'no'}). Kernel socket buffers are not in RSS.`,
      `- CPU seconds per GiB moved (single stream, by process): gateway ${components(G)} (total ${cpuTotal(G).toFixed(2)}); ` +
        `OpenSSH ${components(O)} (total ${cpuTotal(O).toFixed(2)}); raw TCP ${components(R)}.`,
      ...(profiles.proxy && profiles.agent
        ? [
            `- CPU profile (V8 sampler, as \`--cpu-prof\`, started after a warm-up stream; one ${PROFILE_MIB} MiB stream at ${f0(profiledRate!)} MiB/s plus 2 000 round trips; shares of busy time). ` +
              `Proxy: ${fmtTop(profiles.proxy)}; by group ${fmtGroups(profiles.proxy)}. ` +
              `Agent: ${fmtTop(profiles.agent)}; by group ${fmtGroups(profiles.agent)}.`,
          ]
        : []),
      `- Where the time goes: WHERE_PLACEHOLDER`,
      '',
    ].join('\n');
    const aes = { 256: cipherSecondsPerGiB('aes-256-gcm'), 128: cipherSecondsPerGiB('aes-128-gcm') };
    const where = whereTheTimeGoes({
      aes,
      G: cpuPerGiB.get(G)!,
      O: cpuPerGiB.get(O)!,
      lost,
      profiles,
      single: med(single, G) / med(single, O),
      multi: med(multi, G) / med(multi, O),
      p50: rtt.get(G)!.p50 / rtt.get(O)!.p50,
      p99: rtt.get(G)!.p99 / rtt.get(O)!.p99,
    });
    const text = section.replace('WHERE_PLACEHOLDER', where);
    process.stdout.write(`\n${text}\n`);
    if (process.env.BENCH_RECORD !== '0') await recordSection('tunnel', text);
  } finally {
    for (const a of idleAgents) a.stop();
    await ssh?.stop();
    await sshd?.stop();
    await stopGateway(agent);
    await stopGateway(proxy);
    await stopGateway(memProxy);
    for (const s of servers) await s.close();
    await squid?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/** One honest paragraph from the measured CPU split and the profiles. */
function whereTheTimeGoes(d: {
  G: Record<string, number>;
  O: Record<string, number>;
  lost: string[];
  profiles: { proxy?: ReturnType<typeof summarizeProfile>; agent?: ReturnType<typeof summarizeProfile> };
  /** CPU seconds per GiB of one AES-GCM pass (TLS 1.3 here uses AES-256-GCM, the SSH connections AES-128-GCM). */
  aes: { 128: number; 256: number };
  /** gateway / OpenSSH */
  single: number;
  multi: number;
  p50: number;
  p99: number;
}): string {
  const total = (r: Record<string, number>) => Object.values(r).reduce((a, b) => a + b, 0);
  const pct = (n: number) => `${(n * 100).toFixed(0)}%`;
  const x = (n: number) => `${n.toFixed(2)}x`;
  const cpuRatio = total(d.G) / total(d.O);
  const gatewayCipher = 4 * d.aes[256] + 2 * d.aes[128];
  const opensshCipher = 2 * d.aes[128];
  const cipherShare = (gatewayCipher - opensshCipher) / Math.max(1e-9, total(d.G) - total(d.O));
  const latency =
    d.p50 <= 1
      ? `The median round trip is at or below OpenSSH's (${x(d.p50)}): a 64-byte message costs little CPU, and both paths cross a similar chain of processes each way (Proxy, squid, agent against sshd, squid, socat, ssh)`
      : d.p50 < 1.25
        ? `The median round trip is close to OpenSSH's (${x(d.p50)}): a 64-byte message costs little CPU, and both paths cross a similar chain of processes each way (Proxy, squid, agent against sshd, squid, socat, ssh); the extra is the gateway's per-message work (two TLS records and an SSH packet in the Proxy, the same again in the agent)`
        : `The median round trip is ${x(d.p50)} OpenSSH's: each message is a TLS record from the client, an SSH packet inside a TLS record to the agent and the same back, each step a JavaScript callback chain in the Proxy and the agent`;
  const tail = `; p99 (${x(d.p99)}) is mostly scheduling: the path's processes share two cores with each other${d.p99 > 1.5 || d.p99 < 0.67 ? ' and with whatever else runs, so it swings from run to run' : ''}.`;
  const parts = [
    `${d.lost.length === 0 ? 'the gateway is ahead on every data-path figure, though ' : ''}per GiB moved the gateway's path uses ${total(d.G).toFixed(2)} CPU-s against OpenSSH's ${total(d.O).toFixed(2)} ` +
      `(${cpuRatio.toFixed(2)}x): the Proxy daemon ${(d.G['Proxy daemon'] ?? 0).toFixed(2)} s and the agent ${(d.G['agent daemon'] ?? 0).toFixed(2)} s, ` +
      `where sshd uses ${(d.O.sshd ?? 0).toFixed(2)} s and ssh + socat ${(d.O['ssh + socat'] ?? 0).toFixed(2)} s. With every process of the path on two cores, ` +
      `a stream goes as fast as the CPU left to its hops allows: one stream reached ${x(d.single)} OpenSSH's rate, ${STREAMS} streams ${x(d.multi)}. ` +
      `Parallel streams add no thread to either tunnel: all of them share one SSH connection, so one JavaScript thread in the Proxy and one in the agent (one sshd session process and one ssh) carry them all.`,
    latency + tail,
  ];
  const p = d.profiles.proxy;
  const a = d.profiles.agent;
  if (p && a) {
    const split = (s: ReturnType<typeof summarizeProfile>) =>
      `${pct(s.groups['socket writes'])} in socket writes, ${pct(s.groups.ssh2)} in ssh2, ${pct(s.groups['node streams'])} in Node's stream code and ${pct(s.groups['garbage collector'])} in GC`;
    parts.push(
      `The Proxy spends ${split(p)}; the agent ${split(a)}. "Socket writes" are the native writev/writeBuffer: for the tunnel's TLS socket the record encryption and then the write ` +
        'syscall, for a plain socket the syscall alone, which on loopback also runs the receiving side\'s TCP input. ' +
        `In the agent ${pct(a.splicedWrites)} of that write time is the plain write() of each packet's bytes to the resource; in the Proxy ${pct(1 - p.splicedWrites)} is the tunnel's TLS socket (SSH packets, written at once or queued and flushed with writev). ` +
        `The ciphers are ${cipherShare < 0.4 ? 'a small' : cipherShare < 0.7 ? 'a large' : 'most of the'} part of the difference: at the AES-GCM speed \`openssl speed\` measures on this machine (${(1 / d.aes[256]).toFixed(1)} GiB/s per core for AES-256, ${(1 / d.aes[128]).toFixed(1)} for AES-128), ` +
        `the gateway's six passes over each byte (encrypt and decrypt of the client's TLS, of SSH and of the tunnel's TLS) cost ${gatewayCipher.toFixed(2)} CPU-s per GiB and OpenSSH's two ${opensshCipher.toFixed(2)}, ` +
        `${(gatewayCipher - opensshCipher).toFixed(2)} of the ${(total(d.G) - total(d.O)).toFixed(2)} CPU-s difference. The rest is per chunk: ` +
        'the client\'s TLS socket delivers 16 KiB records, each becomes one 16 KiB SSH packet (a fresh Buffer, random padding, a cipher call, a TLS record and a write in the Proxy), ' +
        'and the agent decrypts it and makes one write() to the resource per packet, while sshd and ssh move up to 32 KiB packets through buffered C code. ' +
        'ssh -R\'s client leg is plain TCP, and its tunnel is SSH alone, with no TLS around it.',
    );
  }
  return parts.join(' ');
}

await main();
