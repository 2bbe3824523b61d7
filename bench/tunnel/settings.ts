/**
 * bench:tunnel's settings: the BENCH_* environment read once (the list with their defaults is at the top of
 * bench/tunnel.ts), and the fixed addresses and names of the paths. Shared by the bench and its idle-agents child.
 */
import { envNumber } from '../common.js';

/** BENCH_* sizes and switches (defaults: the recorded run's); see the top of bench/tunnel.ts for each. */
export const MIB = envNumber('BENCH_MIB', 512);
export const RUNS = envNumber('BENCH_RUNS', 3);
export const STREAMS = envNumber('BENCH_STREAMS', 8);
export const RTTS = envNumber('BENCH_RTTS', 5000);
/**
 * Round trips before the measured ones, on the same stream, for every path alike. With 200 the gateway's p99 on
 * the user path was 2.4-2.5 ms against 0.35-0.46 with 5 000: the Node.js processes were still compiling the path
 * (perf sched: their V8 background threads ran in chunks over 1 ms on the two cores while the round trips went on).
 */
export const RTT_WARMUP = envNumber('BENCH_RTT_WARMUP', 5000, 0);
export const STARTS = envNumber('BENCH_STARTS', 3);
export const AGENTS = envNumber('BENCH_AGENTS', 10_000);
export const AGENT_PROCS = envNumber('BENCH_AGENT_PROCS', 2);
/**
 * BENCH_TUNNEL_ONLY=idle: the idle-memory phase alone, printed and not recorded (for work on the Proxy's memory);
 * userpath: the user path, printed; metrics: the cost of metrics (bench/tunnel/metrics.ts), recorded.
 */
export const ONLY = process.env.BENCH_TUNNEL_ONLY ?? '';
/** Seconds the idle Proxy's CPU is read over once every agent is connected (three 20 s heartbeat rounds). */
export const IDLE_CPU_SECS = envNumber('BENCH_IDLE_CPU_SECS', 60, 0);
/** A directory: the idle Proxy writes a V8 heap snapshot there after each full gc (compare two checkpoints). */
export const HEAP_DIR = process.env.BENCH_IDLE_HEAPSNAPSHOT;
/**
 * BENCH_PROFILE: 1 (the default) or 0 for the sampled profiles after the measured runs; a directory (anything not a
 * number) for those and the user path's two runs under `node --cpu-prof` into it (bench/tunnel/profiled.ts).
 */
const PROFILE_RAW = process.env.BENCH_PROFILE?.trim() ?? '';
export const PROFILE_DIR = PROFILE_RAW !== '' && !/^\d+$/.test(PROFILE_RAW) ? PROFILE_RAW : '';
export const PROFILE = PROFILE_DIR !== '' || envNumber('BENCH_PROFILE', 1, 0) > 0;
export const PROFILE_MIB = envNumber('BENCH_PROFILE_MIB', 256);
/** Bytes of each round trip's message. */
export const MSG = 64;

/** The loopback addresses of the resources, sshd and the Proxy, and the names only squid resolves. */
export const TARGET_IP = '127.0.0.3';
export const SSHD_IP = '127.0.0.4';
export const PROXY_IP = '127.0.0.5';
export const PROXY_NAME = 'proxy.gw.test';
export const SSHD_NAME = 'sshd.gw.test';
export const PASSWORD = 'bench password, long enough';


/** Extra Node options for the Proxy and agent daemons of the data path (BENCH_DAEMON_NODE_OPTIONS), e.g. GC settings. */
export const DAEMON_NODE_OPTIONS = process.env.BENCH_DAEMON_NODE_OPTIONS?.trim() ?? '';

/** glibc malloc settings for the same daemons (BENCH_DAEMON_GLIBC_TUNABLES, passed as GLIBC_TUNABLES). */
export const DAEMON_GLIBC_TUNABLES = process.env.BENCH_DAEMON_GLIBC_TUNABLES?.trim() ?? '';

/** Another gwsh.js (e.g. a copy of dist/ before a change) run as a third path, for before/after figures in one run. */
export const GWSH_BEFORE = process.env.BENCH_GWSH_BEFORE ?? '';
/** BENCH_GWSH_NODE_OPTIONS: NODE_OPTIONS of the user path's gwsh processes, to try settings or preloads (printed runs). */
export const GWSH_NODE_OPTIONS = process.env.BENCH_GWSH_NODE_OPTIONS ?? '';


/** The user path: seconds per iperf3 run (iperf3's own default, what a user runs: 3 s runs were mostly TCP's and the JIT's ramp-up), and new connections timed. */
export const IPERF_SECONDS = envNumber('BENCH_IPERF_SECONDS', 10);
export const CONNECTS = envNumber('BENCH_CONNECTS', 50);

/** Agents per source address: well under the Proxy's default max_connections_per_source (1000). */
export const AGENTS_PER_SOURCE = 400;

/** Connections of the TLS floor (its per-connection figure does not depend on the count much; the run time does). */
export const TLS_FLOOR_CONNECTIONS = 2000;
