/**
 * bench:mux's section of bench/RESULTS.md: the table (direct, multiplexer, HAProxy and the two ratios), then the
 * paragraphs (ratios, placement, CPU, memory, where the time goes). The row labels are read by bench/record.ts (the
 * chart): keep them as they are.
 */
import { cpus, loadavg, totalmem } from 'node:os';
import type { Cpu } from '../lib/proc.js';
import type { MuxMemory } from './memory.js';
import { now } from './paths.js';
import { cpuList } from './routers.js';
import type { Speed } from './speed.js';
import { ALPN, BACKEND_IP, CONCURRENCY, CONNECTS, CONNS, CPU, HAPROXY_THREADS, IDLE, MIB, ROUTER_CPU, RTT_BYTES, RTTS, RUNS, WARM_CONNS } from './settings.js';

/** Everything the section says, as main measured it. */
export interface MuxFigures {
  /** ms, `now()` when the bench began. */
  started: number;
  loadBefore: number;
  haproxyVersion: string;
  /** TLS version and cipher of the client's streams. */
  negotiated: string | undefined;
  speed: Map<string, Speed>;
  mem: MuxMemory;
}

const f0 = (n: number) => n.toFixed(0);
const total = (c: Cpu) => c.user + c.system;

/** The table: every path's figures and the ratios. */
function muxTable(speed: Map<string, Speed>, mem: MuxMemory): string[] {
  const d = speed.get('direct') as Speed;
  const m = speed.get('multiplexer') as Speed;
  const h = speed.get('HAProxy') as Speed;
  const f1 = (n: number) => n.toFixed(1);
  const f3 = (n: number) => n.toFixed(3);
  const ratio = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined || b === 0 ? '—' : `${(a / b).toFixed(2)}x`);
  const row = (label: string, fmt: (n: number) => string, dv: number | undefined, mv: number, hv: number) =>
    `| ${label} | ${dv === undefined ? '—' : fmt(dv)} | ${fmt(mv)} | ${fmt(hv)} | ${ratio(mv, dv)} | ${ratio(mv, hv)} |`;
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
  return table;
}

/** Where the multiplexer's time goes, from its CPU per connection and per GiB against HAProxy's. */
function whereText(speed: Map<string, Speed>, parseUs: number): string {
  const m = speed.get('multiplexer')!;
  const h = speed.get('HAProxy')!;
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
  return where;
}

/** Where the processes ran (BENCH_CPU, BENCH_ROUTER_CPU). */
function placementText(): string {
  return (
    CPU !== 'any' && CPU === ROUTER_CPU
      ? `- Placement: this process (client and backend) and the routers all run on CPU ${CPU} (BENCH_CPU, BENCH_ROUTER_CPU), ` +
        'so each figure includes the router\'s CPU cost: throughput and connections/s lose what the router takes from the ' +
        'shared core. Unpinned, round trips were bimodal from run to run (about 45 or 130 µs through either router): on this ' +
        'VM an idle vCPU halts, and waking the other one costs tens of µs per hop, which would swamp the router\'s own cost.'
      : `- Placement: this process (client and backend) on CPU ${cpuList(CPU)}, the routers on CPU ${cpuList(ROUTER_CPU)} ` +
        '(BENCH_CPU, BENCH_ROUTER_CPU); a router with a core of its own costs little throughput, so its cost shows in its ' +
        'CPU figures and in the added latency, which then includes waking the other CPU.');
}

/** The section, from its heading to the last paragraph. */
export function muxSection(f: MuxFigures): string {
  const cpu = cpus();
  return [
    '## mux',
    '',
    `Run ${new Date().toISOString()} with \`npm run bench:mux\` (${((now() - f.started) / 1000).toFixed(0)} s): one TLS stream (${f.negotiated ?? '?'}, ` +
      `ALPN ${ALPN}, ECDSA P-256 test certificate) to a Node TLS echo/sink backend on ${BACKEND_IP}, straight, through the ` +
      `Multiplexer (passthrough route, own process) and through HAProxy (TCP mode, routing on req_ssl_sni / req.ssl_alpn, ` +
      `passthrough, nbthread ${HAPROXY_THREADS}). The paths take turns throughout. Throughput: median of ${RUNS} runs of ${MIB} MiB; round trip: ` +
      `${RTTS} samples; connect: ${CONNECTS} sequential; connections/s: ${CONNS} connect + handshake + 1-byte echo + close, ${CONCURRENCY} in flight, both after ${WARM_CONNS} ` +
      `warm-up connections per path; the multiplexer runs from dist/ (the shipped build); ` +
      `memory: ${IDLE} idle connections, each case in a fresh router process.`,
    `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}, ` +
      `${f.haproxyVersion} (Debian); load average ${f.loadBefore.toFixed(2)} at the start, ${loadavg()[0]!.toFixed(2)} at the end.`,
    '',
    ...muxTable(f.speed, f.mem),
    '',
    '- Ratios: multiplexer figure divided by the baseline (for throughput and connections/s above 1 is better, for time,',
    '  CPU and memory below 1 is better).',
    placementText(),
    `- CPU: user + system time of the router's process from /proc/<pid>/stat over the throughput runs and the connections/s phase.`,
    `- Memory: RSS growth of the router process divided by the connections (the multiplexer's after global.gc()); ` +
      `"in detection" connections sent half a ClientHello (${f.mem.partial.length} of ${f.mem.hello.length} bytes), "routed" ones a full ` +
      'ClientHello forwarded to an idle TCP backend; kernel socket buffers are in neither figure.',
    whereText(f.speed, f.mem.parseUs),
    '',
  ].join('\n');
}
