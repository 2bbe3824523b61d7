/**
 * bench:tunnel's user path, what a user runs: a native client (iperf3) -> `gwsh proxy app` -> Proxy -> tunnel ->
 * agent -> `iperf3 -s`, against iperf3 -> the forwarded port of `ssh -R` -> `iperf3 -s`. Measures both (iperf3
 * throughput, CPU per GiB, round trips, new connections) and writes their rows and paragraph of the section.
 */
import net from 'node:net';
import { median } from '../common.js';
import type { ProfileSummary } from '../lib/cpuprofile.js';
import { cpuDelta, cpuSnapshot, reapedChildrenCpuSeconds, type CpuProbe } from '../lib/proc.js';
import { connectAndEcho, roundTrips, type Connect } from './measure.js';
import { runIperf3 } from './peers.js';
import { CONNECTS, IPERF_SECONDS, PROXY_IP, RTTS, RUNS, SSHD_IP, STREAMS, TARGET_IP } from './settings.js';

/** The two paths, and with BENCH_GWSH_BEFORE a third: the same gateway through another build of gwsh. */
export type UserPathName = 'gateway (gwsh proxy app)' | 'OpenSSH ssh -R' | 'gateway (BENCH_GWSH_BEFORE)';

export interface UserPathRoute {
  name: UserPathName;
  iperf: { host: string; port: number };
  echo: { host: string; port: number };
  cpu: CpuProbe;
}

export interface UserPathFigures {
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

/** iperf3 through both paths, alternating, 1 and STREAMS streams; then round trips and new connections. */
export async function measureUserPath(routes: UserPathRoute[], say: (s: string) => void): Promise<UserPathFigures> {
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

/** The two paths every user-path row compares. */
export const GW_USER: UserPathName = 'gateway (gwsh proxy app)';
export const SSH_USER: UserPathName = 'OpenSSH ssh -R';

/** The user path's rows of the tunnel table (raw TCP and gateway / raw do not apply). */
export function userPathRows(u: UserPathFigures): string[] {
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
export function userPathText(u: UserPathFigures, gwsh: ProfileSummary | undefined): string {
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
