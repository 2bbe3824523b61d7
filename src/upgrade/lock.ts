/**
 * One upgrader at a time per host: a lock file created with O_EXCL that holds the owner's pid. A lock whose pid
 * no longer runs (the upgrader was killed) is taken over. The timer, a manual run and a second manual run all go
 * through it.
 */
import { mkdir, open, readFile, stat, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { GatewayError } from '../errors.js';
import { processAlive } from '../proc.js';

export interface Lock {
  path: string;
  release(): Promise<void>;
}

export async function acquireLock(path: string): Promise<Lock> {
  await mkdir(dirname(path), { recursive: true, mode: 0o755 }).catch(() => undefined);
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fh = await open(path, 'wx', 0o644);
      try {
        await fh.writeFile(`${process.pid}\n`);
      } finally {
        await fh.close();
      }
      let released = false;
      return {
        path,
        async release() {
          if (released) return;
          released = true;
          // Only remove our own lock.
          const text = await readFile(path, 'utf8').catch(() => '');
          if (Number.parseInt(text, 10) === process.pid) await unlink(path).catch(() => undefined);
        },
      };
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'EEXIST') {
        throw new GatewayError('GW_ERR_UPGRADE_LOCKED', `cannot create the upgrader lock ${path} (${code ?? 'error'})`, {
          cause: err,
          hint: `Run gateway-upgrade as root, or set GATEWAY_UPGRADE_LOCK_FILE to a writable path.`,
        });
      }
    }
    const text = await readFile(path, 'utf8').catch(() => '');
    const pid = Number.parseInt(text, 10);
    if (Number.isInteger(pid) && pid > 0 && processAlive(pid)) {
      throw new GatewayError('GW_ERR_UPGRADE_LOCKED', `another gateway-upgrade (pid ${pid}) is running: it holds ${path}`, { details: { pid, path } });
    }
    if (!(Number.isInteger(pid) && pid > 0)) {
      // Just created by another upgrader that has not written its pid yet, or left empty by a crash long ago.
      const st = await stat(path).catch(() => undefined);
      if (st && Date.now() - st.mtimeMs < 10_000) {
        throw new GatewayError('GW_ERR_UPGRADE_LOCKED', `another gateway-upgrade is starting: it holds ${path}`, { details: { path } });
      }
    }
    // Stale (its process is gone): take it over.
    await unlink(path).catch(() => undefined);
  }
  throw new GatewayError('GW_ERR_UPGRADE_LOCKED', `cannot take the upgrader lock ${path}: another upgrader keeps taking it`);
}
