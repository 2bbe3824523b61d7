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

/**
 * The three paths: gwsh's default (end to end with the agent: the Proxy splices the TLS bytes onto a data connection
 * of the agent), the same gwsh with GWSH_E2E=off (the classic route: the Proxy terminates the client's TLS and frames
 * the stream into the tunnel's TLS), OpenSSH; with BENCH_GWSH_BEFORE a fourth: gwsh's default from another build.
 */
export type UserPathName = 'gateway (gwsh proxy app)' | 'gateway classic (GWSH_E2E=off)' | 'OpenSSH ssh -R' | 'gateway (BENCH_GWSH_BEFORE)';

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

/** The paths every user-path row compares. */
export const GW_USER: UserPathName = 'gateway (gwsh proxy app)';
export const CLASSIC_USER: UserPathName = 'gateway classic (GWSH_E2E=off)';
export const SSH_USER: UserPathName = 'OpenSSH ssh -R';

/**
 * The route gwsh --debug says its connections took, from its output: 'e2e' when every one went end to end (a line
 * "end-to-end to agent" and no other), 'classic' when none did (under --e2e off gwsh prints no line; under auto a
 * fallback prints "the classic route ...: <reason>"), else 'mixed'.
 */
export function routeTaken(gwshOutput: string): 'e2e' | 'classic' | 'mixed' {
  const e2e = /: end-to-end to agent /.test(gwshOutput);
  const other = /: the classic route /.test(gwshOutput) || /error: /.test(gwshOutput);
  return e2e && other ? 'mixed' : e2e ? 'e2e' : 'classic';
}

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
  const proxy = (p: UserPathName) => u.cpuPerGiB.get(p)!['Proxy daemon'] ?? 0;
  const row = (label: string, p: UserPathName, get: (p: UserPathName) => number, digits: number) =>
    `| ${label} | – | ${get(p).toFixed(digits)} | ${get(SSH_USER).toFixed(digits)} | ${(get(p) / get(SSH_USER)).toFixed(2)}x | – |`;
  return [
    // The end-to-end rows keep the labels bench/record.ts and earlier runs used: gwsh's default route.
    ...rows.map(([label, get, digits]) => row(label, GW_USER, get, digits)),
    `| user path: the Proxy daemon's CPU seconds per GiB (1 stream; goal <= 1.0) | – | ${proxy(GW_USER).toFixed(2)} | – | – | – |`,
    ...rows.map(([label, get, digits]) => row(label.replace('user path: ', 'user path, classic route (GWSH_E2E=off): '), CLASSIC_USER, get, digits)),
    `| user path, classic route (GWSH_E2E=off): the Proxy daemon's CPU seconds per GiB (1 stream) | – | ${proxy(CLASSIC_USER).toFixed(2)} | – | – | – |`,
  ];
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
  const three = (f: (p: UserPathName) => string) => `end to end ${f(GW_USER)}; classic ${f(CLASSIC_USER)}; OpenSSH ${f(SSH_USER)}`;
  return (
    `- User path (what a user runs): \`iperf3 -c 127.0.0.1 -p <port> -J -t ${u.seconds}\` -> a real \`gwsh --debug proxy app iperf --port 0\` process (signed in to the Proxy's ` +
    `listen address ${PROXY_IP}) -> the Proxy daemon -> the agent through squid -> \`iperf3 -s\` on ${TARGET_IP} (a tcp:// app), by two routes: ` +
    `**end to end** (gwsh's default, --e2e auto: a grant from the Proxy on gateway-grant-v1, TLS with the agent through the Proxy's one port, which splices the bytes onto a data connection the agent dialled through squid; ` +
    `each connection's --debug line said "end-to-end to agent", checked by the bench) and **classic** (a second gwsh with GWSH_E2E=off: TLS to the Proxy, which frames the stream into the agent's tunnel TLS; it printed no "end-to-end" line); ` +
    `peer: the same iperf3 client -> a third forward of the same \`ssh -R\` on ${SSHD_IP} -> its own \`iperf3 -s\` on ${TARGET_IP} (one server per path: a test waits for none of the other path's). ` +
    `Throughput is iperf3's sum_received; runs alternate end to end / classic / OpenSSH, 1 stream then ${STREAMS} (\`-P ${STREAMS}\`); each run's MiB/s, 1 stream: ${three((p) => each(1, p))}; ` +
    `${STREAMS} streams: ${three((p) => each(STREAMS, p))}. ` +
    `iperf3 opens its control connection first, through the same path. Round trips: another \`gwsh proxy app echo\` per gateway route against ssh -R's echo forward, one connection; ` +
    `new connection: connect, one 64-byte echo, close, alternating paths (end to end: a grant on gwsh's open grant session, a TCP connection to the Proxy and TLS with the agent; classic: a TCP and TLS connection to the Proxy and a route). ` +
    `CPU seconds per GiB received, single-stream runs, by process: ${three(components)}. ` +
    `CPU ms per new connection (from /proc, 10 ms ticks averaged over ${CONNECTS}): ${three(perConnection)}.` +
    (gwsh
      ? ` gwsh under \`--cpu-prof\` (one ${u.seconds} s single-stream run, shares of its busy time): ${gwsh.top
          .slice(0, 5)
          .map((t) => `\`${t.frame}\` ${(t.share * 100).toFixed(0)}%`)
          .join(', ')}; by group ${groups}.`
      : '')
  );
}
