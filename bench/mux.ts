/**
 * bench:mux — the cost of the Proxy's single-port router (src/mux/multiplexer.ts), against two baselines
 * measured in the same run. Every path carries the same TLS stream, ended by the same backend:
 *
 *   direct       client TLS (ALPN gateway-tcp) -> backend
 *   multiplexer  client TLS -> a net.Server running `Multiplexer` whose gateway-tcp route passes the bytes
 *                through (net.connect + src/mux/pump.ts, no termination) -> backend. What is measured is the router
 *                alone: sniff + ClientHello parse + route + byte pump. The router process loads the multiplexer from
 *                dist/ (what `gateway start` runs, built by `npm run bench:mux`), not through tsx: tsx wraps every
 *                closure in a __name() call that gives it a property of its own, which cost the router about a
 *                quarter of its heap per connection and some of its CPU.
 *   HAProxy      client TLS -> haproxy (Debian package, TCP mode, `req_ssl_hello_type` + `req_ssl_sni` +
 *                `req.ssl_alpn` routing, passthrough) -> backend. The peer.
 *
 * Both routers do the same decisions per connection: SNI prefix kube-gateway-proxy-alpn. (never taken), SNI
 * idle.gw.test (the idle backend of the memory test), ALPN gateway-tcp. The backend is a Node TLS server on
 * 127.0.0.3 (test CA, ECDSA P-256, ALPN gateway-tcp): SNI sink.gw.test counts bytes, any other name echoes.
 *
 * Processes: the client and the backend share this process; each router runs in its own process (the multiplexer in
 * a child Node process started from this file with "router", haproxy with nbthread 1: one event loop each), so its
 * CPU time can be read from /proc/<pid>/stat on its own. All of them are pinned to one CPU by default (BENCH_CPU,
 * BENCH_ROUTER_CPU, "any" to leave a side unpinned): every figure then includes the router's CPU cost, and round
 * trips do not depend on whether the scheduler put the router on the other vCPU (waking an idle vCPU costs tens of
 * µs on a VM and made unpinned round trips bimodal).
 *
 * Figures per path (the paths take turns run by run, sample by sample or batch by batch, so that load from elsewhere
 * on the machine hits all three alike):
 *   throughput       one TLS stream, BENCH_MIB MiB pushed to the sink until the sink has them all (plaintext
 *                    MiB/s), median of BENCH_RUNS runs
 *   round trip       64 bytes written and echoed back over one established connection, BENCH_RTTS samples
 *   connect          TCP + TLS handshake until one byte has been echoed back, sequential, BENCH_CONNECTS samples
 *   connections/s    BENCH_CONNS connections of connect + handshake + 1-byte echo + close, BENCH_CONCURRENCY in
 *                    flight. Connect and connections/s come after BENCH_WARM connections through each path, so that
 *                    they measure a Proxy that has run for a while: before that, V8 is still compiling the
 *                    connection path on background threads, which share the router's CPU
 *   router CPU       user+system CPU of the router process during the throughput and connections/s phases
 *   idle memory      RSS growth of a fresh router process per idle connection, BENCH_IDLE connections that sent
 *                    half a ClientHello (waiting in detection), then, in another fresh process, connections
 *                    routed to an idle backend. The multiplexer's RSS is read after global.gc(). Kernel socket
 *                    buffers are not in any RSS.
 *
 * Settings (environment): BENCH_MIB (512), BENCH_RUNS (3), BENCH_RTTS (5000), BENCH_CONNECTS (500), BENCH_CONNS (2000),
 * BENCH_CONCURRENCY (8), BENCH_IDLE (5000), BENCH_WARM (2000), BENCH_CPU (0), BENCH_ROUTER_CPU (= BENCH_CPU), BENCH_HAPROXY_THREADS (1),
 * BENCH_HAPROXY (/usr/sbin/haproxy), BENCH_ROUTER_NODE_ARGS (extra node flags for the multiplexer's process, e.g.
 * "--cpu-prof --cpu-prof-dir=/tmp/prof" to see where its time goes).
 *
 * Writes the figures, ratios and the machine to bench/RESULTS.md (section "mux").
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import { createLogger } from '../src/log.js';
import { parseClientHello } from '../src/mux/clienthello.js';
import type { Multiplexer as MultiplexerClass, RouteHandler } from '../src/mux/multiplexer.js';
import type { passThrough as PassThrough } from '../src/mux/pump.js';
import { sniffProtocol } from '../src/mux/sniff.js';
import { startSilentServer, type SilentServer } from '../test/helpers/servers.js';
import { makeTestPki } from '../test/helpers/tls.js';
import { recordSection } from './record.js';
import { envNumber } from './common.js';


const MIB = envNumber('BENCH_MIB', 512);
const RUNS = envNumber('BENCH_RUNS', 3);
const RTTS = envNumber('BENCH_RTTS', 5000);
const CONNECTS = envNumber('BENCH_CONNECTS', 500);
const CONNS = envNumber('BENCH_CONNS', 2000);
const CONCURRENCY = envNumber('BENCH_CONCURRENCY', 8);
const IDLE = envNumber('BENCH_IDLE', 5000);
const WARM_CONNS = envNumber('BENCH_WARM', 2000, 0);
const HAPROXY_THREADS = envNumber('BENCH_HAPROXY_THREADS', 1);
const HAPROXY = process.env.BENCH_HAPROXY || '/usr/sbin/haproxy';
/** CPU list (taskset -c) for this process (client and backend), or "any". */
const CPU = process.env.BENCH_CPU || '0';
/** CPU list for the routers (multiplexer process, haproxy); by default the same CPU as the client and backend. */
const ROUTER_CPU = process.env.BENCH_ROUTER_CPU || CPU;
/** Extra node flags for the multiplexer's process, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof". */
const ROUTER_NODE_ARGS = (process.env.BENCH_ROUTER_NODE_ARGS ?? '').split(' ').filter(Boolean);

