/**
 * Pieces the benchmarks share: integer parameters from the environment, waiting (sleep, a deadline on a promise,
 * stopping a child), order statistics (percentile, median), an sshd run in the foreground, pushing to a sink and echo
 * round trips. What is read from /proc (CPU, memory) is in bench/lib/proc.ts; CPU profiles in bench/lib/cpuprofile.ts.
 */
import type { Duplex, Writable } from 'node:stream';
import { spawn, type ChildProcess } from 'node:child_process';

/** An integer parameter from the environment (BENCH_*), or the fallback; anything else stops the bench. */
export function envNumber(name: string, fallback: number, min = 1): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be an integer >= ${min}, got ${JSON.stringify(raw)}`);
  return n;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** The value at percentile p (0-100) of an ascending array: the nearest rank below, as every bench has read it. */
export function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/** The median of unsorted values (an even count: the mean of the middle two). */
export function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/** p, or a rejection naming `what` once ms have passed without a result. */
export function withTimeout<T>(what: string, p: Promise<T>, ms = 120_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: no result within ${ms} ms`)), ms))),
  ]);
}

/** Resolves once the child has exited (at once if it has). */
export function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

/** SIGTERM, then SIGKILL if the child is still there after graceMs; resolves once it has exited. */
export async function stopChild(child: ChildProcess, graceMs = 5000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const killer = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await exited(child);
  clearTimeout(killer);
}

/** Starts /usr/sbin/sshd -D -e with the given config and resolves once it listens (rejects with its log). */
export async function spawnSshd(configPath: string): Promise<ChildProcess> {
  const child = spawn('/usr/sbin/sshd', ['-D', '-e', '-f', configPath], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr!.on('data', (c: Buffer) => (log = (log + c.toString()).slice(-8000)));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`sshd did not start:\n${log}`)), 10_000);
    child.once('exit', (code) => reject(new Error(`sshd exited with ${code}:\n${log}`)));
    const check = () => {
      if (log.includes('Server listening')) {
        clearTimeout(timer);
        child.stderr!.off('data', check);
        resolve();
      }
    };
    child.stderr!.on('data', check);
  });
  return child;
}

/** 256 KiB of one byte value: what the throughput figures write, a slice of it for the last write. */
export const CHUNK = Buffer.alloc(256 * 1024, 0x5a);

/** Writes `bytes` bytes of CHUNK with back-pressure (waits for drain); resolves once the last write is queued, rejects on the stream's error. */
export function writeBytes(stream: Writable, bytes: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let sent = 0;
    stream.once('error', reject);
    const pump = () => {
      while (sent < bytes) {
        const n = Math.min(CHUNK.length, bytes - sent);
        sent += n;
        if (!stream.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n))) return void stream.once('drain', pump);
      }
      resolve(); // the error listener stays: an error after the writes (a reset) must not go unhandled
    };
    pump();
  });
}

/**
 * Pushes totalBytes in chunks of `chunk` on stream with back-pressure, ends it, and resolves once the far end
 * has ended its side (a sink ends once it has read everything): MiB/s, measured from the first write.
 */
export async function pushToSink(stream: Duplex, totalBytes: number, chunk: Buffer): Promise<number> {
  const start = process.hrtime.bigint();
  let sent = 0;
  await new Promise<void>((resolve, reject) => {
    stream.on('error', reject);
    stream.resume();
    stream.once('end', () => resolve());
    const pump = () => {
      while (sent < totalBytes) {
        sent += chunk.length;
        if (!stream.write(chunk)) return void stream.once('drain', pump);
      }
      stream.end();
    };
    pump();
  });
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  stream.destroy();
  return totalBytes / (1024 * 1024) / seconds;
}

/** One 64-byte message written to an echo stream and read back; µs. */
export async function echoOnce(stream: Duplex, msg: Buffer = Buffer.alloc(64, 1)): Promise<number> {
  const start = process.hrtime.bigint();
  await new Promise<void>((resolve) => {
    let got = 0;
    const on = (c: Buffer) => {
      got += c.length;
      if (got >= msg.length) {
        stream.off('data', on);
        resolve();
      }
    };
    stream.on('data', on);
    stream.write(msg);
  });
  return Number(process.hrtime.bigint() - start) / 1000;
}
