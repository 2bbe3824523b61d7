/** src/backoff.ts: the sequence, the cap, jitter's bounds, reset, stop; on a hand-driven clock, never a timing. */
import { describe, expect, it } from 'vitest';
import { Backoff } from '../src/backoff.js';
import { isGatewayError } from '../src/errors.js';
import { ManualClock } from './helpers/clock.js';

const seq = (b: Backoff, n: number) => Array.from({ length: n }, () => b.next());

describe('Backoff', () => {
  it('doubles from firstMs and stops at maxMs (no jitter)', () => {
    const b = new Backoff({ firstMs: 100, maxMs: 5000, jitter: 'none' });
    expect(seq(b, 9)).toEqual([100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    expect(b.attempts).toBe(9);
  });

  it('equal jitter: each delay in [ceiling/2, ceiling], the ends reached with random 0 and almost 1', () => {
    expect(seq(new Backoff({ firstMs: 500, maxMs: 5000, jitter: 'equal' }, { random: () => 0 }), 6)).toEqual([250, 500, 1000, 2000, 2500, 2500]);
    expect(seq(new Backoff({ firstMs: 500, maxMs: 5000, jitter: 'equal' }, { random: () => 0.999999 }), 6)).toEqual([500, 1000, 2000, 4000, 5000, 5000]);
    expect(seq(new Backoff({ firstMs: 500, maxMs: 5000, jitter: 'equal' }, { random: () => 0.5 }), 6)).toEqual([375, 750, 1500, 3000, 3750, 3750]);
  });

  it('jitter stays in bounds whatever the randomness answers (out of range clamped)', () => {
    const draws = [0, 0.25, 0.9, -3, 7, Number.NaN];
    let i = 0;
    const b = new Backoff({ firstMs: 100, maxMs: 1000, jitter: 'equal' }, { random: () => draws[i++ % draws.length]! });
    for (let n = 0; n < 30; n++) {
      const ceiling = Math.min(1000, 100 * 2 ** n);
      const d = b.next();
      expect(d).toBeGreaterThanOrEqual(ceiling / 2);
      expect(d).toBeLessThanOrEqual(ceiling);
    }
  });

  it('a long run of failures stays at the cap (no overflow)', () => {
    const b = new Backoff({ firstMs: 1, maxMs: 60_000, jitter: 'none' });
    seq(b, 5000);
    expect(b.next()).toBe(60_000);
  });

  it('up() starts the sequence again at once when resetAfterMs is 0', () => {
    const b = new Backoff({ firstMs: 100, maxMs: 5000, jitter: 'none' });
    seq(b, 4);
    b.up();
    expect(seq(b, 2)).toEqual([100, 200]);
    seq(b, 3);
    b.reset();
    expect(b.next()).toBe(100);
  });

  it('with resetAfterMs, up() resets only a connection that stayed up that long', () => {
    const clock = new ManualClock(1000);
    const b = new Backoff({ firstMs: 100, maxMs: 5000, jitter: 'none', resetAfterMs: 10_000 }, clock.deps());
    expect(seq(b, 3)).toEqual([100, 200, 400]);
    b.up();
    clock.advance(9_999); // dropped just short of it: the sequence goes on
    expect(b.next()).toBe(800);
    b.up();
    clock.advance(10_000);
    expect(b.next()).toBe(100);
  });

  it('schedule() runs after next() on the injected timers; one pending at a time; 0 does not advance', () => {
    const clock = new ManualClock();
    const b = new Backoff({ firstMs: 100, maxMs: 5000, jitter: 'none' }, clock.deps());
    const fired: string[] = [];
    expect(b.schedule(() => fired.push('a'))).toBe(100);
    expect(b.schedule(() => fired.push('b'))).toBe(200); // replaces a
    expect(clock.pending).toBe(1);
    clock.advance(200);
    expect(fired).toEqual(['b']);
    expect(b.schedule(() => fired.push('now'), 0)).toBe(0);
    clock.advance(0);
    expect(fired).toEqual(['b', 'now']);
    expect(b.next()).toBe(400);
    expect(clock.delays).toEqual([100, 200, 0]);
  });

  it('stop() cancels the pending retry and refuses new ones until resume()', async () => {
    const clock = new ManualClock();
    const b = new Backoff({ firstMs: 100, maxMs: 5000, jitter: 'none' }, clock.deps());
    let fired = 0;
    b.schedule(() => fired++);
    const waiting = b.wait();
    b.stop();
    expect(await waiting).toBe(false);
    clock.advance(60_000);
    expect(fired).toBe(0);
    expect(clock.pending).toBe(0);
    expect(b.schedule(() => fired++)).toBeUndefined();
    expect(await b.wait()).toBe(false);
    expect(b.attempts).toBe(2); // the two scheduled before stop(); the refused ones do not advance the sequence
    expect(b.isStopped).toBe(true);
    b.resume();
    const again = b.wait();
    clock.fireNext();
    expect(await again).toBe(true);
  });

  it('wait() answers true after the delay', async () => {
    const clock = new ManualClock();
    const b = new Backoff({ firstMs: 100, maxMs: 5000, jitter: 'none' }, clock.deps());
    const w = b.wait();
    clock.advance(99);
    let settled = false;
    void w.then(() => (settled = true));
    await Promise.resolve();
    expect(settled).toBe(false);
    clock.advance(1);
    expect(await w).toBe(true);
  });

  it('refuses a policy it cannot follow', () => {
    for (const p of [
      { firstMs: 0, maxMs: 10 },
      { firstMs: 10, maxMs: 5 },
      { firstMs: 10, maxMs: Number.POSITIVE_INFINITY },
      { firstMs: Number.NaN, maxMs: 10 },
      { firstMs: 10, maxMs: 20, resetAfterMs: -1 },
    ]) {
      let err: unknown;
      try {
        new Backoff({ ...p, jitter: 'none' });
      } catch (e) {
        err = e;
      }
      expect(isGatewayError(err) && err.code).toBe('GW_ERR_INTERNAL');
    }
  });
});