const BACKEND_IP = '127.0.0.3';
const ROUTER_IP = '127.0.0.1';
const ALPN = 'gateway-tcp';
const NAMES = { echo: 'echo.gw.test', sink: 'sink.gw.test', idle: 'idle.gw.test' } as const;
/** Detection deadline of both routers while measuring speed (haproxy: tcp-request inspect-delay). */
const DETECT_MS = 5_000;
/** ... and while idle connections are held for the memory figures (they must outlive the measurement). */
const IDLE_DETECT_MS = 120_000;
const RTT_BYTES = 64;
/** Idle connections being opened at once (the memory figures). */
const OPEN_CONCURRENCY = 64;

// ---------------------------------------------------------------------------------------------------------------
// The multiplexer's process (this file, started with "router"): a net.Server running only the Multiplexer.
// ---------------------------------------------------------------------------------------------------------------

type RouterRequest = { id: number; cmd: 'stats' | 'mem' };
type RouterReply =
  | { type: 'ready'; port: number }
  | { id: number; detecting: number; routed: number; open: number }
  | { id: number; rss: number; heapUsed: number; external: number };

function readRssOf(pid: number | 'self'): Promise<number> {
  return readFile(`/proc/${pid}/status`, 'utf8').then((text) => {
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(text);
    if (!m) throw new Error(`no VmRSS in /proc/${pid}/status`);
    return Number(m[1]) * 1024;
  });
}

async function routerMain(args: string[]): Promise<void> {
  const [tlsPort, idlePort, detectMs] = args.map(Number) as [number, number, number];
  // The shipped build (see the top of this file); a path in a variable, so that tsc does not resolve it.
  const dist = new URL('../dist/mux/', import.meta.url).href;
  const { Multiplexer } = (await import(`${dist}multiplexer.js`)) as { Multiplexer: typeof MultiplexerClass };
  const { passThrough } = (await import(`${dist}pump.js`)) as { passThrough: typeof PassThrough };
  let open = 0; // routed connections not closed yet
  const closed = () => void open--;
  const passthrough: RouteHandler = (stream, info) => {
    const upstream = net.connect({ host: BACKEND_IP, port: info.serverName === NAMES.idle ? idlePort : tlsPort, noDelay: true });
    open++;
    passThrough(stream, upstream, closed);
  };
  const mux = new Multiplexer({
    routes: [
      { name: ALPN, match: { alpn: [{ protocol: ALPN }] }, handler: passthrough },
      { name: 'web', match: { alpn: [{ protocol: 'http/1.1' }, { protocol: 'h2' }], noAlpn: true }, handler: (stream) => stream.destroy() },
    ],
    proxyProtocol: false,
    detectTimeoutMs: detectMs,
    log: createLogger({ level: 'warn' }),
  });
  const server = net.createServer({ noDelay: true }, mux.handleSocket);
  await new Promise<void>((resolve) => server.listen({ host: ROUTER_IP, port: 0, backlog: 4096 }, resolve));
  process.once('SIGTERM', () => process.exit(0)); // a clean exit, so that --cpu-prof and the like can write
  const gc = (globalThis as { gc?: () => void }).gc;
  process.on('message', (msg: RouterRequest) => {
    if (msg.cmd === 'stats') {
      const s = mux.getStats();
      process.send!({ id: msg.id, detecting: s.detecting, routed: s.routed[ALPN] ?? 0, open } satisfies RouterReply);
      return;
    }
    gc?.();
    gc?.();
    const m = process.memoryUsage();
    void readRssOf('self').then((rss) => process.send!({ id: msg.id, rss, heapUsed: m.heapUsed, external: m.external } satisfies RouterReply));
  });
  process.send!({ type: 'ready', port: (server.address() as net.AddressInfo).port } satisfies RouterReply);
}

// ---------------------------------------------------------------------------------------------------------------
// The bench process: client, backend, and the routers' keepers.
// ---------------------------------------------------------------------------------------------------------------

interface Path {
  name: string;
  host: string;
  port: number;
  /** The router's process, for its CPU time; none for direct. */
  pid?: number;
}

interface RouterProc {
  pid: number;
  port: number;
  stats(): Promise<{ detecting: number; routed: number; open: number }>;
  mem(): Promise<{ rss: number; heapUsed: number; external: number }>;
  stop(): Promise<void>;
}

