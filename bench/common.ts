/** Pieces the benchmarks share: integer parameters from the environment, an sshd run in the foreground, pushing to a sink and echo round trips. */
import type { Duplex } from 'node:stream';
import { spawn, type ChildProcess } from 'node:child_process';

/** An integer parameter from the environment (BENCH_*), or the fallback; anything else stops the bench. */
export function envNumber(name: string, fallback: number, min = 1): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be an integer >= ${min}, got ${JSON.stringify(raw)}`);
  return n;
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
