/**
 * The PostgreSQL change feed's back-off (src/backend/pgfollow.ts FEED_RETRY) against a scripted pg client: the
 * delays double while connecting or reading fails, and a catch-up that succeeds starts them again. The timers are
 * a hand-driven clock; the real server's faults are in postgres-faults.test.ts.
 */
import { EventEmitter } from 'node:events';
import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { ChangeFollower, FEED_RETRY } from '../../src/backend/pgfollow.js';
import { WatchHub } from '../../src/backend/watchers.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger } from '../../src/log.js';
import { ManualClock } from '../helpers/clock.js';
import { waitUntil } from '../helpers/wait.js';

/** What the next clients do: refuse to connect, or fail every query after LISTEN. */
const script = { connect: true, read: true };

class ScriptedClient extends EventEmitter {
  async connect(): Promise<void> {
    if (!script.connect) throw Object.assign(new Error('connect ECONNREFUSED (scripted)'), { code: 'ECONNREFUSED' });
  }
  async query(text: string | { text: string }): Promise<{ rows: unknown[] }> {
    const sql = typeof text === 'string' ? text : text.text;
    if (sql.startsWith('LISTEN') || sql === 'COMMIT') return { rows: [] };
    if (!script.read) throw new Error('read failed (scripted)');
    if (sql.startsWith('BEGIN')) return { rows: [] };
    return { rows: [{ head: '1', compacted: '0' }] };
  }
  async end(): Promise<void> {}
}

describe('ChangeFollower back-off', () => {
  it('doubles from FEED_RETRY.firstMs while it fails, and starts again after a catch-up that succeeds', async () => {
    const log = createLogger({ level: 'silent' });
    const clock = new ManualClock();
    const follower = new ChangeFollower({
      newClient: () => new ScriptedClient() as unknown as pg.Client,
      hub: new WatchHub(log),
      log,
      startRevision: 0,
      pollIntervalMs: 0,
      describe: (err) => new GatewayError('GW_ERR_BACKEND_UNREACHABLE', (err as Error).message),
      backoffDeps: clock.deps(),
    });
    script.connect = true;
    script.read = false;
    await follower.start();
    const failedTry = async (n: number) => {
      await waitUntil(`failure ${n} scheduled its retry`, () => clock.delays.length === n && clock.pending === 1);
    };
    await failedTry(1); // the first read failed
    script.connect = false;
    clock.fireNext();
    await failedTry(2); // connecting again failed
    clock.fireNext();
    await failedTry(3);
    script.connect = true;
    script.read = true;
    clock.fireNext(); // connects and catches up: the back-off starts again
    await follower.waitFor(1); // revision 1 (the scripted head) delivered: that catch-up succeeded
    script.read = false;
    follower.request();
    await failedTry(4);
    await follower.close();
    expect(clock.pending).toBe(0);
    const f = FEED_RETRY.firstMs;
    expect(clock.delays).toEqual([f, 2 * f, 4 * f, f]);
  });
});
