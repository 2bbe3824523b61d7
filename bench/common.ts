/** Pieces the benchmarks share: integer parameters from the environment, and an sshd run in the foreground. */
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
