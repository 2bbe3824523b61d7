/**
 * bench:mux's speed figures, the paths taking turns run by run, sample by sample or batch by batch (so that load from
 * elsewhere on the machine hits all three alike): throughput to the sink and the router's CPU per GiB, round trips on
 * one connection, sequential connects, connections per second and the router's CPU per connection.
 */
import { median, percentile, withTimeout, writeBytes } from '../common.js';
import { cpuOf, cpuSince, type Cpu } from '../lib/proc.js';
import { now, type Backend, type Client, type Path } from './paths.js';
import { CONCURRENCY, CONNECTS, CONNS, MIB, NAMES, RTT_BYTES, RTTS, RUNS, WARM_CONNS } from './settings.js';

/** One path's figures. */
export interface Speed {
  tput: number;
  /** ms per GiB */
  tputCpuPerGiB?: Cpu;
  rtt: { p50: number; p99: number };
  conn: { p50: number; p99: number };
  cps: number;
  /** µs per connection */
  cpuPerConn?: Cpu;
}

/** One TLS stream pushing mib MiB to the sink until the sink has them all: plaintext MiB/s. */
async function throughputRun(client: Client, backend: Backend, path: Path, mib = MIB): Promise<number> {
  const bytes = mib * 2 ** 20;
  const s = await client.connect(path, NAMES.sink);
  const arrived = backend.sinkReceives(bytes);
  const t0 = now();
  await writeBytes(s, bytes);
  const t1 = await withTimeout(`${path.name} throughput`, arrived);
  s.destroy();
  return bytes / 2 ** 20 / ((t1 - t0) / 1000);
}

/** An established echo connection on which one 64-byte round trip can be timed at a time. */
async function echoChannel(client: Client, path: Path): Promise<{ once(): Promise<number>; close(): void }> {
  const s = await client.connect(path, NAMES.echo);
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
}

/** `count` connections with CONCURRENCY in flight: wall time and the router's CPU. */
async function connectionBatch(client: Client, path: Path, count: number): Promise<{ ms: number; cpu?: Cpu }> {
  const cpu0 = path.pid ? await cpuOf(path.pid) : undefined;
  let next = 0;
  const t0 = now();
  await withTimeout(
    `${path.name} connections/s`,
    Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next++ < count) await client.connectEchoClose(path);
      }),
    ),
  );
  const ms = now() - t0;
  const cpu = await cpuSince(path.pid, cpu0);
  return { ms, ...(cpu ? { cpu } : {}) };
}

/** Throughput: the paths take turns run by run; the median and the router's CPU per GiB into speed. */
async function throughputPhase(client: Client, backend: Backend, paths: Path[], speed: Map<string, Partial<Speed>>): Promise<void> {
  const rates = new Map<string, number[]>(paths.map((p) => [p.name, []]));
  const tputCpu = new Map<string, Cpu>(paths.map((p) => [p.name, { user: 0, system: 0 }]));
  for (const p of paths) await throughputRun(client, backend, p, Math.min(MIB, 64)); // warm-up (and a check of every path)
  for (let run = 0; run < RUNS; run++) {
    for (const p of paths) {
      const cpu0 = p.pid ? await cpuOf(p.pid) : undefined;
      rates.get(p.name)!.push(await throughputRun(client, backend, p));
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
}

/** Round trips, then (after the warm-up connections) sequential connects and connections/s, into speed. */
async function connectionPhase(client: Client, paths: Path[], speed: Map<string, Partial<Speed>>): Promise<void> {
  const channels = await Promise.all(paths.map((p) => echoChannel(client, p)));
  const rtt = paths.map((): number[] => []);
  for (let i = 0; i < 500 + RTTS; i++) {
    for (const [k, ch] of channels.entries()) {
      const us = await ch.once();
      if (i >= 500) rtt[k]!.push(us);
    }
  }
  for (const ch of channels) ch.close();
  // Warm the connection path up (see the top of bench/mux.ts), the paths taking turns batch by batch.
  for (let round = 0; round < 4 && WARM_CONNS > 0; round++) for (const p of paths) await connectionBatch(client, p, Math.ceil(WARM_CONNS / 4));
  const conn = paths.map((): number[] => []);
  for (let i = 0; i < 30 + CONNECTS; i++) {
    for (const [k, p] of paths.entries()) {
      const t0 = now();
      await client.connectEchoClose(p);
      if (i >= 30) conn[k]!.push(now() - t0);
    }
  }
  const ROUNDS = 4;
  const batches = paths.map(() => ({ ms: 0, cpu: { user: 0, system: 0 } as Cpu }));
  for (let round = 0; round < ROUNDS; round++) {
    const count = Math.floor(CONNS / ROUNDS) + (round < CONNS % ROUNDS ? 1 : 0);
    for (const [k, p] of paths.entries()) {
      const r = await connectionBatch(client, p, count);
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
}

/** Every speed figure of every path. */
export async function measureSpeed(client: Client, backend: Backend, paths: Path[]): Promise<Map<string, Speed>> {
  const speed = new Map<string, Partial<Speed>>(paths.map((p) => [p.name, {}]));
  await throughputPhase(client, backend, paths, speed);
  await connectionPhase(client, paths, speed);
  return speed as Map<string, Speed>;
}
