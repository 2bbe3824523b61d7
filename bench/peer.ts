/**
 * bench:peer — one stream through Proxy peering against the same stream without it, in the same run:
 *
 *   direct   client -> Proxy B (gateway-tcp, TLS) -> B's reverse tunnel -> agent -> sink / echo
 *   peered   client -> Proxy A (gateway-tcp, TLS) -> A's router -> HTTP/2 over TLS on B's 3021 -> B -> agent -> ...
 *
 * Both Proxies, the Auth Service and the agent (a real TunnelAgent) run in this process
 * (test/proxy/peering-harness.ts: startProxyRole twice on one in-process Auth Service), so the figures compare
 * the paths' protocol work on one Node.js thread, not a network. Goals (issue 13): throughput ratio >= 0.8x,
 * round-trip p50 ratio <= 1.3x.
 *
 * Figures: single-stream throughput (BENCH_MIB MiB pushed to the sink until it ends its side, median of
 * BENCH_RUNS, paths interleaved) and 64-byte round trips on one established stream (BENCH_RTTS samples, p50 and
 * p99), plus the time to open a stream (TLS + route header + dial answer, BENCH_OPENS samples, p50).
 * Settings: BENCH_MIB (256), BENCH_RUNS (3), BENCH_RTTS (3000), BENCH_OPENS (200), BENCH_RECORD (0: print only).
 */
import { cpus, loadavg, totalmem } from 'node:os';
import type { Duplex } from 'node:stream';
import { createLogger, setRootLogger } from '../src/log.js';
import { startPeerCluster, type PeerCluster } from '../test/proxy/peering-harness.js';
import { waitUntil } from '../test/helpers/wait.js';
import { envNumber } from './common.js';
import { recordSection } from './record.js';

const MIB = envNumber('BENCH_MIB', 256);
const RUNS = envNumber('BENCH_RUNS', 3);
const RTTS = envNumber('BENCH_RTTS', 3000);
const OPENS = envNumber('BENCH_OPENS', 200);
const CHUNK = Buffer.alloc(64 * 1024, 7);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((s.length * p) / 100))]!;
};

async function throughput(c: PeerCluster, web: string): Promise<number> {
  const stream = await c.open(web, 'sink');
  const total = MIB * 1024 * 1024;
  const start = process.hrtime.bigint();
  let sent = 0;
  await new Promise<void>((resolve, reject) => {
    stream.on('error', reject);
    stream.resume();
    stream.once('end', () => resolve());
    const pump = () => {
      while (sent < total) {
        sent += CHUNK.length;
        if (!stream.write(CHUNK)) return void stream.once('drain', pump);
      }
      stream.end();
    };
    pump();
  });
  const s = Number(process.hrtime.bigint() - start) / 1e9;
  stream.destroy();
  return MIB / s;
}

async function roundTrips(stream: Duplex): Promise<number[]> {
  const msg = Buffer.alloc(64, 1);
  const out: number[] = [];
  for (let i = 0; i < RTTS; i++) {
    const start = process.hrtime.bigint();
    await new Promise<void>((resolve) => {
      let got = 0;
      const on = (chunk: Buffer) => {
        got += chunk.length;
        if (got >= 64) {
          stream.off('data', on);
          resolve();
        }
      };
      stream.on('data', on);
      stream.write(msg);
    });
    out.push(Number(process.hrtime.bigint() - start) / 1000);
  }
  return out;
}

async function opens(c: PeerCluster, web: string): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < OPENS; i++) {
    const start = process.hrtime.bigint();
    const s = await c.open(web);
    out.push(Number(process.hrtime.bigint() - start) / 1e6);
    s.destroy();
  }
  return out;
}

