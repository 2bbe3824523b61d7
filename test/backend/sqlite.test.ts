/** The SQLite backend: the shared conformance suite, then what is SQLite's own (the file, its modes, open errors). */
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { defaultSqlitePath, openBackend, openSqliteBackend, type BackendConfig } from '../../src/backend/index.js';
import type { GatewayError } from '../../src/errors.js';
import { runAsUser, src } from '../helpers/asuser.js';
import { IS_ROOT } from '../helpers/root.js';
import { describeConformance } from './conformance.js';
import { sqliteHarness } from './harness.js';
import { codeOf, open, tempDir } from './helpers.js';

function file(): string {
  return path.join(tempDir(), 'backend.sqlite');
}

describeConformance(sqliteHarness);

describe('sqlite backend: files', () => {
  it('creates the file 0600 (with -wal and -shm) and a missing directory 0700, whatever the umask', async () => {
    const dir = path.join(tempDir(), 'data', 'nested');
    const f = path.join(dir, 'backend.sqlite');
    const old = process.umask(0o000);
    try {
      const b = open(f);
      await b.put('/a', '1');
      expect(fs.statSync(f).mode & 0o777).toBe(0o600);
      for (const s of ['-wal', '-shm']) {
        if (fs.existsSync(f + s)) expect(fs.statSync(f + s).mode & 0o777).toBe(0o600);
      }
      expect(fs.existsSync(f + '-wal')).toBe(true);
      expect(fs.statSync(dir).mode & 0o777).toBe(0o700);
      expect(fs.statSync(path.dirname(dir)).mode & 0o777).toBe(0o700);
    } finally {
      process.umask(old);
    }
  });

  it('tightens an existing file to 0600', async () => {
    const f = file();
    fs.writeFileSync(f, '');
    fs.chmodSync(f, 0o644);
    open(f);
    expect(fs.statSync(f).mode & 0o777).toBe(0o600);
  });

  it('uses WAL with synchronous=NORMAL', async () => {
    const f = file();
    const b = open(f);
    await b.put('/a', '1');
    const raw = new Database(f, { readonly: true });
    try {
      expect(raw.pragma('journal_mode', { simple: true })).toBe('wal');
    } finally {
      raw.close();
    }
  });

  it('works in memory', async () => {
    const b = open(':memory:');
    await b.put('/a', '1');
    expect((await b.get('/a'))?.revision).toBe(1);
  });
});

describe('sqlite backend: open errors', () => {
  function openError(p: string): GatewayError {
    try {
      openSqliteBackend({ path: p, sweepIntervalMs: 0 }).close();
    } catch (err) {
      return err as GatewayError;
    }
    throw new Error(`opening ${p} succeeded`);
  }

  it('refuses a directory', () => {
    const dir = tempDir();
    const err = openError(dir);
    expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
    expect(err.message).toContain(dir);
    expect(err.message).toContain('directory');
    expect(err.hint).toContain('backend.sqlite');
    expect(err.details.path).toBe(dir);
  });

  it('refuses a file that is not a database, leaving it untouched', () => {
    const f = file();
    const garbage = Buffer.alloc(8192, 'not a database at all\n');
    fs.writeFileSync(f, garbage);
    const err = openError(f);
    expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
    expect(err.message).toContain(f);
    expect(err.message).toContain('not a SQLite database');
    expect(err.hint).toMatch(/move .* aside|backup/i);
    expect(fs.readFileSync(f).equals(garbage)).toBe(true);
    const short = file();
    fs.writeFileSync(short, 'hello');
    expect(openError(short).code).toBe('GW_ERR_BACKEND_OPEN');
  });

  it('refuses a SQLite database of another program without changing it', () => {
    const f = file();
    const raw = new Database(f);
    raw.exec('CREATE TABLE t (x)');
    raw.close();
    const before = fs.readFileSync(f);
    const err = openError(f);
    expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
    expect(err.message).toContain('other program');
    expect(fs.readFileSync(f).equals(before)).toBe(true);
  });

  it('refuses a backend written by a newer schema', async () => {
    const f = file();
    await open(f).close();
    const raw = new Database(f);
    raw.pragma('user_version = 99');
    raw.close();
    const err = openError(f);
    expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
    expect(err.message).toContain('newer');
  });

  it('refuses a path whose parent is a file', () => {
    const parent = path.join(tempDir(), 'plain-file');
    fs.writeFileSync(parent, 'x');
    const p = path.join(parent, 'backend.sqlite');
    const err = openError(p);
    expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
    expect(err.message).toContain(p);
  });

  it('refuses a directory it cannot write (as an unprivileged user: root could write anywhere)', () => {
    const dir = tempDir();
    fs.chmodSync(dir, 0o500);
    const target = path.join(dir, 'sub', 'backend.sqlite');
    try {
      if (IS_ROOT) {
        // Root ignores modes, so the check runs in a child process as "nobody", from a bundle that user can read.
        fs.chmodSync(dir, 0o505);
        const script = `import { openSqliteBackend } from ${JSON.stringify(src('backend/index.ts'))};
try { openSqliteBackend({ path: ${JSON.stringify(target)}, sweepIntervalMs: 0 }); console.log('opened'); }
catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }`;
        const r = runAsUser({ script, uid: 65534, gid: 65534, native: ['better-sqlite3'] });
        expect(r.stderr).toBe('');
        const err = JSON.parse(r.stdout) as { code: string; message: string };
        expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
        expect(err.message).toContain('permission denied');
      } else {
        const err = openError(target);
        expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
        expect(err.message).toContain('permission denied');
      }
    } finally {
      fs.chmodSync(dir, 0o700);
    }
  });
});

describe('sqlite backend: openBackend', () => {
  it('openBackend opens sqlite, and refuses an unknown type', async () => {
    const dir = tempDir();
    const b = await openBackend({ type: 'sqlite', path: defaultSqlitePath(dir), sweepIntervalMs: 0 });
    await b.put('/a', '1');
    await b.close();
    expect(fs.existsSync(path.join(dir, 'backend.sqlite'))).toBe(true);
    expect(await codeOf(openBackend({ type: 'etcd' } as unknown as BackendConfig))).toBe('GW_ERR_BACKEND_OPEN');
  });
});

