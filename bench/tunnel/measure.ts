/**
 * bench:tunnel's measuring: throughput until a counting sink has every byte, round trips on one stream, a new
 * connection and its first echo, and the cost of one AES-GCM pass on this machine (the cipher floor of the text).
 * Order statistics are bench/common.ts's; CPU from /proc bench/lib/proc.ts's.
 */
import { spawnSync } from 'node:child_process';
import { createCipheriv, randomBytes } from 'node:crypto';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { CHUNK, echoOnce, percentile, withTimeout, writeBytes } from '../common.js';
import type { CountingSink } from './peers.js';
import { MSG, RTT_WARMUP } from './settings.js';

/**
 * CPU seconds per GiB for one pass of an AES-GCM cipher over 16 KiB records: `openssl speed -evp` (libcrypto, as
 * TLS in Node and OpenSSH use it; divided by user CPU time, so other load does not skew it). Falls back to Node's
 * own cipher (one context, which also allocates an output buffer per record: an upper bound).
 */
export function cipherSecondsPerGiB(algorithm: 'aes-128-gcm' | 'aes-256-gcm'): number {
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

/** Opens one stream through a path. */
export type Connect = () => Promise<Duplex>;

/** MiB/s of `streams` streams carrying `bytes` together, from the first write until the sink has them all. */
export async function throughputOnce(connect: Connect, sink: CountingSink, bytes: number, streams: number): Promise<number> {
  const conns = await Promise.all(Array.from({ length: streams }, () => connect()));
  const per = Math.floor(bytes / streams / CHUNK.length) * CHUNK.length;
  const total = per * streams;
  const arrived = sink.expect(total);
  const t0 = process.hrtime.bigint();
  await Promise.all(conns.map((c) => writeBytes(c, per)));
  const t1 = await withTimeout('throughput', arrived, 300_000);
  for (const c of conns) c.destroy();
  return total / (Number(t1 - t0) / 1e9) / 2 ** 20;
}

/** RTT_WARMUP unmeasured round trips, then `count` timed ones on one stream: p50 and p99 in µs. */
export async function roundTrips(connect: Connect, count: number): Promise<{ p50: number; p99: number }> {
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

/** Opening a new connection through the path and one 64-byte echo on it, then closing it: ms. */
export async function connectAndEcho(host: string, port: number): Promise<number> {
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
