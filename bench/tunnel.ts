/**
 * bench:tunnel — the gateway's reverse tunnel through a real squid, against two baselines measured in the same run:
 *
 *   raw TCP    client -> sink/echo server on 127.0.0.3 (the floor)
 *   gateway    client (this process: openResource, TLS with ALPN gateway-tcp and a gwsh profile) -> Proxy daemon
 *              (auth + proxy, real `gateway start`) -> the agent's reverse tunnel (protocol v2: frames over mutual TLS,
 *              over squid CONNECT; the section names what the two negotiated)
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
 *   user path         what a user runs: `iperf3 -c` -> a real `gwsh proxy app iperf` process (its own profile,
 *                     signed in to the Proxy's listen address) -> Proxy -> tunnel through squid -> agent -> `iperf3
 *                     -s` (a tcp:// app), against `iperf3 -c` -> a third forward of the same `ssh -R` -> `iperf3 -s`
 *                     (a second server: one per path). iperf3's sum_received (-J) for 1 and BENCH_STREAMS streams,
 *                     BENCH_RUNS runs of BENCH_IPERF_SECONDS alternating the paths (median), CPU seconds per GiB of
 *                     every process of each path, round trips through `gwsh proxy app echo`, and BENCH_CONNECTS new
 *                     connections (connect, one echo, close). With BENCH_PROFILE, gwsh under the sampler for a run.
 *   idle memory       a fresh Proxy daemon (its open-file limit raised to the hard limit, max_connections written);
 *                     BENCH_AGENTS host identities joined with one multi-use token through POST /webapi/join, then
 *                     as many TunnelAgent instances connected (direct, not through squid: what is measured is the
 *                     Proxy), all in BENCH_AGENT_PROCS child processes (this file with BENCH_TUNNEL_CHILD=idle-agents,
 *                     each from its own loopback source addresses); the Proxy's VmRSS before and at a quarter, half
 *                     and all of them connected and idle: per agent overall and over the second half (which leaves
 *                     out what the joins left in the heap), at half and at all; then the Proxy's CPU over
 *                     BENCH_IDLE_CPU_SECS with every agent idle (heartbeats, presence refreshes) and its memory
 *                     once more after that time (V8's memory reducer gives back the pages the connection storm
 *                     left once the process is idle: the steady figure).
 *   profile           (BENCH_PROFILE=1, the default) the Proxy and the agent restarted under the V8 sampling
 *                     profiler (what --cpu-prof uses; started by a preload, see PROFILER_PRELOAD), one
 *                     single-stream run of BENCH_PROFILE_MIB MiB and 2 000 round trips; the heaviest self-time
 *                     frames of each are recorded. Its figures are not the measured ones.
 *
 * Settings (environment): BENCH_MIB (512), BENCH_RUNS (3), BENCH_STREAMS (8), BENCH_RTTS (5000), BENCH_RTT_WARMUP (5000), BENCH_STARTS (3),
 * BENCH_AGENTS (10000), BENCH_AGENT_PROCS (2), BENCH_IDLE_CPU_SECS (60: the idle Proxy's CPU over this long, 0: not
 * read), BENCH_IPERF_SECONDS (3), BENCH_CONNECTS (50), BENCH_PROFILE (1),
 * BENCH_PROFILE_MIB (256), BENCH_PROFILE_KEEP (a directory to copy the .cpuprofile files to, for Chrome DevTools),
 * BENCH_TUNNEL_ONLY (userpath: set up, run the user path and print it; idle: the idle-memory phase alone; neither is
 * recorded), BENCH_IDLE_PROFILE (a directory: the idle Proxy profiled while the last half of the agents connect),
 * BENCH_IDLE_HEAPSNAPSHOT (a directory: the idle Proxy's V8 heap snapshot after each of its full gcs),
 * BENCH_GWSH_BEFORE (another build's gwsh.js, e.g. a copy of dist/ kept inside the repository: run as a third path
 * of the user path, for before/after figures in one run; printed, not recorded), BENCH_GWSH_NODE_OPTIONS (NODE_OPTIONS of the user path's gwsh processes, e.g. a preload; printed runs), BENCH_DAEMON_NODE_OPTIONS (Node options for the data path's Proxy and
 * agent daemons, e.g. "--max-semi-space-size=32"; recorded in the section when set), BENCH_DAEMON_GLIBC_TUNABLES (glibc
 * malloc settings for the same daemons, passed as GLIBC_TUNABLES; recorded when set), BENCH_RECORD (0: print the
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
import { fileURLToPath } from 'node:url';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import getPort from 'get-port';
import type { HostIdentity } from '../src/agent/identity.js';
import { parseAddr } from '../src/addr.js';
import { generateKeyPair, identityFromCert } from '../src/auth/pki.js';
import type { CertBundle } from '../src/auth/service.js';
import { ApiClient, fetchPinnedCas } from '../src/client/api.js';
import { loadProfile, type Profile } from '../src/client/profile.js';
import { openResource } from '../src/client/resources.js';
import { FramedStream } from '../src/stream/framed.js';
import { Dialer } from '../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../src/log.js';
import { TunnelAgent } from '../src/agent/tunnel.js';
import { BIN, runCli, startGateway, type RunningGateway } from '../test/helpers/gateway.js';
import { startEchoServer, type TestServer } from '../test/helpers/servers.js';
import { startSquid, type Squid } from '../test/helpers/squid.js';
import { waitForPort } from '../test/helpers/netns.js';
import { recordSection } from './record.js';
import { measureTlsFloor, type TlsFloor } from './tlsfloor.js';
import { echoOnce, envNumber, spawnSshd } from './common.js';


const MIB = envNumber('BENCH_MIB', 512);
const RUNS = envNumber('BENCH_RUNS', 3);
const STREAMS = envNumber('BENCH_STREAMS', 8);
const RTTS = envNumber('BENCH_RTTS', 5000);
/**
 * Round trips before the measured ones, on the same stream, for every path alike. With 200 the gateway's p99 on
 * the user path was 2.4-2.5 ms against 0.35-0.46 with 5 000: the Node.js processes were still compiling the path
 * (perf sched: their V8 background threads ran in chunks over 1 ms on the two cores while the round trips went on).
 */
const RTT_WARMUP = envNumber('BENCH_RTT_WARMUP', 5000, 0);
const STARTS = envNumber('BENCH_STARTS', 3);
const AGENTS = envNumber('BENCH_AGENTS', 10_000);
const AGENT_PROCS = envNumber('BENCH_AGENT_PROCS', 2);
/** BENCH_TUNNEL_ONLY=idle: the idle-memory phase alone, printed and not recorded (for work on the Proxy's memory). */
const ONLY = process.env.BENCH_TUNNEL_ONLY ?? '';
/** Seconds the idle Proxy's CPU is read over once every agent is connected (three 20 s heartbeat rounds). */
const IDLE_CPU_SECS = envNumber('BENCH_IDLE_CPU_SECS', 60, 0);
/** A directory: the idle Proxy writes a V8 heap snapshot there after each full gc (compare two checkpoints). */
const HEAP_DIR = process.env.BENCH_IDLE_HEAPSNAPSHOT;
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
  for (let i = 0; i < RTT_WARMUP; i++) await once(); // warm-up: the steady state, not V8 still compiling the path
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

function proxyConfig(cluster: string, webPort: number, maxConnections?: number): string {
  return [
    'gateway:',
    '  nodename: proxy-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: info }',
    ...(maxConnections === undefined ? [] : [`  limits: { max_connections: ${maxConnections} }`]),
    'auth_service:',
    `  cluster_name: ${cluster}`,
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    `  web_listen_addr: ${PROXY_IP}:${webPort}`,
    `  public_addr: ${PROXY_NAME}:${webPort}`,
    '',
  ].join('\n');
}

function agentConfig(sinkPort: number, echoPort: number, iperfPort: number): string {
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
    `    - { name: iperf, uri: "tcp://${TARGET_IP}:${iperfPort}" }`,
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
  /** The tunnel protocol the two negotiated, as the Proxy logged it (v2, or v1: SSH). */
  protocol: string;
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
  const protocol = connected ? `v${(JSON.parse(connected) as { protocol?: number }).protocol ?? 1}` : 'unknown';
  return { agent, startedMs: logTime(started) - t0, readyMs: logTime(ready) - t0, proxyMs: connected ? logTime(connected) - t0 : NaN, protocol };
}

