import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach } from 'vitest';
import type { GatewayError } from '../../src/errors.js';
import { openSqliteBackend, type SqliteBackend, type SqliteBackendOptions } from '../../src/backend/index.js';

/** A clock the test moves by hand. */
export class ManualClock {
  constructor(public now = 1_700_000_000_000) {}
  readonly read = (): number => this.now;
  advance(ms: number): void {
    this.now += ms;
  }
}

const dirs: string[] = [];
const opened: SqliteBackend[] = [];

afterEach(async () => {
  for (const b of opened.splice(0)) await b.close();
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

export function tempDir(): string {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'gw-backend-'));
  dirs.push(d);
  return d;
}

/** Opens a backend (closed after the test) with the sweep timer off unless asked for. */
export function open(file: string, options: Partial<SqliteBackendOptions> = {}): SqliteBackend {
  const b = openSqliteBackend({ sweepIntervalMs: 0, ...options, path: file });
  opened.push(b);
  return b;
}

export async function codeOf(p: Promise<unknown> | (() => unknown)): Promise<string | undefined> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (err) {
    return (err as { code?: string }).code;
  }
  return undefined;
}

/** The GatewayError a promise rejects with (fails the test if it resolves). */
export async function rejection(p: Promise<unknown>): Promise<GatewayError> {
  try {
    await p;
  } catch (err) {
    return err as GatewayError;
  }
  throw new Error('expected a rejection');
}