interface HaproxyProc {
  pid: number;
  port: number;
  currConns(): Promise<number>;
  stop(): Promise<void>;
}

const CLK_TCK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

interface Cpu {
  user: number;
  system: number;
}

/** User and system CPU seconds of a process (all its threads). */
async function cpuOf(pid: number): Promise<Cpu> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: Number(fields[11]) / CLK_TCK, system: Number(fields[12]) / CLK_TCK };
}

function cpuSince(pid: number | undefined, before: Cpu | undefined): Promise<Cpu | undefined> {
  if (pid === undefined || before === undefined) return Promise.resolve(undefined);
  return cpuOf(pid).then((now) => ({ user: now.user - before.user, system: now.system - before.system }));
}

/** `taskset -c <list>` arguments for a CPU setting ("any": every CPU, since children inherit our affinity). */
function cpuList(setting: string): string {
  return setting === 'any' ? `0-${cpus().length - 1}` : setting;
}

function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

async function stopChild(child: ChildProcess): Promise<void> {
  const done = exited(child);
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
  await done;
  clearTimeout(timer);
}

async function startRouter(tlsPort: number, idlePort: number, detectMs: number): Promise<RouterProc> {
  // Through taskset (which execs node, so the pid stays); the IPC channel survives the exec.
  const nodeArgs = [...process.execArgv, '--expose-gc', ...ROUTER_NODE_ARGS];
  const child = spawn('taskset', ['-c', cpuList(ROUTER_CPU), process.execPath, ...nodeArgs, fileURLToPath(import.meta.url), 'router', String(tlsPort), String(idlePort), String(detectMs)], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const pending = new Map<number, { resolve: (reply: RouterReply) => void; reject: (err: Error) => void }>();
  let nextId = 1;
  child.once('exit', (code, signal) => {
    for (const p of pending.values()) p.reject(new Error(`the multiplexer process exited (${code ?? signal})`));
    pending.clear();
  });
  const port = await new Promise<number>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`the multiplexer process exited (${code}) before listening`)));
    child.on('message', (msg: RouterReply) => {
      if ('type' in msg) return resolve(msg.port);
      pending.get(msg.id)?.resolve(msg);
      pending.delete(msg.id);
    });
  });
  const request = (cmd: RouterRequest['cmd']) =>
    new Promise<RouterReply>((resolve, reject) => {
      if (child.exitCode !== null || child.signalCode !== null) return reject(new Error('the multiplexer process has exited'));
      const id = nextId++;
      pending.set(id, { resolve, reject });
      child.send({ id, cmd } satisfies RouterRequest);
    });
  return {
    pid: child.pid!,
    port,
    stats: async () => (await request('stats')) as { detecting: number; routed: number; open: number },
    mem: async () => (await request('mem')) as { rss: number; heapUsed: number; external: number },
    stop: () => stopChild(child),
  };
}

async function startHaproxy(dir: string, tag: string, tlsPort: number, idlePort: number, detectMs: number): Promise<HaproxyProc> {
  const port = await getPort({ host: ROUTER_IP });
  const sock = join(dir, `${tag}.sock`);
  const cfg = join(dir, `${tag}.cfg`);
  // Each connection holds two descriptors; haproxy refuses to start when maxconn needs more than the hard limit.
  const maxconn = IDLE + 1000;
  await writeFile(
    cfg,
    [
      'global',
      `  maxconn ${maxconn}`,
      `  nbthread ${HAPROXY_THREADS}`,
      `  stats socket ${sock} mode 600 level user`,
      'defaults',
      '  mode tcp',
      `  maxconn ${maxconn}`,
      '  timeout connect 5s',
      '  timeout client 300s',
      '  timeout server 300s',
      'frontend fe_mux',
      `  bind ${ROUTER_IP}:${port} backlog 4096`,
      `  tcp-request inspect-delay ${detectMs}ms`,
      '  tcp-request content accept if { req_ssl_hello_type 1 }',
      '  use_backend be_kube if { req_ssl_sni -m beg kube-gateway-proxy-alpn. }',
      `  use_backend be_idle if { req_ssl_sni -i ${NAMES.idle} }`,
      `  use_backend be_tcp if { req.ssl_alpn ${ALPN} }`,
      'backend be_tcp',
      `  server backend ${BACKEND_IP}:${tlsPort}`,
      'backend be_idle',
      `  server idle ${BACKEND_IP}:${idlePort}`,
      'backend be_kube',
      `  server kube ${BACKEND_IP}:${tlsPort}`,
      '',
    ].join('\n'),
  );
  const child = spawn('taskset', ['-c', cpuList(ROUTER_CPU), HAPROXY, '-f', cfg, '-db'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const failed = new Promise<never>((_, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`haproxy exited (${code}) before listening: ${stderr.trim()}`)));
  });
  const command = (cmd: string) =>
    new Promise<string>((resolve, reject) => {
      const s = net.connect(sock);
      let out = '';
      s.on('data', (d: Buffer) => (out += d.toString()));
      s.once('end', () => resolve(out));
      s.once('error', reject);
      s.end(`${cmd}\n`);
    });
  const ready = (async () => {
    for (let i = 0; ; i++) {
      try {
        await command('show info');
        return;
      } catch (err) {
        if (i > 200) throw err;
        await sleep(25);
      }
    }
  })();
  failed.catch(() => undefined);
  try {
    await Promise.race([ready, failed]);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return {
    pid: child.pid!,
    port,
    currConns: async () => Number(/^CurrConns: (\d+)$/m.exec(await command('show info'))?.[1] ?? NaN),
    stop: () => stopChild(child),
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

function withTimeout<T>(what: string, p: Promise<T>, ms = 120_000): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms))),
  ]);
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