/** What the agent's starts negotiated, in words for the section. */
function tunnelProtocolText(starts: AgentStart[]): string {
  const seen = [...new Set(starts.map((s) => s.protocol))];
  const words: Record<string, string> = { v2: 'protocol v2: frames straight over mutual TLS, ALPN gateway-reversetunnel-v2', v1: 'protocol v1: SSH over TLS, ALPN gateway-reversetunnel' };
  return seen.map((p) => words[p] ?? `protocol ${p}`).join('; ');
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
 * out, and writes $BENCH_CPU_PROF_DIR/<pid>.cpuprofile on the next SIGUSR2 or when the process exits, whichever
 * comes first (gwsh proxy app may be kept alive by a connection the Proxy lets linger).
 */
const PROFILER_PRELOAD = `
const { Session } = require('node:inspector');
const { mkdirSync, writeFileSync } = require('node:fs');
const dir = process.env.BENCH_CPU_PROF_DIR;
const session = new Session();
session.connect();
session.post('Profiler.enable');
let state = 'idle';
const write = () => {
  if (state !== 'started') return;
  state = 'written';
  // A session in the same thread answers synchronously, so this runs before the process is gone.
  session.post('Profiler.stop', (err, res) => {
    if (err || !res) return;
    mkdirSync(dir, { recursive: true });
    writeFileSync(dir + '/' + process.pid + '.cpuprofile', JSON.stringify(res.profile));
  });
};
process.on('SIGUSR2', () => {
  if (state !== 'idle') return write();
  state = 'started';
  session.post('Profiler.start');
});
process.once('exit', write);
`;

/** Extra Node options for the Proxy and agent daemons of the data path (BENCH_DAEMON_NODE_OPTIONS), e.g. GC settings. */
const DAEMON_NODE_OPTIONS = process.env.BENCH_DAEMON_NODE_OPTIONS?.trim() ?? '';

/** glibc malloc settings for the same daemons (BENCH_DAEMON_GLIBC_TUNABLES, passed as GLIBC_TUNABLES). */
const DAEMON_GLIBC_TUNABLES = process.env.BENCH_DAEMON_GLIBC_TUNABLES?.trim() ?? '';

function daemonEnv(extraNodeOptions = ''): Record<string, string> {
  const opts = [DAEMON_NODE_OPTIONS, extraNodeOptions].filter(Boolean).join(' ');
  return { ...(opts ? { NODE_OPTIONS: opts } : {}), ...(DAEMON_GLIBC_TUNABLES ? { GLIBC_TUNABLES: DAEMON_GLIBC_TUNABLES } : {}) };
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
// the user's path: a native client (iperf3) -> `gwsh proxy app` -> Proxy -> tunnel -> agent -> iperf3 -s, against
// iperf3 -> the forwarded port of `ssh -R` -> iperf3 -s

interface Iperf3Server {
  pid: number;
  port: number;
  stop(): Promise<void>;
}

/** `iperf3 -s` on TARGET_IP (one test at a time; the paths take turns). */
async function startIperf3Server(): Promise<Iperf3Server> {
  const port = await getPort({ host: TARGET_IP });
  const child = spawn('iperf3', ['-s', '-B', TARGET_IP, '-p', String(port)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr!.on('data', (c: Buffer) => (log = (log + c.toString()).slice(-4000)));
  const up = await Promise.race([waitForPort(TARGET_IP, port).then(() => true), exited(child).then(() => false)]);
  if (!up) throw new Error(`iperf3 -s did not start:\n${log}`);
  return { pid: child.pid!, port, stop: () => stopChild(child) };
}

interface IperfResult {
  /** sum_received: what the server got, bits per second and bytes. */
  bitsPerSecond: number;
  bytes: number;
}

/**
 * One `iperf3 -c -J` test. A server still finishing the previous test (its connections are closed through the
 * path, which can take a moment) answers "busy": tried again for up to 30 s.
 */
async function runIperf3(host: string, port: number, streams: number, seconds: number): Promise<IperfResult> {
  for (let i = 0; ; i++) {
    try {
      return await runIperf3Once(host, port, streams, seconds);
    } catch (err) {
      if (!/busy/.test((err as Error).message) || i >= 60) throw err;
      await sleep(500);
    }
  }
}

/** One `iperf3 -c -J` test; rejects with its error or output when it fails. */
async function runIperf3Once(host: string, port: number, streams: number, seconds: number): Promise<IperfResult> {
  const child = spawn('iperf3', ['-c', host, '-p', String(port), '-J', '-t', String(seconds), '-P', String(streams)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
  const code = await withTimeout('iperf3 -c', new Promise<number | null>((r) => child.once('close', r)), (seconds + 60) * 1000);
  let json: { error?: string; end?: { sum_received?: { bits_per_second: number; bytes: number } } } = {};
  try {
    json = JSON.parse(out) as typeof json;
  } catch {
    // not JSON: reported below
  }
  const sum = json.end?.sum_received;
  if (code !== 0 || !sum) throw new Error(`iperf3 -c ${host}:${port} -P ${streams} failed (exit ${code}): ${json.error ?? (err || out.slice(0, 2000))}`);
  return { bitsPerSecond: sum.bits_per_second, bytes: sum.bytes };
}

/** CPU seconds (user + system) of this process's children that have exited and been waited for. */
function reapedChildrenCpuSeconds(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[13]) + Number(fields[14])) / CLK_TCK; // cutime, cstime (fields 16 and 17)
}

interface LocalProxy {
  process: ChildProcess;
  port: number;
  stop(): Promise<void>;
}

/** A real `gwsh proxy app <name> --port 0` with the given profile directory; resolves once it listens. */
async function startGwshProxy(gwshHome: string, home: string, app: string, env: Record<string, string> = {}, bin = BIN('gwsh')): Promise<LocalProxy> {
  const child = spawn(process.execPath, [bin, 'proxy', 'app', app, '--port', '0'], {
    env: { PATH: process.env.PATH ?? '', HOME: home, GWSH_HOME: gwshHome, ...(GWSH_NODE_OPTIONS ? { NODE_OPTIONS: GWSH_NODE_OPTIONS } : {}), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-8000)));
  const port = await withTimeout(
    `gwsh proxy app ${app}`,
    new Promise<number>((resolve, reject) => {
      const check = () => {
        const m = /on 127\.0\.0\.1:(\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      };
      child.stdout!.on('data', check);
      child.once('exit', (code) => reject(new Error(`gwsh proxy app ${app} exited with ${code}:\n${out}`)));
    }),
    30_000,
  );
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    // SIGINT: gwsh closes its listener and exits once its connections are gone; one the Proxy lets linger after
    // the resource closed (half_close_linger) would keep it for up to 30 s.
    child.kill('SIGINT');
    const killer = setTimeout(() => child.kill('SIGKILL'), 2_000);
    await exited(child);
    clearTimeout(killer);
  };
  return { process: child, port, stop };
}

/** Opening a new connection through the path and one 64-byte echo on it, then closing it: ms. */
async function connectAndEcho(host: string, port: number): Promise<number> {
  const t0 = process.hrtime.bigint();
  const s = await new Promise<net.Socket>((resolve, reject) => {
    const c = net.connect({ host, port, noDelay: true }, () => resolve(c));
    c.once('error', reject);
  });
  await withTimeout('echo through a new connection', echoOnce(s, Buffer.alloc(MSG, 0x62)), 30_000);
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  s.destroy();
  return ms;
}

/** The two paths, and with BENCH_GWSH_BEFORE a third: the same gateway through another build of gwsh. */
type UserPathName = 'gateway (gwsh proxy app)' | 'OpenSSH ssh -R' | 'gateway (BENCH_GWSH_BEFORE)';

/** Another gwsh.js (e.g. a copy of dist/ before a change) run as a third path, for before/after figures in one run. */
const GWSH_BEFORE = process.env.BENCH_GWSH_BEFORE ?? '';
/** BENCH_GWSH_NODE_OPTIONS: NODE_OPTIONS of the user path's gwsh processes, to try settings or preloads (printed runs). */
const GWSH_NODE_OPTIONS = process.env.BENCH_GWSH_NODE_OPTIONS ?? '';

interface UserPathRoute {
  name: UserPathName;
  iperf: { host: string; port: number };
  echo: { host: string; port: number };
  cpu: CpuProbe;
}

interface UserPathFigures {
  seconds: number;
  runs: number;
  /** Mbit/s per run, by stream count then path. */
  rates: Map<number, Map<UserPathName, number[]>>;
  /** CPU seconds per GiB received, single-stream runs, by component (the iperf3 client included). */
  cpuPerGiB: Map<UserPathName, Record<string, number>>;
  rtt: Map<UserPathName, { p50: number; p99: number }>;
  /** ms, connect + first echo + close, median and samples. */
  connect: Map<UserPathName, number[]>;
  /** CPU ms per new connection, by component (from /proc: 10 ms ticks, averaged over BENCH_CONNECTS). */
  connectCpu: Map<UserPathName, Record<string, number>>;
}

const IPERF_SECONDS = envNumber('BENCH_IPERF_SECONDS', 3);
const CONNECTS = envNumber('BENCH_CONNECTS', 50);

/** iperf3 through both paths, alternating, 1 and STREAMS streams; then round trips and new connections. */
async function measureUserPath(routes: UserPathRoute[], say: (s: string) => void): Promise<UserPathFigures> {
  const rates = new Map<number, Map<UserPathName, number[]>>();
  const cpuPerGiB = new Map<UserPathName, Record<string, number>>();
  const gib = new Map<UserPathName, number>();
  for (const r of routes) await runIperf3(r.iperf.host, r.iperf.port, 1, 1); // warm-up
  for (let run = 0; run < RUNS; run++) {
    for (const streams of [1, STREAMS]) {
      const byPath = rates.get(streams) ?? new Map<UserPathName, number[]>();
      rates.set(streams, byPath);
      for (const r of routes) {
        const before = cpuSnapshot(r.cpu);
        const client0 = reapedChildrenCpuSeconds();
        const res = await runIperf3(r.iperf.host, r.iperf.port, streams, IPERF_SECONDS);
        const used = { ...cpuDelta(before, r.cpu), 'iperf3 -c': reapedChildrenCpuSeconds() - client0 };
        byPath.set(r.name, [...(byPath.get(r.name) ?? []), res.bitsPerSecond / 1e6]);
        if (streams !== 1) continue;
        const acc = cpuPerGiB.get(r.name) ?? {};
        for (const [k, v] of Object.entries(used)) acc[k] = (acc[k] ?? 0) + v;
        cpuPerGiB.set(r.name, acc);
        gib.set(r.name, (gib.get(r.name) ?? 0) + res.bytes / 2 ** 30);
      }
      say(`user path run ${run + 1}, ${streams} stream(s): ${routes.map((r) => `${r.name} ${byPath.get(r.name)!.at(-1)!.toFixed(0)}`).join(', ')} Mbit/s`);
    }
  }
  for (const [name, acc] of cpuPerGiB) for (const k of Object.keys(acc)) acc[k] = acc[k]! / gib.get(name)!;
  const rtt = new Map<UserPathName, { p50: number; p99: number }>();
  const connect = new Map<UserPathName, number[]>();
  for (const r of routes) {
    const direct: Connect = () =>
      new Promise((resolve, reject) => {
        const s = net.connect({ host: r.echo.host, port: r.echo.port, noDelay: true }, () => resolve(s));
        s.once('error', reject);
      });
    rtt.set(r.name, await roundTrips(direct, Math.min(RTTS, 2000)));
  }
  const connectCpu = new Map<UserPathName, Record<string, number>>();
  for (let i = 0; i < CONNECTS; i++) {
    for (const r of routes) {
      const before = cpuSnapshot(r.cpu);
      connect.set(r.name, [...(connect.get(r.name) ?? []), await connectAndEcho(r.echo.host, r.echo.port)]);
      const acc = connectCpu.get(r.name) ?? {};
      for (const [k, v] of Object.entries(cpuDelta(before, r.cpu))) acc[k] = (acc[k] ?? 0) + (v * 1000) / CONNECTS;
      connectCpu.set(r.name, acc);
    }
  }
  for (const r of routes) say(`user path ${r.name}: round trip p50 ${rtt.get(r.name)!.p50.toFixed(1)} µs; new connection + echo ${median(connect.get(r.name)!).toFixed(2)} ms`);
  return { seconds: IPERF_SECONDS, runs: RUNS, rates, cpuPerGiB, rtt, connect, connectCpu };
}

const GW_USER: UserPathName = 'gateway (gwsh proxy app)';
const SSH_USER: UserPathName = 'OpenSSH ssh -R';

/** The user path's rows of the tunnel table (raw TCP and gateway / raw do not apply). */
function userPathRows(u: UserPathFigures): string[] {
  const mibs = (streams: number, p: UserPathName) => median(u.rates.get(streams)!.get(p)!) / 8 / 1.048576;
  const total = (p: UserPathName) => Object.values(u.cpuPerGiB.get(p)!).reduce((a, b) => a + b, 0);
  const rows: Array<[string, (p: UserPathName) => number, number]> = [
    [`user path: iperf3 throughput, 1 stream (MiB/s, median of ${u.runs} runs of ${u.seconds} s)`, (p) => mibs(1, p), 0],
    [`user path: iperf3 throughput, ${STREAMS} streams (MiB/s aggregate, median of ${u.runs} runs of ${u.seconds} s)`, (p) => mibs(STREAMS, p), 0],
    ['user path: 64-byte round trip p50 (µs)', (p) => u.rtt.get(p)!.p50, 1],
    ['user path: 64-byte round trip p99 (µs)', (p) => u.rtt.get(p)!.p99, 1],
    [`user path: new connection + first 64-byte echo (ms, median of ${u.connect.get(GW_USER)!.length})`, (p) => median(u.connect.get(p)!), 2],
    ['user path: CPU seconds per GiB, every process of the path (1 stream)', total, 2],
  ];
  return rows.map(([label, get, digits]) => `| ${label} | – | ${get(GW_USER).toFixed(digits)} | ${get(SSH_USER).toFixed(digits)} | ${(get(GW_USER) / get(SSH_USER)).toFixed(2)}x | – |`);
}

/** The user path's paragraph: what runs, the CPU split, the gwsh profile. */
function userPathText(u: UserPathFigures, gwsh: ReturnType<typeof summarizeProfile> | undefined): string {
  const components = (p: UserPathName) =>
    Object.entries(u.cpuPerGiB.get(p)!)
      .map(([k, v]) => `${k} ${v.toFixed(2)}`)
      .join(', ');
  const perConnection = (p: UserPathName) =>
    Object.entries(u.connectCpu.get(p)!)
      .map(([k, v]) => `${k} ${v.toFixed(2)}`)
      .join(', ');
  const each = (streams: number, p: UserPathName) => u.rates.get(streams)!.get(p)!.map((r) => (r / 8 / 1.048576).toFixed(0)).join(', ');
  const groups = gwsh
    ? Object.entries(gwsh.groups)
        .filter(([k]) => k !== 'ssh2')
        .map(([k, v]) => `${k} ${(v * 100).toFixed(0)}%`)
        .join(', ')
    : '';
  return (
    `- User path (what a user runs): \`iperf3 -c 127.0.0.1 -p <port> -J -t ${u.seconds}\` -> a real \`gwsh proxy app iperf --port 0\` process (signed in to the Proxy's ` +
    `listen address ${PROXY_IP}) -> the Proxy daemon -> the reverse tunnel through squid -> the agent daemon -> \`iperf3 -s\` on ${TARGET_IP} (a tcp:// app); ` +
    `peer: the same iperf3 client -> a third forward of the same \`ssh -R\` on ${SSHD_IP} -> a second \`iperf3 -s\` on ${TARGET_IP} (one server per path: a test waits for none of the other path's). ` +
    `Throughput is iperf3's sum_received; runs alternate gateway / OpenSSH, 1 stream then ${STREAMS} (\`-P ${STREAMS}\`); each run's MiB/s: ` +
    `1 stream gateway ${each(1, GW_USER)}, OpenSSH ${each(1, SSH_USER)}; ${STREAMS} streams gateway ${each(STREAMS, GW_USER)}, OpenSSH ${each(STREAMS, SSH_USER)}. ` +
    `iperf3 opens its control connection first, through the same path. Round trips: a second \`gwsh proxy app echo\` against ssh -R's echo forward, one connection; ` +
    `new connection: connect, one 64-byte echo, close, alternating paths (for gwsh: a TCP and TLS connection to the Proxy and a route per accepted connection). ` +
    `CPU seconds per GiB received, single-stream runs, by process: gateway ${components(GW_USER)}; OpenSSH ${components(SSH_USER)}. ` +
    `CPU ms per new connection (from /proc, 10 ms ticks averaged over ${CONNECTS}): gateway ${perConnection(GW_USER)}; OpenSSH ${perConnection(SSH_USER)}.` +
    (gwsh
      ? ` gwsh under \`--cpu-prof\` (one ${u.seconds} s single-stream run, shares of its busy time): ${gwsh.top
          .slice(0, 5)
          .map((t) => `\`${t.frame}\` ${(t.share * 100).toFixed(0)}%`)
          .join(', ')}; by group ${groups}.`
      : '')
  );
}

// ---------------------------------------------------------------------------------------------------------------
// idle agents: real TunnelAgent instances in BENCH_AGENT_PROCS child processes (this same file, run with
// BENCH_TUNNEL_CHILD=idle-agents), each from its own loopback source addresses

/** Agents per source address: well under the Proxy's default max_connections_per_source (1000). */
const AGENTS_PER_SOURCE = 400;

/**
 * The direct leg of the Dialer (TCP, Nagle off, keep-alive, half-close) from a chosen loopback source address, and
 * the Proxy's name resolved as only squid's hosts file does. Everything above the TCP connection (TLS, the
 * tunnel) is the product's.
 */
class SourceDialer extends Dialer {
  constructor(private readonly source: string) {
    super({ env: {} });
  }

  override dial(target: Parameters<Dialer['dial']>[0]): Promise<net.Socket> {
    const { host, port } = typeof target === 'string' ? parseAddr(target) : target;
    return new Promise((resolve, reject) => {
      const s = net.connect({ host: host === PROXY_NAME ? PROXY_IP : host, port: Number(port), localAddress: this.source, noDelay: true, allowHalfOpen: true, keepAlive: true, keepAliveInitialDelay: 30_000 });
      s.once('error', reject);
      s.once('connect', () => {
        s.off('error', reject);
        resolve(s);
      });
    });
  }
}

type ToChild =
  | { op: 'join'; addr: string; token: string; pin: string; names: string[]; sourceBase: string; concurrency: number }
  | { op: 'connect'; count: number; concurrency: number }
  | { op: 'check' };
type FromChild = { op: 'done'; ms: number; connected: number; total: number } | { op: 'error'; message: string };

/** Runs fn over items with at most `concurrency` in flight. */
async function pool<T>(items: T[], concurrency: number, fn: (item: T, worker: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, items.length) }, async (_, worker) => {
      for (let i = next++; i < items.length; i = next++) await fn(items[i]!, worker);
    }),
  );
}

/** The child's side: joins its identities, then starts their agents on request; answers each request once. */
async function idleAgentsChild(): Promise<void> {
  const identities: HostIdentity[] = [];
  const agents: TunnelAgent[] = [];
  let sourceBase = '127.1.0';
  const send = (m: FromChild) => process.send!(m);
  const status = (t0: number): FromChild => ({ op: 'done', ms: Date.now() - t0, connected: agents.filter((a) => a.getState() === 'connected').length, total: agents.length });
  const join = async (m: Extract<ToChild, { op: 'join' }>) => {
    sourceBase = m.sourceBase;
    // Joins come from their own addresses (one per worker): failed joins are limited per source.
    const joinDialers = Array.from({ length: m.concurrency }, (_, w) => new SourceDialer(`${m.sourceBase}.${200 + w}`));
    const cas = await fetchPinnedCas(m.addr, m.pin, joinDialers[0]!);
    identities.length = 0;
    await pool(m.names, m.concurrency, async (nodename, w) => {
      const keys = generateKeyPair();
      const bundle = await new ApiClient({ address: m.addr, dialer: joinDialers[w]!, ca: cas.host_ca }).call<CertBundle & { hostId: string }>('POST', '/webapi/join', {
        token: m.token,
        roles: ['app'],
        nodename,
        public_addrs: [],
        public_key: keys.publicKeyPem,
        ssh_public_key: keys.sshPublicKey,
      });
      identities.push({
        hostId: bundle.hostId,
        cluster: bundle.clusterName,
        roles: ['app'],
        nodename,
        server: m.addr,
        joinedVia: 'proxy',
        key: keys.privateKeyPem,
        cert: bundle.tlsCert,
        sshCert: bundle.sshCert,
        hostCa: bundle.hostCaPem,
        userCa: bundle.userCaPem,
        sshUserCa: bundle.sshUserCa,
        identity: identityFromCert(bundle.tlsCert),
      });
    });
  };
  const connect = async (m: Extract<ToChild, { op: 'connect' }>) => {
    const from = agents.length;
    const batch = identities.slice(from, from + m.count).map((identity, i) => {
      const source = `${sourceBase}.${1 + Math.floor((from + i) / AGENTS_PER_SOURCE)}`;
      return new TunnelAgent({
        identity,
        dialer: new SourceDialer(source),
        services: ['app'],
        resources: { databases: [], apps: [{ name: `app-${identity.nodename}`, kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] },
        connectResource: () => Promise.reject(new Error('idle agent')),
      });
    });
    agents.push(...batch);
    await pool(batch, m.concurrency, (a) => {
      const connected = new Promise<void>((r) => a.once('connected', () => r()));
      a.start();
      return withTimeout('an idle agent connecting', connected, 120_000);
    });
  };
  process.on('message', (m: ToChild) => {
    const t0 = Date.now();
    const work = m.op === 'join' ? join(m) : m.op === 'connect' ? connect(m) : Promise.resolve();
    work.then(
      () => send(status(t0)),
      (err: unknown) => send({ op: 'error', message: (err as Error).stack ?? String(err) }),
    );
  });
  process.once('disconnect', () => {
    for (const a of agents) a.stop();
    setTimeout(() => process.exit(0), 200).unref();
  });
}

/** The hard open-file limit of this process (soft can be raised to it without privileges). */
function hardOpenFileLimit(): number {
  const m = /^Max open files\s+\S+\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
  return !m || m[1] === 'unlimited' ? 1_048_576 : Number(m[1]);
}

interface AgentHolder {
  child: ChildProcess;
  ask(m: ToChild): Promise<Extract<FromChild, { op: 'done' }>>;
  stop(): Promise<void>;
}

/** A child process holding idle agents, with its open-file limit raised to the hard limit. */
function startAgentHolder(): AgentHolder {
  const argv = [process.execPath, ...process.execArgv, fileURLToPath(import.meta.url)];
  const child = spawn('sh', ['-c', `ulimit -n ${hardOpenFileLimit()} && exec "$@"`, 'sh', ...argv], {
    env: { ...process.env, BENCH_TUNNEL_CHILD: 'idle-agents' },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  let pending: { resolve: (m: Extract<FromChild, { op: 'done' }>) => void; reject: (e: Error) => void } | undefined;
  child.on('message', (m: FromChild) => {
    const p = pending;
    pending = undefined;
    if (m.op === 'done') p?.resolve(m);
    else p?.reject(new Error(`idle agents: ${m.message}`));
  });
  child.once('exit', (code) => pending?.reject(new Error(`the idle agents' process exited with ${code}`)));
  return {
    child,
    ask: (m) =>
      new Promise((resolve, reject) => {
        pending = { resolve, reject };
        child.send(m);
      }),
    stop: async () => {
      if (child.connected) child.disconnect();
      await stopChild(child);
    },
  };
}

/** What main's cleanup stops if a phase fails half-way. */
interface Tracked {
  memProxy?: RunningGateway;
  holders: AgentHolder[];
}

interface IdleMemory {
  agents: number;
  procs: number;
  joinSecs: number;
  connectSecs: number;
  /** VmRSS (KiB) of the Proxy before the first agent, then at each checkpoint (agents connected). */
  rssBefore: number;
  readings: Array<{ agents: number; rssKiB: number; gc: GcReading }>;
  /** The same before the first agent, after a full gc. */
  gcBefore: GcReading;
  allUp: boolean;
  openFiles: number;
  /** The Proxy's CPU seconds over `secs` once every agent was connected and idle (heartbeats, presence refreshes). */
  idleCpu?: { secs: number; cpuSecs: number };
  /** VmRSS (KiB) after that idle time, as it is (no gc forced): what an operator sees once the Proxy has settled. */
  idleRssKiB?: number;
  /** After that idle time, a full gc again: whether V8 gave back what the connection storm left (its memory reducer). */
  idleGc?: GcReading;
  /** bench/tlsfloor.ts: a bare Node.js TLS server's VmRSS per idle connection, measured after this phase. */
  floor?: TlsFloor;
}

/** Connections of the TLS floor (its per-connection figure does not depend on the count much; the run time does). */
const TLS_FLOOR_CONNECTIONS = 2000;

/** The idle-memory phase: a fresh Proxy daemon, AGENTS identities joined, then connected in steps. */
/**
 * A preload for the idle-memory Proxy (bench only): on SIGPWR, a full garbage collection, then the process's memory
 * figures written to BENCH_GC_OUT. The TLS floor is read after gc, so the Proxy is too; and the JS heap against
 * VmRSS tells the gateway's own objects from what its TLS connections hold natively.
 */
const GC_PRELOAD = `
const v8 = require('node:v8');
const vm = require('node:vm');
const { readFileSync, writeFileSync } = require('node:fs');
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc');
process.on('SIGPWR', () => {
  gc();
  const m = process.memoryUsage();
  const status = readFileSync('/proc/self/status', 'utf8');
  const kib = (name) => Number((new RegExp(name + ':\\\\s+(\\\\d+)').exec(status) || [0, 0])[1]);
  if (process.env.BENCH_HEAP_DIR) v8.writeHeapSnapshot(require('node:path').join(process.env.BENCH_HEAP_DIR, 'heap-' + Date.now() + '.heapsnapshot'));
  writeFileSync(process.env.BENCH_GC_OUT, JSON.stringify({ rssKiB: kib('VmRSS'), heapKiB: m.heapUsed / 1024, heapTotalKiB: m.heapTotal / 1024, externalKiB: m.external / 1024, anonKiB: kib('RssAnon'), fileKiB: kib('RssFile'), shmemKiB: kib('RssShmem') }));
});
`;

/** The Proxy's memory after a full gc (through GC_PRELOAD), KiB: VmRSS and its anonymous, file-backed and shared parts. */
interface GcReading {
  rssKiB: number;
  heapKiB: number;
  /** What V8 holds for its heap (used and free pages it keeps). */
  heapTotalKiB: number;
  externalKiB: number;
  anonKiB: number;
  fileKiB: number;
  shmemKiB: number;
}

/** The Proxy's memory after a full gc (through GC_PRELOAD). */
async function afterGc(pid: number, out: string): Promise<GcReading> {
  await rm(out, { force: true });
  process.kill(pid, 'SIGPWR');
  for (let i = 0; i < (HEAP_DIR ? 3000 : 300); i++) {
    await sleep(100);
    const text = await readFile(out, 'utf8').catch(() => '');
    if (text) return JSON.parse(text) as GcReading;
  }
  throw new Error('the Proxy did not answer the gc signal');
}

async function measureIdleMemory(dir: string, adminEnv: Record<string, string>, say: (s: string) => void, track: Tracked): Promise<IdleMemory> {
  const openFiles = hardOpenFileLimit();
  if (openFiles < AGENTS + 2000) throw new Error(`BENCH_AGENTS=${AGENTS} needs an open-file limit above ${AGENTS + 2000} (the Proxy holds one connection per agent); the hard limit here is ${openFiles}`);
  const memPort = await getPort({ host: PROXY_IP });
  const memAddr = `${PROXY_NAME}:${memPort}`;
  const memDataDir = join(dir, 'mem-data');
  // One listener holds every agent: its cap is written (an operator with this many agents does the same).
  const profDir = process.env.BENCH_IDLE_PROFILE;
  if (profDir) await writeFile(join(dir, 'profiler.cjs'), PROFILER_PRELOAD);
  await writeFile(join(dir, 'gc.cjs'), GC_PRELOAD);
  const gcOut = join(dir, 'gc.json');
  const preloads = [`--require ${join(dir, 'gc.cjs')}`, ...(profDir ? [`--require ${join(dir, 'profiler.cjs')}`] : [])].join(' ');
  const memProxy = await startGateway(proxyConfig('idle.example', memPort, AGENTS + 1000), {
    dataDir: memDataDir,
    openFiles,
    env: { NODE_OPTIONS: preloads, BENCH_GC_OUT: gcOut, ...(HEAP_DIR ? { BENCH_HEAP_DIR: HEAP_DIR } : {}), ...(profDir ? { BENCH_CPU_PROF_DIR: profDir } : {}), ...(DAEMON_GLIBC_TUNABLES ? { GLIBC_TUNABLES: DAEMON_GLIBC_TUNABLES } : {}) },
  });
  track.memProxy = memProxy;
  const memPid = memProxy.process.pid!;
  const r = await runCli('gwctl', ['--data-dir', memDataDir, 'tokens', 'add', '--type=app', '--uses=0', '--ttl=1h', '--format', 'json'], { env: adminEnv });
  if (r.status !== 0) throw new Error(`gwctl tokens add: ${r.stderr}`);
  const memToken = JSON.parse(r.stdout) as { token: string; ca_pin: string };
  for (let c = 0; c < AGENT_PROCS; c++) track.holders.push(startAgentHolder());
  const share = (c: number, n: number) => Math.floor(n / AGENT_PROCS) + (c < n % AGENT_PROCS ? 1 : 0);
  const tJoin = Date.now();
  await Promise.all(
    track.holders.map((h, c) =>
      h.ask({
        op: 'join',
        addr: memAddr,
        token: memToken.token,
        pin: memToken.ca_pin,
        names: Array.from({ length: share(c, AGENTS) }, (_, i) => `idle-${c}-${i}`),
        sourceBase: `127.${10 + c}.0`,
        concurrency: 8,
      }),
    ),
  );
  const joinSecs = (Date.now() - tJoin) / 1000;
  say(`memory: ${AGENTS} identities joined in ${joinSecs.toFixed(1)} s by ${AGENT_PROCS} processes; CPU s: Proxy ${cpuSeconds(memPid).toFixed(1)}, agents ${track.holders.map((h) => processTree(h.child.pid!).map((p) => cpuSeconds(p)).reduce((a, b) => a + b, 0).toFixed(1)).join(', ')}`);
  await sleep(2000);
  const rssBefore = await rssKiB(memPid);
  const gcBefore = await afterGc(memPid, gcOut);
  const checkpoints = [...new Set([Math.floor(AGENTS / 4), Math.floor(AGENTS / 2), AGENTS])].filter((n) => n > 0);
  const readings: IdleMemory['readings'] = [];
  let connectSecs = 0;
  let have = 0;
  let allUp = true;
  for (const target of checkpoints) {
    if (profDir && target === AGENTS) memProxy.process.kill('SIGUSR2');
    const t0 = Date.now();
    const answers = await Promise.all(track.holders.map((h, c) => h.ask({ op: 'connect', count: share(c, target) - share(c, have), concurrency: 32 })));
    connectSecs += (Date.now() - t0) / 1000;
    have = target;
    await sleep(3000);
    const rss = await rssKiB(memPid);
    readings.push({ agents: target, rssKiB: rss, gc: await afterGc(memPid, gcOut) });
    const up = answers.reduce((a, m) => a + m.connected, 0);
    allUp = up === target;
    say(`memory: ${target} agents connected (${up} up) after ${connectSecs.toFixed(1)} s: Proxy VmRSS ${(rss / 1024).toFixed(1)} MiB; CPU s: Proxy ${cpuSeconds(memPid).toFixed(1)}, agents ${track.holders.map((h) => processTree(h.child.pid!).map((p) => cpuSeconds(p)).reduce((a, b) => a + b, 0).toFixed(1)).join(', ')}`);
  }
  let idleCpu: IdleMemory['idleCpu'];
  let idleGc: GcReading | undefined;
  let idleRss: number | undefined;
  if (IDLE_CPU_SECS > 0) {
    const cpu0 = cpuSeconds(memPid);
    await sleep(IDLE_CPU_SECS * 1000);
    idleCpu = { secs: IDLE_CPU_SECS, cpuSecs: cpuSeconds(memPid) - cpu0 };
    say(`memory: Proxy CPU while ${AGENTS} agents idle: ${(idleCpu.cpuSecs * 1000 / IDLE_CPU_SECS).toFixed(1)} ms/s`);
    idleRss = await rssKiB(memPid);
    idleGc = await afterGc(memPid, gcOut);
  }
  // Still all up after the last reading?
  const last = await Promise.all(track.holders.map((h) => h.ask({ op: 'check' })));
  allUp &&= last.reduce((a, m) => a + m.connected, 0) === AGENTS;
  for (const h of track.holders.splice(0)) await h.stop();
  await stopGateway(memProxy);
  track.memProxy = undefined;
  return { agents: AGENTS, procs: AGENT_PROCS, joinSecs, connectSecs, rssBefore, gcBefore, readings, allUp, openFiles, ...(idleCpu ? { idleCpu } : {}), ...(idleRss ? { idleRssKiB: idleRss } : {}), ...(idleGc ? { idleGc } : {}) };
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
  const track: Tracked = { holders: [] };
  let sshd: Sshd | undefined;
  let ssh: SshTunnel | undefined;
  let iperf: Iperf3Server | undefined;
  let iperfSsh: Iperf3Server | undefined;
  const gwshProxies: LocalProxy[] = [];
  const servers: TestServer[] = [];
  const say = (s: string) => process.stdout.write(`[${((Date.now() - began) / 1000).toFixed(1)} s] ${s}\n`);
  if (ONLY === 'idle') {
    // The idle-memory phase alone (BENCH_TUNNEL_ONLY=idle): printed, never recorded.
    try {
      const mem = await measureIdleMemory(dir, { HOME: dir }, say, track);
      process.stdout.write(`\n${[...idleMemoryRows(mem), '', idleMemoryText(mem)].join('\n')}\n`);
    } finally {
      for (const h of track.holders) await h.stop();
      await stopGateway(track.memProxy);
      await rm(dir, { recursive: true, force: true });
    }
    return;
  }
  try {
    squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
    const sink = await startCountingSink(TARGET_IP);
    const echo = await startEchoServer(TARGET_IP);
    servers.push(sink, echo);
    // One iperf3 server per path, so that one path's test never waits for the other's to be wound up.
    iperf = await startIperf3Server();
    iperfSsh = await startIperf3Server();

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

    const agentYaml = agentConfig(sink.port, echo.port, iperf.port);
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
    // openResource hands back the TLS socket itself, or the frames over it (src/stream/framed.ts) from a Proxy that framed.
    const probeTls = (probe instanceof FramedStream ? probe.inner : probe) as TLSSocket;
    const clientTls = `${probeTls.getProtocol()} ${probeTls.getCipher().standardName}${probe instanceof FramedStream ? ', framed' : ''}`;
    probe.destroy();

    // --- OpenSSH ------------------------------------------------------------------------------------------------
    spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', join(dir, 'host_key')]);
    spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', join(dir, 'user_key')]);
    await writeFile(join(dir, 'authorized_keys'), await readFile(join(dir, 'user_key.pub')));
    sshd = await startSshd(dir);
    const fwd = { sink: await getPort({ host: SSHD_IP, exclude: [sshd.port] }), echo: 0, iperf: 0 };
    fwd.echo = await getPort({ host: SSHD_IP, exclude: [sshd.port, fwd.sink] });
    fwd.iperf = await getPort({ host: SSHD_IP, exclude: [sshd.port, fwd.sink, fwd.echo] });
    const forwards = [
      { listen: fwd.sink, to: sink.port },
      { listen: fwd.echo, to: echo.port },
      { listen: fwd.iperf, to: iperfSsh!.port },
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

    // --- the user's path: iperf3 -> gwsh proxy app -> ... against iperf3 -> ssh -R's forward ---------------------
    // gwsh signs in to the Proxy's listen address (its certificate names it), as a user on the Proxy's network would:
    // the client leg goes straight to the Proxy, as ssh -R's client leg goes straight to sshd's forward.
    const userHome = join(dir, 'gwsh-user');
    const userLogin = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${webPort}`, '--user=bench', `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: userHome }, input: `${PASSWORD}\n` });
    if (userLogin.status !== 0) throw new Error(`gwsh login: ${userLogin.stderr}`);
    const gwshIperf = await startGwshProxy(userHome, dir, 'iperf');
    const gwshEcho = await startGwshProxy(userHome, dir, 'echo');
    gwshProxies.push(gwshIperf, gwshEcho);
    const userRoutes: UserPathRoute[] = [
      {
        name: 'gateway (gwsh proxy app)',
        iperf: { host: '127.0.0.1', port: gwshIperf.port },
        echo: { host: '127.0.0.1', port: gwshEcho.port },
        cpu: {
          gwsh: () => [gwshIperf.process.pid!, gwshEcho.process.pid!],
          'Proxy daemon': () => [proxy!.process.pid!],
          squid: () => [squid!.pid],
          'agent daemon': () => [agent!.process.pid!],
          'iperf3 -s': () => [iperf!.pid],
        },
      },
      {
        name: 'OpenSSH ssh -R',
        iperf: { host: SSHD_IP, port: fwd.iperf },
        echo: { host: SSHD_IP, port: fwd.echo },
        cpu: { sshd: () => processTree(sshd!.pid), squid: () => [squid!.pid], 'ssh + socat': () => processTree(ssh!.process.pid!), 'iperf3 -s': () => [iperfSsh!.pid] },
      },
    ];
    if (GWSH_BEFORE) {
      const before = [await startGwshProxy(userHome, dir, 'iperf', {}, GWSH_BEFORE), await startGwshProxy(userHome, dir, 'echo', {}, GWSH_BEFORE)];
      gwshProxies.push(...before);
      userRoutes.push({
        ...userRoutes[0]!,
        name: 'gateway (BENCH_GWSH_BEFORE)',
        iperf: { host: '127.0.0.1', port: before[0]!.port },
        echo: { host: '127.0.0.1', port: before[1]!.port },
        cpu: { ...userRoutes[0]!.cpu, gwsh: () => before.map((g) => g.process.pid!) },
      });
    }
    const user = await measureUserPath(userRoutes, say);
    if (GWSH_BEFORE) {
      const total = (p: UserPathName) => Object.values(user.cpuPerGiB.get(p)!).reduce((a, b) => a + b, 0);
      for (const p of [GW_USER, 'gateway (BENCH_GWSH_BEFORE)'] as const) {
        say(`${p}: gwsh ${user.cpuPerGiB.get(p)!.gwsh!.toFixed(3)} CPU-s/GiB, ${user.connectCpu.get(p)!.gwsh!.toFixed(2)} CPU-ms per connection, path ${total(p).toFixed(2)}; MiB/s 1 stream ${user.rates.get(1)!.get(p)!.map((r) => (r / 8.388608).toFixed(0)).join(' ')}, ${STREAMS} streams ${user.rates.get(STREAMS)!.get(p)!.map((r) => (r / 8.388608).toFixed(0)).join(' ')}; rtt p50 ${user.rtt.get(p)!.p50.toFixed(1)} µs; connect ${median(user.connect.get(p)!).toFixed(2)} ms`);
      }
    }
    let gwshProfile: ReturnType<typeof summarizeProfile> | undefined;
    if (PROFILE) {
      // gwsh again under the sampler, for one single-stream iperf3 run (started after a warm-up run).
      await gwshIperf.stop();
      const profDir = join(dir, 'prof-gwsh');
      const preload = join(dir, 'profiler.cjs');
      await writeFile(preload, PROFILER_PRELOAD);
      const profiled = await startGwshProxy(userHome, dir, 'iperf', { NODE_OPTIONS: `--require ${preload}`, BENCH_CPU_PROF_DIR: profDir });
      gwshProxies.push(profiled);
      await runIperf3('127.0.0.1', profiled.port, 1, 1);
      profiled.process.kill('SIGUSR2');
      await runIperf3('127.0.0.1', profiled.port, 1, IPERF_SECONDS);
      profiled.process.kill('SIGUSR2');
      for (let i = 0; i < 100 && !newestProfile(profDir); i++) await sleep(50);
      const gp = newestProfile(profDir);
      const keep = process.env.BENCH_PROFILE_KEEP;
      if (gp && keep) {
        await mkdir(keep, { recursive: true });
        await copyFile(gp, join(keep, 'gwsh.cpuprofile'));
      }
      gwshProfile = gp ? summarizeProfile(gp) : undefined;
      say(`gwsh profile: ${JSON.stringify(gwshProfile, null, 1)}`);
    }
    for (const g of gwshProxies.splice(0)) await g.stop();
    if (ONLY === 'userpath') {
      process.stdout.write(`\n${[...userPathRows(user), '', userPathText(user, gwshProfile)].join('\n')}\n`);
      return;
    }

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
    const mem = await measureIdleMemory(dir, adminEnv, say, track);
    // The floor under it: a bare Node.js TLS server holding idle connections, with the agent's own host certificate.
    const hostFile = (f: string) => readFile(join(agentDataDir, 'host', f), 'utf8');
    const [hostCert, hostKey, hostCa] = await Promise.all([hostFile('cert.pem'), hostFile('key.pem'), hostFile('host-ca.pem')]);
    mem.floor = await measureTlsFloor({ serverCert: hostCert, serverKey: hostKey, ca: hostCa, clientCert: hostCert, clientKey: hostKey, connections: Math.min(AGENTS, TLS_FLOOR_CONNECTIONS) });
    say(`memory floor: a bare TLS server ${mem.floor.mtlsKiB.toFixed(1)} KiB per connection with a client certificate (${mem.floor.mtlsNoTicketKiB.toFixed(1)} without session tickets), ${mem.floor.tlsKiB.toFixed(1)} without`);

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
      ...userPathRows(user),
      ...idleMemoryRows(mem),
      ...(mem.floor
        ? [
            `| floor: a bare Node.js TLS server per idle connection with a client certificate, ${mem.floor.connections} connections (KiB of VmRSS, bench/tlsfloor.ts) | – | ${mem.floor.mtlsKiB.toFixed(1)} | – | – | – |`,
            `| floor: the same, the server sending no TLS session tickets (as the Proxy's tunnel route) (KiB of VmRSS) | – | ${mem.floor.mtlsNoTicketKiB.toFixed(1)} | – | – | – |`,
          ]
        : []),
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
        `(${tunnelProtocolText(starts)}) goes through squid to ${PROXY_NAME}, a name only squid resolves; the client opens ` +
        `gateway-tcp streams with a gwsh profile (openResource, ${clientTls}). ` +
        `Peer: ${sshVersion} \`sshd\` on ${SSHD_IP} and \`ssh -N -R\` with \`ProxyCommand=socat - PROXY:\` through the same squid ` +
        `to ${SSHD_NAME}; the client connects to the forwarded port. Both SSH connections: ${cipher}, ECDSA P-256 keys. ` +
        `Throughput: ${MIB} MiB per run (${STREAMS} streams share it in the parallel case), median of ${RUNS}, paths interleaved; ` +
        `round trip: ${RTTS} samples of ${MSG} bytes on one established stream after ${RTT_WARMUP} unmeasured ones (the steady state: with 200, V8 was still compiling the gateway's path and its p99 on the user path was 5-7 times higher); nothing pinned to a CPU` +
        `${DAEMON_NODE_OPTIONS ? `; daemons run with NODE_OPTIONS="${DAEMON_NODE_OPTIONS}"` : ''}` +
        `${DAEMON_GLIBC_TUNABLES ? `; daemons run with GLIBC_TUNABLES="${DAEMON_GLIBC_TUNABLES}"` : ''}.`,
      `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}, ${sshVersion}, ` +
        `cipher ${cipher}; load average ${load0.toFixed(2)} at the start, ${load1.toFixed(2)} after the data-path figures (other work shared the machine).`,
      '',
      ...table,
      '',
      `- Ratios: throughput above 1 and times below 1 are better for the gateway. The gateway ${lost.length === 0 ? 'beats OpenSSH on every throughput and latency figure' : `does not beat OpenSSH on: ${lost.join('; ')}`}.`,
      `- Tunnel ready: spawn -> "gateway started" ${f0(startMed.started)} ms (Node start, configuration, stored identity), -> "reverse tunnel ready" ${f0(startMed.ready)} ms, ` +
        `the Proxy logged "agent connected" at ${f0(startMed.proxy)} ms (each start: ${starts.map((s) => f0(s.readyMs)).join(', ')} ms; ssh: ${sshStarts.map(f0).join(', ')} ms).`,
      userPathText(user, gwshProfile),
      idleMemoryText(mem),
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
      v2: starts.every((s) => s.protocol === 'v2'),
    });
    const text = section.replace('WHERE_PLACEHOLDER', where);
    process.stdout.write(`\n${text}\n`);
    if (process.env.BENCH_RECORD !== '0') await recordSection('tunnel', text);
  } finally {
    for (const h of track.holders) await h.stop();
    await ssh?.stop();
    await sshd?.stop();
    for (const g of gwshProxies) await g.stop();
    await iperf?.stop();
    await iperfSsh?.stop();
    await stopGateway(agent);
    await stopGateway(proxy);
    await stopGateway(track.memProxy);
    for (const s of servers) await s.close();
    await squid?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/** Per idle agent at a checkpoint: overall (from the reading before any agent) and over its second half. */
function perAgent(mem: IdleMemory, n: number): { overall: number; secondHalf: number } | undefined {
  const at = mem.readings.find((r) => r.agents === n);
  const half = mem.readings.find((r) => r.agents === Math.floor(n / 2));
  if (!at) return undefined;
  return { overall: (at.rssKiB - mem.rssBefore) / n, secondHalf: half ? (at.rssKiB - half.rssKiB) / (n - half.agents) : NaN };
}

/**
 * The table rows: per agent at all of BENCH_AGENTS once idle (first: the README's headline takes the first "Proxy
 * memory per idle" row, the VmRSS an operator sees once the Proxy has settled, no gc forced), then right after the
 * last agent connected and at half of them, overall and over the second half.
 */
function idleMemoryRows(mem: IdleMemory): string[] {
  const per = (kib: number, before: number) => ((kib - before) / mem.agents).toFixed(1);
  const cpu = mem.idleCpu
    ? [`| Proxy CPU while ${mem.agents} agents are connected and idle, over ${mem.idleCpu.secs} s (ms of CPU per s) | – | ${((mem.idleCpu.cpuSecs * 1000) / mem.idleCpu.secs).toFixed(1)} | – | – | – |`]
    : [];
  if (mem.idleGc && mem.idleCpu) {
    cpu.push(
      `| Proxy memory per idle connected agent at ${mem.agents} agents, ${mem.idleCpu.secs} s later, after a full gc (KiB of VmRSS) | – | ${per(mem.idleGc.rssKiB, mem.gcBefore.rssKiB)} | – | – | – |`,
      `| V8's whole heap then (KiB per agent) | – | ${per(mem.idleGc.heapTotalKiB, mem.gcBefore.heapTotalKiB)} | – | – | – |`,
    );
  }
  const settled = mem.idleRssKiB && mem.idleCpu
    ? [`| Proxy memory per idle connected agent at ${mem.agents} agents, settled: ${mem.idleCpu.secs} s after the last connected (KiB of VmRSS, no gc forced) | – | ${per(mem.idleRssKiB, mem.rssBefore)} | – | – | – |`]
    : [];
  return settled.concat([mem.agents, Math.floor(mem.agents / 2)].flatMap((n) => {
    const f = perAgent(mem, n);
    if (!f || n === 0) return [];
    return [
      `| Proxy memory per idle connected agent at ${n} agents, overall (KiB of VmRSS) | – | ${f.overall.toFixed(1)} | – | – | – |`,
      `| Proxy memory per idle connected agent at ${n} agents, over the second half (KiB of VmRSS) | – | ${f.secondHalf.toFixed(1)} | – | – | – |`,
      ...gcRows(mem, n),
    ];
  })).concat(cpu);
}

/** After a full gc (as the floor is read): VmRSS and the JS heap per agent, overall. */
function gcRows(mem: IdleMemory, n: number): string[] {
  const at = mem.readings.find((r) => r.agents === n);
  if (!at) return [];
  return [
    `| Proxy memory per idle connected agent at ${n} agents, after a full gc (KiB of VmRSS) | – | ${((at.gc.rssKiB - mem.gcBefore.rssKiB) / n).toFixed(1)} | – | – | – |`,
    `| of which the JavaScript heap, after a full gc (KiB per agent) | – | ${((at.gc.heapKiB - mem.gcBefore.heapKiB) / n).toFixed(1)} | – | – | – |`,
    `| V8's whole heap (used and kept free pages), after a full gc (KiB per agent) | – | ${((at.gc.heapTotalKiB - mem.gcBefore.heapTotalKiB) / n).toFixed(1)} | – | – | – |`,
    `| of which Node's external memory (Buffers, ArrayBuffers), after a full gc (KiB per agent) | – | ${((at.gc.externalKiB - mem.gcBefore.externalKiB) / n).toFixed(1)} | – | – | – |`,
    `| of which file-backed or shared pages (SQLite's files, code), after a full gc (KiB per agent) | – | ${((at.gc.fileKiB + at.gc.shmemKiB - mem.gcBefore.fileKiB - mem.gcBefore.shmemKiB) / n).toFixed(1)} | – | – | – |`,
  ];
}

function idleMemoryText(mem: IdleMemory): string {
  const mib = (kib: number) => `${(kib / 1024).toFixed(1)} MiB`;
  const last = perAgent(mem, mem.agents);
  return (
    `- Idle memory (goal: at most 30 KiB of Proxy memory per idle agent at 10 000): a fresh Proxy daemon (auth + proxy in one process, as above; ` +
    `\`gateway.limits.max_connections\` written to ${mem.agents + 1000}, open-file limit ${mem.openFiles}) went from ${mib(mem.rssBefore)} VmRSS ` +
    mem.readings.map((r) => `to ${mib(r.rssKiB)} at ${r.agents}`).join(', ') +
    ` (after a full gc, through a bench-only preload: ${mib(mem.gcBefore.rssKiB)} with a ${mib(mem.gcBefore.heapKiB)} JS heap, then ` +
    mem.readings.map((r) => `${mib(r.gc.rssKiB)} with ${mib(r.gc.heapKiB)} at ${r.agents}`).join(', ') +
    ')' +
    ` idle agents connected${last ? ` (${last.overall.toFixed(1)} KiB per agent overall, ${last.secondHalf.toFixed(1)} over the second half)` : ''}. ` +
    `The agents are real TunnelAgent instances (each its own host identity, TLS to the Proxy with its certificate, then the tunnel's handshake and control channel, ` +
    `heartbeats while idle), so the figure includes each connection's TLS state; they run in ${mem.procs} child processes of the bench, dial the Proxy directly ` +
    `(not through squid: what is measured is the Proxy) from ${AGENTS_PER_SOURCE} agents per loopback source address. ` +
    `The ${mem.agents} identities were joined first through POST /webapi/join with one --uses=0 token (${mem.joinSecs.toFixed(1)} s, 8 joins in flight per process, ` +
    `each worker from its own source address), before the first reading; the agents connected in ${mem.connectSecs.toFixed(1)} s (32 in flight per process); ` +
    `all still connected at the last reading: ${mem.allUp ? 'yes' : 'no'}. The second-half figure leaves out what start-up and the joins left in the heap. Kernel socket buffers are not in RSS.` +
    (mem.idleCpu && mem.idleGc
      ? ` Then ${mem.idleCpu.secs} s with every agent idle: the Proxy used ${((mem.idleCpu.cpuSecs * 1000) / mem.idleCpu.secs).toFixed(1)} ms of CPU per s, ` +
        (mem.idleRssKiB ? `held ${mib(mem.idleRssKiB)} VmRSS as it was (the settled figure, the table's first row), ` : '') +
        `and after a full gc ` +
        `held ${mib(mem.idleGc.rssKiB)} VmRSS with a ${mib(mem.idleGc.heapTotalKiB)} V8 heap (${mib(mem.idleGc.heapKiB)} used): V8's memory reducer returns the free pages the connection storm left once the process is idle.`
      : '') +
    (mem.floor
      ? ` The floor (bench/tlsfloor.ts, same run, the agent's host certificate on both ends): a bare Node.js TLS server holds ${mem.floor.mtlsKiB.toFixed(1)} KiB per idle connection ` +
        `with a client certificate, ${mem.floor.mtlsNoTicketKiB.toFixed(1)} KiB with one and no session tickets sent, and ${mem.floor.tlsKiB.toFixed(1)} KiB without (${mem.floor.connections} connections, VmRSS after gc).`
      : '')
  );
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
  /** The tunnel protocol negotiated: v2 (frames over TLS) or v1 (SSH over TLS). */
  v2: boolean;
}): string {
  const total = (r: Record<string, number>) => Object.values(r).reduce((a, b) => a + b, 0);
  const pct = (n: number) => `${(n * 100).toFixed(0)}%`;
  const x = (n: number) => `${n.toFixed(2)}x`;
  const cpuRatio = total(d.G) / total(d.O);
  const gatewayCipher = 4 * d.aes[256] + (d.v2 ? 0 : 2 * d.aes[128]);
  const opensshCipher = 2 * d.aes[128];
  const cipherShare = (gatewayCipher - opensshCipher) / Math.max(1e-9, total(d.G) - total(d.O));
  const latency =
    d.p50 <= 1
      ? `The median round trip is at or below OpenSSH's (${x(d.p50)}): a 64-byte message costs little CPU, and both paths cross a similar chain of processes each way (Proxy, squid, agent against sshd, squid, socat, ssh)`
      : d.p50 < 1.25
        ? `The median round trip is close to OpenSSH's (${x(d.p50)}): a 64-byte message costs little CPU, and both paths cross a similar chain of processes each way (Proxy, squid, agent against sshd, squid, socat, ssh); the extra is the gateway's per-message work (${d.v2 ? 'two TLS records and a frame header in the Proxy, a TLS record in the agent' : 'two TLS records and an SSH packet in the Proxy, the same again in the agent'})`
        : `The median round trip is ${x(d.p50)} OpenSSH's: each message is a TLS record from the client, ${d.v2 ? 'a frame' : 'an SSH packet'} inside a TLS record to the agent and the same back, each step a JavaScript callback chain in the Proxy and the agent`;
  const tail = `; p99 (${x(d.p99)}) is mostly scheduling: the path's processes share two cores with each other${d.p99 > 1.5 || d.p99 < 0.67 ? ' and with whatever else runs, so it swings from run to run' : ''}.`;
  const parts = [
    `${d.lost.length === 0 ? 'the gateway is ahead on every data-path figure, though ' : ''}per GiB moved the gateway's path uses ${total(d.G).toFixed(2)} CPU-s against OpenSSH's ${total(d.O).toFixed(2)} ` +
      `(${cpuRatio.toFixed(2)}x): the Proxy daemon ${(d.G['Proxy daemon'] ?? 0).toFixed(2)} s and the agent ${(d.G['agent daemon'] ?? 0).toFixed(2)} s, ` +
      `where sshd uses ${(d.O.sshd ?? 0).toFixed(2)} s and ssh + socat ${(d.O['ssh + socat'] ?? 0).toFixed(2)} s. With every process of the path on two cores, ` +
      `a stream goes as fast as the CPU left to its hops allows: one stream reached ${x(d.single)} OpenSSH's rate, ${STREAMS} streams ${x(d.multi)}. ` +
      `Parallel streams add no thread to either tunnel: all of them share one tunnel connection, so one JavaScript thread in the Proxy and one in the agent (one sshd session process and one ssh) carry them all.`,
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
        `In the agent ${pct(a.splicedWrites)} of that write time is the plain write() of each ${d.v2 ? 'frame' : 'packet'}'s bytes to the resource; in the Proxy ${pct(1 - p.splicedWrites)} is the tunnel's TLS socket (${d.v2 ? 'frames, corked for the rest of the tick and flushed with writev' : 'SSH packets, written at once or queued and flushed with writev'}). ` +
        `The ciphers are ${cipherShare < 0.4 ? 'a small' : cipherShare < 0.7 ? 'a large' : 'most of the'} part of the difference: at the AES-GCM speed \`openssl speed\` measures on this machine (${(1 / d.aes[256]).toFixed(1)} GiB/s per core for AES-256, ${(1 / d.aes[128]).toFixed(1)} for AES-128), ` +
        `the gateway's ${d.v2 ? 'four' : 'six'} passes over each byte (encrypt and decrypt of the client's TLS${d.v2 ? '' : ', of SSH'} and of the tunnel's TLS) cost ${gatewayCipher.toFixed(2)} CPU-s per GiB and OpenSSH's two ${opensshCipher.toFixed(2)}, ` +
        `${(gatewayCipher - opensshCipher).toFixed(2)} of the ${(total(d.G) - total(d.O)).toFixed(2)} CPU-s difference. The rest is per chunk: ` +
        (d.v2
          ? 'the client\'s TLS socket delivers 16 KiB records (Node\'s TLS hands JavaScript at most 16 KiB per read), each becomes one frame (a 9-byte header and the bytes as they came) in a TLS record to the agent, ' +
            'and the agent makes one write() to the resource per frame, while sshd and ssh move up to 32 KiB packets through buffered C code. '
          : 'the client\'s TLS socket delivers 16 KiB records, each becomes one 16 KiB SSH packet (a fresh Buffer, random padding, a cipher call, a TLS record and a write in the Proxy), ' +
            'and the agent decrypts it and makes one write() to the resource per packet, while sshd and ssh move up to 32 KiB packets through buffered C code. ') +
        'ssh -R\'s client leg is plain TCP, and its tunnel is SSH alone, with no TLS around it: the gateway\'s client leg is TLS because the user\'s certificate is checked there.',
    );
  }
  return parts.join(' ');
}

if (process.env.BENCH_TUNNEL_CHILD === 'idle-agents') await idleAgentsChild();
else await main();
