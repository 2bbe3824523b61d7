/** The attempt limiter on its own, with a fake clock: reservations count at once, success releases. */
import { describe, expect, it } from 'vitest';
import { AttemptLimiter, joinKey, loginKey } from '../../src/auth/ratelimit.js';

function limiter(max = 3, windowMs = 60_000) {
  let now = 1_000_000;
  const l = new AttemptLimiter({ maxFailures: max, windowMs, clock: () => now });
  return { l, advance: (ms: number) => (now += ms) };
}

describe('AttemptLimiter', () => {
  it('counts an attempt from the moment it is reserved: the (max+1)th concurrent attempt is refused', () => {
    const { l } = limiter(3);
    const taken = [l.reserve('k'), l.reserve('k'), l.reserve('k')];
    expect(taken.every((r) => r.ok)).toBe(true);
    const fourth = l.reserve('k');
    // Only attempts in flight, none failed: they settle within moments, so "try again in a second", not a window.
    expect(fourth).toEqual({ ok: false, retryAfterMs: 1000, inFlight: true });
    // Other keys are not affected.
    expect(l.reserve('other').ok).toBe(true);
  });

  it('failures stay for the window; then the key is free again', () => {
    const { l, advance } = limiter(3, 60_000);
    for (let i = 0; i < 3; i++) {
      const r = l.reserve('k');
      if (!r.ok) throw new Error('refused too early');
      r.reservation.fail();
    }
    const refused = l.reserve('k');
    expect(refused.ok).toBe(false);
    if (!refused.ok) expect(refused.retryAfterMs).toBeGreaterThan(59_000);
    advance(59_000);
    expect(l.reserve('k').ok).toBe(false);
    advance(1_001);
    expect(l.reserve('k').ok).toBe(true);
  });

  it('success releases its slot and forgives settled failures, but not attempts still running', () => {
    const { l } = limiter(3);
    const a = l.reserve('k');
    const b = l.reserve('k');
    if (!a.ok || !b.ok) throw new Error('refused');
    a.reservation.fail();
    const c = l.reserve('k');
    if (!c.ok) throw new Error('refused');
    c.reservation.succeed(); // forgives a's failure, releases c; b still runs
    const d = l.reserve('k');
    const e = l.reserve('k');
    expect([d.ok, e.ok]).toEqual([true, true]);
    expect(l.reserve('k').ok).toBe(false); // b, d, e
  });

  it('release gives the slot back without forgiving failures; settling twice does nothing more', () => {
    const { l } = limiter(2);
    const a = l.reserve('k');
    if (!a.ok) throw new Error('refused');
    a.reservation.fail();
    const b = l.reserve('k');
    if (!b.ok) throw new Error('refused');
    b.reservation.release();
    b.reservation.succeed();
    a.reservation.succeed();
    const c = l.reserve('k');
    expect(c.ok).toBe(true);
    expect(l.reserve('k').ok).toBe(false); // a's failure and c
  });

  it('keeps at most maxKeys keys (oldest evicted first)', () => {
    const l = new AttemptLimiter({ maxFailures: 1, maxKeys: 2, clock: () => 0 });
    for (const k of ['a', 'b', 'c']) {
      const r = l.reserve(k);
      if (r.ok) r.reservation.fail();
    }
    expect(l.reserve('a').ok).toBe(true); // evicted
    expect(l.reserve('c').ok).toBe(false);
  });
});

describe('rate-limit keys', () => {
  it('count an IPv6 address by its /64, as connection caps do; IPv4 (mapped or not) by the address', () => {
    expect(joinKey('2001:db8:1:2::1')).toBe(joinKey('2001:db8:1:2:ffff::99'));
    expect(joinKey('2001:db8:1:2::1')).not.toBe(joinKey('2001:db8:1:3::1'));
    expect(loginKey('alice', '2001:db8::1')).toBe(loginKey('alice', '2001:db8::abcd'));
    expect(loginKey('alice', '::ffff:192.0.2.1')).toBe(loginKey('alice', '192.0.2.1'));
    expect(loginKey('alice', '192.0.2.1')).not.toBe(loginKey('alice', '192.0.2.2'));
    expect(loginKey('alice', '192.0.2.1')).not.toBe(loginKey('bob', '192.0.2.1'));
  });
});