const now = () => Number(process.hrtime.bigint()) / 1e6; // ms

async function main(): Promise<void> {
  const started = now();
  const loadBefore = loadavg()[0]!;
  if (CPU !== 'any') {
    const pinned = spawnSync('taskset', ['-a', '-p', '-c', CPU, String(process.pid)], { encoding: 'utf8' });
    if (pinned.status !== 0) throw new Error(`taskset -a -p -c ${CPU} failed: ${pinned.stderr.trim()}`);
  }
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-mux-'));
  const pki = await makeTestPki(dir);
  const cert = await pki.serverCert({ names: Object.values(NAMES), ips: [BACKEND_IP] });
  const cleanups: Array<() => Promise<void> | void> = [() => rm(dir, { recursive: true, force: true })];

  // --- backend: TLS echo (any name) and sink (sink.gw.test) ---------------------------------------------------
  let sinkWaiter: { expected: number; resolve: (t: number) => void } | undefined;
  const backendSockets = new Set<net.Socket>();
  const backend = tls.createServer({ key: cert.keyPem, cert: cert.certPem, ALPNProtocols: [ALPN], noDelay: true }, (s) => {
    s.on('error', () => undefined);
    if (s.servername === NAMES.sink) {
      let got = 0;
      s.on('data', (c: Buffer) => {
        got += c.length;
        if (sinkWaiter && got >= sinkWaiter.expected) {
          const w = sinkWaiter;
          sinkWaiter = undefined;
          w.resolve(now());
        }
      });
    } else {
      s.on('data', (c: Buffer) => s.write(c));
    }
  });
  backend.on('connection', (s: net.Socket) => {
    backendSockets.add(s);
    s.once('close', () => backendSockets.delete(s));
  });
  backend.on('tlsClientError', () => undefined);
  await new Promise<void>((r) => backend.listen({ host: BACKEND_IP, port: 0, backlog: 4096 }, r));
  const tlsPort = (backend.address() as net.AddressInfo).port;
  cleanups.push(() => {
    for (const s of backendSockets) s.destroy();
    backend.close();
  });
  const idle: SilentServer = await startSilentServer(BACKEND_IP);
  cleanups.push(() => idle.close());

  try {
    const haproxyVersion = spawnSync(HAPROXY, ['-v'], { encoding: 'utf8' }).stdout.split('\n')[0]?.replace(/ - https?:\S+/, '').trim();
    if (!haproxyVersion) throw new Error(`${HAPROXY} -v gave nothing: is haproxy installed?`);

    // --- the three paths ------------------------------------------------------------------------------------
    const router = await startRouter(tlsPort, idle.port, DETECT_MS);
    cleanups.push(() => router.stop());
    const haproxy = await startHaproxy(dir, 'speed', tlsPort, idle.port, DETECT_MS);
    cleanups.push(() => haproxy.stop());
    const paths: Path[] = [
      { name: 'direct', host: BACKEND_IP, port: tlsPort },
      { name: 'multiplexer', host: ROUTER_IP, port: router.port, pid: router.pid },
      { name: 'HAProxy', host: ROUTER_IP, port: haproxy.port, pid: haproxy.pid },
    ];

    let negotiated: string | undefined;
    const connect = (path: Path, servername: string) =>
      new Promise<tls.TLSSocket>((resolve, reject) => {
        const s = tls.connect({ socket: net.connect({ host: path.host, port: path.port, noDelay: true }), servername, ALPNProtocols: [ALPN], ca: pki.caPem }, () => {
          s.off('error', reject);
          s.on('error', () => undefined);
          if (s.alpnProtocol !== ALPN) {
            s.destroy();
            return reject(new Error(`${path.name}: ALPN ${String(s.alpnProtocol)} negotiated, not ${ALPN}`));
          }
          negotiated ??= `${s.getProtocol() ?? '?'} ${s.getCipher().name}`;
          resolve(s);
        });
        s.once('error', reject);
      });
    const echoOne = (s: tls.TLSSocket) =>
      new Promise<void>((resolve, reject) => {
        s.once('data', () => resolve());
        s.once('close', () => reject(new Error('closed before the echo')));
        s.write('x');
      });
    const connectEchoClose = async (path: Path) => {
      const s = await connect(path, NAMES.echo);
      await echoOne(s);
      s.destroy();
    };

    const throughputRun = async (path: Path, mib = MIB): Promise<number> => {
      const bytes = mib * 2 ** 20;
      const s = await connect(path, NAMES.sink);
      const arrived = new Promise<number>((resolve) => (sinkWaiter = { expected: bytes, resolve }));
      const chunk = Buffer.alloc(256 * 1024, 0x5a);
      const t0 = now();
      let sent = 0;
      await new Promise<void>((resolve) => {
        const pump = () => {
          while (sent < bytes) {
            const n = Math.min(chunk.length, bytes - sent);
            sent += n;
            if (!s.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return void s.once('drain', pump);
          }
          resolve();
        };
        pump();
      });
      const t1 = await withTimeout(`${path.name} throughput`, arrived);
      s.destroy();
      return bytes / 2 ** 20 / ((t1 - t0) / 1000);
    };

    /** An established echo connection on which one 64-byte round trip can be timed at a time. */
    const echoChannel = async (path: Path) => {
      const s = await connect(path, NAMES.echo);
      const msg = Buffer.alloc(RTT_BYTES, 0x61);
      let got = 0;
      let waiting: (() => void) | undefined;
      s.on('data', (d: Buffer) => {
        got += d.length;
        if (got >= RTT_BYTES && waiting) {
          got -= RTT_BYTES;
          const w = waiting;
          waiting = undefined;
          w();
        }
      });
      return {
        /** One round trip, in µs. */
        once: async () => {
          const t0 = now();
          await new Promise<void>((resolve) => {
            waiting = resolve;
            s.write(msg);
          });
          return (now() - t0) * 1000;
        },
        close: () => s.destroy(),
      };
    };

    /** CONNS / rounds connections with CONCURRENCY in flight: wall time and the router's CPU. */
    const connectionBatch = async (path: Path, count: number): Promise<{ ms: number; cpu?: Cpu }> => {
      const cpu0 = path.pid ? await cpuOf(path.pid) : undefined;
      let next = 0;
      const t0 = now();
      await withTimeout(
        `${path.name} connections/s`,
        Promise.all(
          Array.from({ length: CONCURRENCY }, async () => {
            while (next++ < count) await connectEchoClose(path);
          }),
        ),
      );
      const ms = now() - t0;
      const cpu = await cpuSince(path.pid, cpu0);
      return { ms, ...(cpu ? { cpu } : {}) };
    };

    interface Speed {
      tput: number;
      /** ms per GiB */
      tputCpuPerGiB?: Cpu;
      rtt: { p50: number; p99: number };
      conn: { p50: number; p99: number };
      cps: number;
      /** µs per connection */
      cpuPerConn?: Cpu;
    }
    const speed = new Map<string, Partial<Speed>>(paths.map((p) => [p.name, {}]));

    // Throughput: the paths take turns run by run.
    const rates = new Map<string, number[]>(paths.map((p) => [p.name, []]));
    const tputCpu = new Map<string, Cpu>(paths.map((p) => [p.name, { user: 0, system: 0 }]));
    for (const p of paths) await throughputRun(p, Math.min(MIB, 64)); // warm-up (and a check of every path)
    for (let run = 0; run < RUNS; run++) {
      for (const p of paths) {
        const cpu0 = p.pid ? await cpuOf(p.pid) : undefined;
        rates.get(p.name)!.push(await throughputRun(p));
        const used = await cpuSince(p.pid, cpu0);
        const sum = tputCpu.get(p.name)!;
        if (used) tputCpu.set(p.name, { user: sum.user + used.user, system: sum.system + used.system });
      }
    }
    for (const p of paths) {
      const s = speed.get(p.name)!;
      s.tput = median(rates.get(p.name)!);
      const gib = (RUNS * MIB) / 1024;
      const c = tputCpu.get(p.name)!;
      if (p.pid) s.tputCpuPerGiB = { user: (c.user / gib) * 1000, system: (c.system / gib) * 1000 };
      process.stderr.write(`throughput ${p.name}: ${rates.get(p.name)!.map((r) => r.toFixed(0)).join(', ')} MiB/s\n`);
    }
    // Round trips, connects and connections/s: the paths take turns sample by sample (batch by batch), so that load
    // from elsewhere on the machine hits all three alike.
    const channels = await Promise.all(paths.map((p) => echoChannel(p)));
    const rtt = paths.map((): number[] => []);
    for (let i = 0; i < 500 + RTTS; i++) {
      for (const [k, ch] of channels.entries()) {
        const us = await ch.once();
        if (i >= 500) rtt[k]!.push(us);
      }
    }
    for (const ch of channels) ch.close();
    // Warm the connection path up (see the top of this file), the paths taking turns batch by batch.
    for (let round = 0; round < 4 && WARM_CONNS > 0; round++) for (const p of paths) await connectionBatch(p, Math.ceil(WARM_CONNS / 4));
    const conn = paths.map((): number[] => []);
    for (let i = 0; i < 30 + CONNECTS; i++) {
      for (const [k, p] of paths.entries()) {
        const t0 = now();
        await connectEchoClose(p);
        if (i >= 30) conn[k]!.push(now() - t0);
      }
    }
    const ROUNDS = 4;
    const batches = paths.map(() => ({ ms: 0, cpu: { user: 0, system: 0 } as Cpu }));
    for (let round = 0; round < ROUNDS; round++) {
      const count = Math.floor(CONNS / ROUNDS) + (round < CONNS % ROUNDS ? 1 : 0);
      for (const [k, p] of paths.entries()) {
        const r = await connectionBatch(p, count);
        const b = batches[k]!;
        b.ms += r.ms;
        if (r.cpu) b.cpu = { user: b.cpu.user + r.cpu.user, system: b.cpu.system + r.cpu.system };
      }
    }
    for (const [k, p] of paths.entries()) {
      const s = speed.get(p.name)!;
      const t = rtt[k]!.sort((a, b) => a - b);
      const c = conn[k]!.sort((a, b) => a - b);
      const b = batches[k]!;
      s.rtt = { p50: percentile(t, 50), p99: percentile(t, 99) };
      s.conn = { p50: percentile(c, 50), p99: percentile(c, 99) };
      s.cps = CONNS / (b.ms / 1000);
      if (p.pid) s.cpuPerConn = { user: (b.cpu.user / CONNS) * 1e6, system: (b.cpu.system / CONNS) * 1e6 };
      process.stderr.write(
        `${p.name}: round trip p50 ${s.rtt.p50.toFixed(1)} µs, p99 ${s.rtt.p99.toFixed(1)} µs; connect p50 ${s.conn.p50.toFixed(3)} ms, ` +
          `p99 ${s.conn.p99.toFixed(3)} ms; ${s.cps.toFixed(0)} connections/s` +
          (p.pid ? `, router CPU ${b.cpu.user.toFixed(2)} s user + ${b.cpu.system.toFixed(2)} s system\n` : '\n'),
      );
    }
    await router.stop();
    await haproxy.stop();

    // --- memory per idle connection, each case in a fresh router process --------------------------------------
    const hello = await captureClientHello(pki.caPem);
    const partial = hello.subarray(0, Math.floor(hello.length / 2));
    if (sniffProtocol(partial).kind !== 'tls' || parseClientHello(partial).kind !== 'need-more') throw new Error('half a ClientHello is not a TLS prefix');
    const openIdle = async (port: number, bytes: Buffer, n: number): Promise<net.Socket[]> => {
      const sockets: net.Socket[] = [];
      let next = 0;
      await Promise.all(
        Array.from({ length: OPEN_CONCURRENCY }, async () => {
          while (next++ < n) {
            const s = await new Promise<net.Socket>((resolve, reject) => {
              const c = net.connect({ host: ROUTER_IP, port }, () => {
                c.off('error', reject);
                resolve(c);
              });
              c.once('error', reject);
            });
            s.on('error', () => undefined);
            s.resume();
            s.write(bytes);
            sockets.push(s);
          }
        }),
      );
      return sockets;
    };
    const closeAll = (sockets: net.Socket[]) => {
      for (const s of sockets) s.destroy();
    };
    const WARM = Math.min(200, IDLE);
    type Case = 'detecting' | 'routed';
    const memMux = async (c: Case): Promise<number> => {
      const r = await startRouter(tlsPort, idle.port, IDLE_DETECT_MS);
      try {
        const bytes = c === 'detecting' ? partial : hello;
        /** n connections held: in detection, or routed with their upstream connection accepted by the idle backend. */
        const holding = async (n: number, idleBase: number) => {
          const s = await r.stats();
          return c === 'detecting' ? s.detecting === n : s.detecting === 0 && s.open === n && idle.connections - idleBase === n;
        };
        // Warm the process up (JIT, pools) with a few connections of the same kind, then take the baseline.
        const warmBase = idle.connections;
        const warm = await openIdle(r.port, bytes, WARM);
        await waitFor('warm-up connections in the multiplexer', () => holding(WARM, warmBase));
        closeAll(warm);
        await waitFor('warm-up connections closed', async () => {
          const s = await r.stats();
          return s.detecting === 0 && s.open === 0;
        });
        await sleep(300);
        const before = await r.mem();
        const idleBase = idle.connections;
        const sockets = await openIdle(r.port, bytes, IDLE);
        await waitFor(`${IDLE} connections ${c} in the multiplexer`, () => holding(IDLE, idleBase));
        await sleep(300);
        const after = await r.mem();
        closeAll(sockets);
        process.stderr.write(
          `memory multiplexer ${c}: RSS ${((after.rss - before.rss) / IDLE).toFixed(0)} B/conn, heap ${((after.heapUsed - before.heapUsed) / IDLE).toFixed(0)} B/conn, external ${((after.external - before.external) / IDLE).toFixed(0)} B/conn\n`,
        );
        return (after.rss - before.rss) / IDLE;
      } finally {
        await r.stop();
      }
    };
    const memHaproxy = async (c: Case): Promise<number> => {
      const h = await startHaproxy(dir, `mem-${c}`, tlsPort, idle.port, IDLE_DETECT_MS);
      try {
        const bytes = c === 'detecting' ? partial : hello;
        const idleAt = idle.connections;
        const warm = await openIdle(h.port, bytes, WARM);
        await waitFor('warm-up connections in haproxy', async () => (await h.currConns()) === WARM && (c === 'detecting' || idle.connections - idleAt === WARM));
        closeAll(warm);
        await waitFor('warm-up connections closed', async () => (await h.currConns()) === 0);
        await sleep(300);
        const before = await readRssOf(h.pid);
        const idleBase = idle.connections;
        const sockets = await openIdle(h.port, bytes, IDLE);
        await waitFor('connections in haproxy', async () => (await h.currConns()) === IDLE && (c === 'detecting' || idle.connections - idleBase === IDLE));
        await sleep(300);
        const after = await readRssOf(h.pid);
        closeAll(sockets);
        process.stderr.write(`memory HAProxy ${c}: RSS ${((after - before) / IDLE).toFixed(0)} B/conn\n`);
        return (after - before) / IDLE;
      } finally {
        await h.stop();
      }
    };
    const mem = {
      mux: { detecting: await memMux('detecting'), routed: await memMux('routed') },
      haproxy: { detecting: await memHaproxy('detecting'), routed: await memHaproxy('routed') },
    };

    // --- what one ClientHello costs the router in JS: sniff + parse, in this process -------------------------------
    const PARSES = 200_000;
    for (let i = 0; i < 20_000; i++) parseClientHello(hello);
    const tp = now();
    for (let i = 0; i < PARSES; i++) {
      sniffProtocol(hello);
      parseClientHello(hello);
    }
    const parseUs = ((now() - tp) * 1000) / PARSES;

    // --- the section -----------------------------------------------------------------------------------------------
    const d = speed.get('direct') as Speed;
    const m = speed.get('multiplexer') as Speed;
    const h = speed.get('HAProxy') as Speed;
    const f0 = (n: number) => n.toFixed(0);
    const f1 = (n: number) => n.toFixed(1);
    const f3 = (n: number) => n.toFixed(3);
    const ratio = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined || b === 0 ? '—' : `${(a / b).toFixed(2)}x`);
    const row = (label: string, fmt: (n: number) => string, dv: number | undefined, mv: number, hv: number) =>
      `| ${label} | ${dv === undefined ? '—' : fmt(dv)} | ${fmt(mv)} | ${fmt(hv)} | ${ratio(mv, dv)} | ${ratio(mv, hv)} |`;
    const total = (c: Cpu) => c.user + c.system;
    const cpuRow = (label: string, mv: Cpu, hv: Cpu) =>
      `| ${label} | — | ${f0(total(mv))} (${f0(mv.user)} + ${f0(mv.system)}) | ${f0(total(hv))} (${f0(hv.user)} + ${f0(hv.system)}) | — | ${ratio(total(mv), total(hv))} |`;
    const table = [
      '| figure | direct | multiplexer | HAProxy (peer) | multiplexer / direct | multiplexer / HAProxy |',
      '|---|---|---|---|---|---|',
      row(`throughput, one TLS stream (MiB/s, median of ${RUNS})`, f0, d.tput, m.tput, h.tput),
      row(`${RTT_BYTES}-byte round trip p50 (µs)`, f1, d.rtt.p50, m.rtt.p50, h.rtt.p50),
      row(`${RTT_BYTES}-byte round trip p99 (µs)`, f1, d.rtt.p99, m.rtt.p99, h.rtt.p99),
      row('added round trip p50 over direct (µs)', f1, undefined, m.rtt.p50 - d.rtt.p50, h.rtt.p50 - d.rtt.p50),
      row('added round trip p99 over direct (µs)', f1, undefined, m.rtt.p99 - d.rtt.p99, h.rtt.p99 - d.rtt.p99),
      row('connect: TCP + TLS handshake + 1st echoed byte p50 (ms)', f3, d.conn.p50, m.conn.p50, h.conn.p50),
      row('connect p99 (ms)', f3, d.conn.p99, m.conn.p99, h.conn.p99),
      row('added connect p50 over direct (ms)', f3, undefined, m.conn.p50 - d.conn.p50, h.conn.p50 - d.conn.p50),
      row(`new connections per second (${CONCURRENCY} in flight)`, f0, d.cps, m.cps, h.cps),
      cpuRow('router CPU per GiB streamed, user + system (ms)', m.tputCpuPerGiB!, h.tputCpuPerGiB!),
      cpuRow('router CPU per connection (connections/s phase), user + system (µs)', m.cpuPerConn!, h.cpuPerConn!),
      row(`router RSS per idle connection in detection (bytes)`, f0, undefined, mem.mux.detecting, mem.haproxy.detecting),
      row(`router RSS per idle routed connection (bytes)`, f0, undefined, mem.mux.routed, mem.haproxy.routed),
    ];

    const slower = m.tput < h.tput || m.rtt.p50 > h.rtt.p50 || m.conn.p50 > h.conn.p50 || m.cps < h.cps;
    const mc = m.cpuPerConn!;
    const hc = h.cpuPerConn!;
    const mg = m.tputCpuPerGiB!;
    const hg = h.tputCpuPerGiB!;
    const where = slower
      ? `- Where the time goes: per connection the multiplexer's process uses ${f0(total(mc))} µs of CPU to HAProxy's ` +
        `${f0(total(hc))} µs, ${f0(mc.system)} against ${f0(hc.system)} µs of it in the kernel, and of its ${f0(mc.user)} µs in ` +
        `user space sniffing and parsing the ClientHello take ${parseUs.toFixed(1)} µs: the rest is Node's machinery for two ` +
        `sockets (accept, net.Socket and stream setup, the upstream connect, pipe, shutdown, close, with their allocation ` +
        `and GC); per GiB streamed it uses ${f0(total(mg))} ms to HAProxy's ${f0(total(hg))} ms (${f0(mg.user)} against ` +
        `${f0(hg.user)} ms in user space, where the stream pump hands every read to JavaScript and back).`
      : `- The multiplexer is not slower than HAProxy on these figures; sniffing and parsing a ClientHello costs ${parseUs.toFixed(1)} µs.`;
    const cpu = cpus();
    const placement =
      CPU !== 'any' && CPU === ROUTER_CPU
        ? `- Placement: this process (client and backend) and the routers all run on CPU ${CPU} (BENCH_CPU, BENCH_ROUTER_CPU), ` +
          'so each figure includes the router\'s CPU cost: throughput and connections/s lose what the router takes from the ' +
          'shared core. Unpinned, round trips were bimodal from run to run (about 45 or 130 µs through either router): on this ' +
          'VM an idle vCPU halts, and waking the other one costs tens of µs per hop, which would swamp the router\'s own cost.'
        : `- Placement: this process (client and backend) on CPU ${cpuList(CPU)}, the routers on CPU ${cpuList(ROUTER_CPU)} ` +
          '(BENCH_CPU, BENCH_ROUTER_CPU); a router with a core of its own costs little throughput, so its cost shows in its ' +
          'CPU figures and in the added latency, which then includes waking the other CPU.';
    const section = [
      '## mux',
      '',
      `Run ${new Date().toISOString()} with \`npm run bench:mux\` (${((now() - started) / 1000).toFixed(0)} s): one TLS stream (${negotiated ?? '?'}, ` +
        `ALPN ${ALPN}, ECDSA P-256 test certificate) to a Node TLS echo/sink backend on ${BACKEND_IP}, straight, through the ` +
        `Multiplexer (passthrough route, own process) and through HAProxy (TCP mode, routing on req_ssl_sni / req.ssl_alpn, ` +
        `passthrough, nbthread ${HAPROXY_THREADS}). The paths take turns throughout. Throughput: median of ${RUNS} runs of ${MIB} MiB; round trip: ` +
        `${RTTS} samples; connect: ${CONNECTS} sequential; connections/s: ${CONNS} connect + handshake + 1-byte echo + close, ${CONCURRENCY} in flight, both after ${WARM_CONNS} ` +
        `warm-up connections per path; the multiplexer runs from dist/ (the shipped build); ` +
        `memory: ${IDLE} idle connections, each case in a fresh router process.`,
      `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}, ` +
        `${haproxyVersion} (Debian); load average ${loadBefore.toFixed(2)} at the start, ${loadavg()[0]!.toFixed(2)} at the end.`,
      '',
      ...table,
      '',
      '- Ratios: multiplexer figure divided by the baseline (for throughput and connections/s above 1 is better, for time,',
      '  CPU and memory below 1 is better).',
      placement,
      `- CPU: user + system time of the router's process from /proc/<pid>/stat over the throughput runs and the connections/s phase.`,
      `- Memory: RSS growth of the router process divided by the connections (the multiplexer's after global.gc()); ` +
        `"in detection" connections sent half a ClientHello (${partial.length} of ${hello.length} bytes), "routed" ones a full ` +
        'ClientHello forwarded to an idle TCP backend; kernel socket buffers are in neither figure.',
      where,
      '',
    ].join('\n');
    process.stdout.write(`${section}\n`);
    await recordSection('mux', section);
  } finally {
    for (const c of cleanups.reverse()) await c();
  }
}

/** One real ClientHello as Node's TLS client sends it to this bench's routers (SNI idle.gw.test, ALPN gateway-tcp). */
async function captureClientHello(ca: string): Promise<Buffer> {
  let client: tls.TLSSocket | undefined;
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, ROUTER_IP, r));
  try {
    return await new Promise<Buffer>((resolve, reject) => {
      server.once('connection', (s) => {
        let buf = Buffer.alloc(0);
        s.on('data', (c: Buffer) => {
          buf = Buffer.concat([buf, c]);
          const parsed = parseClientHello(buf);
          if (parsed.kind === 'hello') {
            s.destroy();
            resolve(buf.subarray(0, parsed.length));
          }
        });
        s.on('error', () => undefined);
      });
      client = tls.connect({ host: ROUTER_IP, port: (server.address() as net.AddressInfo).port, servername: NAMES.idle, ALPNProtocols: [ALPN], ca });
      client.on('error', (err) => (err.message.includes('ECONNRESET') || err.message.includes('socket disconnected') ? undefined : reject(err)));
    });
  } finally {
    client?.destroy();
    server.close();
  }
}

if (process.argv[2] === 'router') await routerMain(process.argv.slice(3));
else await main();
