/**
 * bench:mux's settings: the BENCH_* environment read once (the list with their defaults is at the top of
 * bench/mux.ts), and the fixed addresses, names and deadlines. Shared by the bench and its router child.
 */
import { envNumber } from '../common.js';

/** BENCH_* sizes and placement (defaults: the recorded run's); see the top of bench/mux.ts for each. */
export const MIB = envNumber('BENCH_MIB', 512);
export const RUNS = envNumber('BENCH_RUNS', 3);
export const RTTS = envNumber('BENCH_RTTS', 5000);
export const CONNECTS = envNumber('BENCH_CONNECTS', 500);
export const CONNS = envNumber('BENCH_CONNS', 2000);
export const CONCURRENCY = envNumber('BENCH_CONCURRENCY', 8);
export const IDLE = envNumber('BENCH_IDLE', 5000);
export const WARM_CONNS = envNumber('BENCH_WARM', 2000, 0);
export const HAPROXY_THREADS = envNumber('BENCH_HAPROXY_THREADS', 1);
export const HAPROXY = process.env.BENCH_HAPROXY || '/usr/sbin/haproxy';
/** CPU list (taskset -c) for this process (client and backend), or "any". */
export const CPU = process.env.BENCH_CPU || '0';
/** CPU list for the routers (multiplexer process, haproxy); by default the same CPU as the client and backend. */
export const ROUTER_CPU = process.env.BENCH_ROUTER_CPU || CPU;
/** Extra node flags for the multiplexer's process, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof". */
export const ROUTER_NODE_ARGS = (process.env.BENCH_ROUTER_NODE_ARGS ?? '').split(' ').filter(Boolean);

export const BACKEND_IP = '127.0.0.3';
export const ROUTER_IP = '127.0.0.1';
export const ALPN = 'gateway-tcp';
export const NAMES = { echo: 'echo.gw.test', sink: 'sink.gw.test', idle: 'idle.gw.test' } as const;
/** Detection deadline of both routers while measuring speed (haproxy: tcp-request inspect-delay). */
export const DETECT_MS = 5_000;
/** ... and while idle connections are held for the memory figures (they must outlive the measurement). */
export const IDLE_DETECT_MS = 120_000;
export const RTT_BYTES = 64;
/** Idle connections being opened at once (the memory figures). */
export const OPEN_CONCURRENCY = 64;