async function main(): Promise<void> {
  setRootLogger(createLogger({ level: 'silent' }));
  const loadStart = loadavg()[0]!.toFixed(2);
  const t0 = Date.now();
  const c = await startPeerCluster();
  try {
    await waitUntil('A sees the agent at B', () => c.a.cluster.locations(c.agentIdentity.hostId).includes(c.b.id) && !!c.a.cluster.proxy(c.b.id)?.peer_addr);
    const paths = [
      { name: 'direct (client -> B -> agent)', web: c.b.addresses.web! },
      { name: 'peered (client -> A -> 3021 -> B -> agent)', web: c.a.addresses.web! },
    ];
    // Warm-up: JIT, the peering connection.
    for (const p of paths) (await c.open(p.web)).destroy();
    const tp = paths.map(() => [] as number[]);
    for (let run = 0; run < RUNS; run++) for (const [i, p] of paths.entries()) tp[i]!.push(await throughput(c, p.web));
    const rtt: number[][] = [];
    for (const p of paths) {
      const s = await c.open(p.web);
      rtt.push(await roundTrips(s));
      s.destroy();
    }
    const open: number[][] = [];
    for (const p of paths) open.push(await opens(c, p.web));
    const [d, p] = [0, 1];
    const ratioTp = median(tp[p]!) / median(tp[d]!);
    const ratioRtt = pct(rtt[p]!, 50) / pct(rtt[d]!, 50);
    const mem = (totalmem() / 1024 ** 3).toFixed(1);
    const rows = paths.map(
      (path, i) => `| ${path.name} | ${median(tp[i]!).toFixed(0)} | ${pct(rtt[i]!, 50).toFixed(1)} | ${pct(rtt[i]!, 99).toFixed(1)} | ${pct(open[i]!, 50).toFixed(2)} |`,
    );
    const section = [
      '## peer',
      '',
      `Run ${new Date().toISOString()} with \`npm run bench:peer\` (${Math.round((Date.now() - t0) / 1000)} s). Two Proxies (startProxyRole twice on one in-process Auth Service, SQLite), an agent (TunnelAgent) whose only tunnel is to B, sink and echo servers on 127.0.0.1, the client: all in one Node.js process (test/proxy/peering-harness.ts). The client opens gateway-tcp streams (TLS 1.3, a user certificate) to B directly, or to A, which reaches the agent over Proxy peering: HTTP/2 over mutual TLS on B's peer_listen_addr. Throughput: ${MIB} MiB per run on one stream, median of ${RUNS}, paths interleaved; round trip: ${RTTS} samples of 64 bytes on one established stream; open: ${OPENS} sequential stream opens (TLS, route header, dial answer).`,
      `Machine: ${cpus()[0]?.model.split(' ').slice(0, 2).join(' ') ?? 'unknown'}, ${cpus().length} cores, ${mem} GiB memory, Node ${process.version}; load average ${loadStart} at the start, ${loadavg()[0]!.toFixed(2)} at the end (other work shared the machine).`,
      '',
      '| path | throughput, 1 stream (MiB/s) | 64-byte round trip p50 (µs) | p99 (µs) | stream open p50 (ms) |',
      '|---|---|---|---|---|',
      ...rows,
      '',
      `- Peered / direct: throughput ${ratioTp.toFixed(2)}x (goal >= 0.8x: ${ratioTp >= 0.8 ? 'met' : 'not met'}), round trip p50 ${ratioRtt.toFixed(2)}x (goal <= 1.3x: ${ratioRtt <= 1.3 ? 'met' : 'not met'}), stream open p50 ${(pct(open[p]!, 50) / pct(open[d]!, 50)).toFixed(2)}x.`,
      '- Everything shares one thread here: the peered path adds A\'s TLS termination and HTTP/2 framing and B\'s HTTP/2 and TLS on the same thread that runs B, the agent and the client, so its throughput cost is an upper bound of what two Proxies on two machines pay.',
      '',
    ].join('\n');
    process.stdout.write(section);
    if (process.env.BENCH_RECORD === '1') await recordSection('peer', section);
  } finally {
    await c.stop();
  }
}

await main();
process.exit(0);
