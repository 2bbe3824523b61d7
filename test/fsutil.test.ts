/**
 * src/fsutil.ts writeFileAtomic, the one way a file is replaced: the mode asked for whatever the umask, the old
 * content kept and no temp file left when the write fails midway (failures injected into node:fs: as root, a
 * read-only directory would not stop the write), and the directory synced after the rename.
 */
import * as realFs from 'node:fs';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync as plainWrite } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

/** The next failure to inject, and the fsync calls seen (true: on a directory). */
const inject: { fail: 'fsync' | 'write-half' | undefined; syncs: boolean[] } = { fail: undefined, syncs: [] };

vi.mock('node:fs', async (importOriginal) => {
  const fs = await importOriginal<typeof import('node:fs')>();
  const errno = (code: string) => Object.assign(new Error(`${code} (injected)`), { code });
  return {
    ...fs,
    fsyncSync: (fd: number) => {
      inject.syncs.push(fs.fstatSync(fd).isDirectory());
      if (inject.fail === 'fsync') {
        inject.fail = undefined;
        throw errno('EIO');
      }
      fs.fsyncSync(fd);
    },
    writeFileSync: (target: number | string, data: string | Uint8Array, ...rest: unknown[]) => {
      if (inject.fail === 'write-half' && typeof target === 'number') {
        inject.fail = undefined;
        const bytes = Buffer.from(data);
        fs.writeSync(target, bytes.subarray(0, bytes.length >> 1));
        throw errno('ENOSPC');
      }
      return (fs.writeFileSync as (...a: unknown[]) => void)(target, data, ...rest);
    },
  };
});

const { writeFileAtomic, writePublicFile, writeSecretFile } = await import('../src/fsutil.js');
const { isGatewayError } = await import('../src/errors.js');
const { writeKubeSchedule } = await import('../src/upgrade/schedule.js');

let dir: string;
let umask: number;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'gw-fsutil-'));
  umask = process.umask();
  inject.fail = undefined;
  inject.syncs = [];
});
afterEach(() => {
  process.umask(umask);
  rmSync(dir, { recursive: true, force: true });
});

const modeOf = (path: string) => statSync(path).mode & 0o7777;

describe('writeFileAtomic', () => {
  it('gives the file the mode asked for whatever the umask, a new file or one replaced', () => {
    process.umask(0o077);
    const path = join(dir, 'sub', 'public.pem');
    writeFileAtomic(path, 'one', { mode: 0o644, dirMode: 0o755 });
    expect(modeOf(path)).toBe(0o644);
    expect(modeOf(join(dir, 'sub'))).toBe(0o700); // a directory's mode is the umask's business; the file's is not
    plainWrite(join(dir, 'loose'), 'x', { mode: 0o666 });
    realFs.chmodSync(join(dir, 'loose'), 0o666);
    writeFileAtomic(join(dir, 'loose'), 'tight', { mode: 0o600, dirMode: 0o700 });
    expect(modeOf(join(dir, 'loose'))).toBe(0o600);
    expect(readFileSync(join(dir, 'loose'), 'utf8')).toBe('tight');
  });

  it('syncs the file, then the directory after the rename', () => {
    writeFileAtomic(join(dir, 'f'), 'data', { mode: 0o644, dirMode: 0o755 });
    expect(inject.syncs).toEqual([false, true]);
    expect(readdirSync(dir)).toEqual(['f']);
  });

  it('a write that fails midway (ENOSPC after half) leaves the old content and no temp file, and throws the fs error', () => {
    const path = join(dir, 'state.json');
    writeFileAtomic(path, 'old', { mode: 0o644, dirMode: 0o755 });
    inject.fail = 'write-half';
    expect(() => writeFileAtomic(path, 'x'.repeat(100_000), { mode: 0o644, dirMode: 0o755 })).toThrow(expect.objectContaining({ code: 'ENOSPC' }));
    expect(readFileSync(path, 'utf8')).toBe('old');
    expect(readdirSync(dir)).toEqual(['state.json']);
  });

  it('a failing fsync leaves the old content and no temp file', () => {
    const path = join(dir, 'key.pem');
    writeSecretFile(path, 'old key');
    inject.fail = 'fsync';
    let err: unknown;
    try {
      writeSecretFile(path, 'new key');
    } catch (e) {
      err = e;
    }
    expect(isGatewayError(err) && err.code).toBe('GW_ERR_FS_WRITE');
    expect((err as Error).message).toBe(`cannot write ${path} (EIO)`);
    expect((err as Error).message).not.toContain('new key');
    expect(readFileSync(path, 'utf8')).toBe('old key');
    expect(readdirSync(dir)).toEqual(['key.pem']);
  });

  it('a rename that cannot happen (a directory in the way) leaves no temp file', () => {
    realFs.mkdirSync(join(dir, 'taken'));
    expect(() => writePublicFile(join(dir, 'taken'), 'x')).toThrow(expect.objectContaining({ code: 'GW_ERR_FS_WRITE' }));
    expect(readdirSync(dir)).toEqual(['taken']);
  });

  it('the upgraders write through it: the Kubernetes schedule gets its mode whatever the umask, file and directory synced', async () => {
    process.umask(0o077);
    const path = join(dir, 'schedule.json');
    await writeKubeSchedule(path, [{ start: new Date('2026-01-05T02:00:00Z'), stop: new Date('2026-01-05T03:00:00Z') }], new Date('2026-01-04T00:00:00Z'));
    expect(modeOf(path)).toBe(0o644);
    expect(inject.syncs).toEqual([false, true]);
    expect(readdirSync(dir)).toEqual(['schedule.json']);
  });
});
