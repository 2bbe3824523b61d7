/** Maintenance windows: a pure function of the configuration and a start instant (table and property tests). */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isGatewayError } from '../../src/errors.js';
import { formatIn, inWindow, nextWindowAfter, nextWindows, weekdayNumbers, windowAt, type Window } from '../../src/upgrade/windows.js';

const iso = (w: Window[]) => w.map((x) => `${x.start.toISOString()}/${x.stop.toISOString()}`);
const D = (s: string) => new Date(s);

describe('nextWindows', () => {
  const cases: Array<{ name: string; hour: number; weekdays: string[]; from: string; count: number; want: string[] }> = [
    {
      name: 'every day ("*") from just before the hour',
      hour: 2, weekdays: ['*'], from: '2026-03-10T01:59:59Z', count: 2,
      want: ['2026-03-10T02:00:00.000Z/2026-03-10T03:00:00.000Z', '2026-03-11T02:00:00.000Z/2026-03-11T03:00:00.000Z'],
    },
    {
      name: '"*" is every day; a window open at from comes first',
      hour: 2, weekdays: ['*'], from: '2026-03-10T02:30:00Z', count: 2,
      want: ['2026-03-10T02:00:00.000Z/2026-03-10T03:00:00.000Z', '2026-03-11T02:00:00.000Z/2026-03-11T03:00:00.000Z'],
    },
    {
      name: 'a window that just ended is not next (stop is exclusive)',
      hour: 2, weekdays: ['*'], from: '2026-03-10T03:00:00Z', count: 1,
      want: ['2026-03-11T02:00:00.000Z/2026-03-11T03:00:00.000Z'],
    },
    {
      name: 'start is inclusive',
      hour: 2, weekdays: ['*'], from: '2026-03-10T02:00:00Z', count: 1,
      want: ['2026-03-10T02:00:00.000Z/2026-03-10T03:00:00.000Z'],
    },
    {
      name: 'month end (30-day month)',
      hour: 23, weekdays: ['Thu', 'Fri'], from: '2026-04-30T23:30:00Z', count: 3,
      want: ['2026-04-30T23:00:00.000Z/2026-05-01T00:00:00.000Z', '2026-05-01T23:00:00.000Z/2026-05-02T00:00:00.000Z', '2026-05-07T23:00:00.000Z/2026-05-08T00:00:00.000Z'],
    },
    {
      name: 'year end: the window at 23:00 on Dec 31 stops at midnight of the new year',
      hour: 23, weekdays: ['Thursday'], from: '2026-12-25T00:00:00Z', count: 2,
      want: ['2026-12-31T23:00:00.000Z/2027-01-01T00:00:00.000Z', '2027-01-07T23:00:00.000Z/2027-01-08T00:00:00.000Z'],
    },
    {
      name: 'leap day 2028 (a Tuesday)',
      hour: 0, weekdays: ['Tue'], from: '2028-02-28T12:00:00Z', count: 2,
      want: ['2028-02-29T00:00:00.000Z/2028-02-29T01:00:00.000Z', '2028-03-07T00:00:00.000Z/2028-03-07T01:00:00.000Z'],
    },
    {
      name: 'no leap day in 2027: Feb 28 then Mar 1',
      hour: 12, weekdays: ['*'], from: '2027-02-28T13:00:00Z', count: 1,
      want: ['2027-03-01T12:00:00.000Z/2027-03-01T13:00:00.000Z'],
    },
    {
      name: 'DST changes are irrelevant: the EU switch night (2026-03-29) is a plain UTC hour',
      hour: 1, weekdays: ['Sun'], from: '2026-03-28T00:00:00Z', count: 1,
      want: ['2026-03-29T01:00:00.000Z/2026-03-29T02:00:00.000Z'],
    },
    {
      name: 'weekday names in any case, long or short, and duplicates',
      hour: 6, weekdays: ['MONDAY', 'mon', 'Wed'], from: '2026-01-01T00:00:00Z', count: 3,
      want: ['2026-01-05T06:00:00.000Z/2026-01-05T07:00:00.000Z', '2026-01-07T06:00:00.000Z/2026-01-07T07:00:00.000Z', '2026-01-12T06:00:00.000Z/2026-01-12T07:00:00.000Z'],
    },
    {
      name: 'the weekday is the UTC one, even when from is late on the previous day elsewhere',
      hour: 0, weekdays: ['Sat'], from: '2026-01-02T23:59:00Z', count: 1,
      want: ['2026-01-03T00:00:00.000Z/2026-01-03T01:00:00.000Z'],
    },
  ];
  it.each(cases)('$name', ({ hour, weekdays, from, count, want }) => {
    expect(iso(nextWindows({ utc_start_hour: hour, weekdays }, D(from), count))).toEqual(want);
  });

  it('takes the resource itself', () => {
    const config = { spec: { agent_upgrades: { utc_start_hour: 3, weekdays: ['Mon' as const] } } };
    expect(iso(nextWindows(config, D('2026-01-01T00:00:00Z'), 1))).toEqual(['2026-01-05T03:00:00.000Z/2026-01-05T04:00:00.000Z']);
  });

  it('refuses an hour outside 0..23 or a day it does not know', () => {
    for (const hour of [-1, 24, 1.5, Number.NaN]) {
      let err: unknown;
      try {
        nextWindows({ utc_start_hour: hour, weekdays: ['*'] }, new Date(), 1);
      } catch (e) {
        err = e;
      }
      expect(isGatewayError(err, 'GW_ERR_CONFIG_VALUE')).toBe(true);
    }
    expect(() => weekdayNumbers(['Funday'])).toThrow(/Funday/);
  });

  it('refuses an empty weekdays list, as the resource validator does ("*" is every day)', () => {
    let err: unknown;
    try {
      nextWindows({ utc_start_hour: 2, weekdays: [] }, new Date(), 1);
    } catch (e) {
      err = e;
    }
    expect(isGatewayError(err, 'GW_ERR_CONFIG_VALUE')).toBe(true);
    expect((err as Error & { hint: string }).hint).toContain('"*"');
  });

  it('count 0 gives nothing', () => {
    expect(nextWindows({ utc_start_hour: 1, weekdays: ['*'] }, new Date(), 0)).toEqual([]);
  });

  it('properties: sorted, one hour long, at the hour, on an allowed day, ending after from, nothing skipped', () => {
    const days = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 23 }),
        fc.subarray(days, { minLength: 1 }),
        fc.date({ min: D('1990-01-01T00:00:00Z'), max: D('2200-01-01T00:00:00Z'), noInvalidDate: true }),
        fc.integer({ min: 1, max: 20 }),
        (hour, weekdays, from, count) => {
          const ws = nextWindows({ utc_start_hour: hour, weekdays }, from, count);
          expect(ws).toHaveLength(count);
          const allowed = weekdays;
          for (let i = 0; i < ws.length; i++) {
            const w = ws[i]!;
            expect(w.stop.getTime() - w.start.getTime()).toBe(3_600_000);
            expect(w.start.getUTCHours()).toBe(hour);
            expect(w.start.getUTCMinutes() + w.start.getUTCSeconds() + w.start.getUTCMilliseconds()).toBe(0);
            expect(allowed).toContain(days[w.start.getUTCDay()]);
            expect(w.stop.getTime()).toBeGreaterThan(from.getTime());
            if (i > 0) {
              const gapDays = (w.start.getTime() - ws[i - 1]!.start.getTime()) / 86_400_000;
              expect(gapDays).toBeGreaterThanOrEqual(1);
              expect(gapDays).toBeLessThanOrEqual(7);
            }
          }
          // Nothing skipped before the first: the window one allowed-day step earlier ended by `from`.
          const first = ws[0]!;
          expect(first.start.getTime() - from.getTime()).toBeLessThanOrEqual(7 * 86_400_000);
          // The first of the following computation from the first window's stop is the second window.
          if (count > 1) expect(nextWindows({ utc_start_hour: hour, weekdays }, first.stop, 1)[0]).toEqual(ws[1]);
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe('inWindow, windowAt, nextWindowAfter', () => {
  const ws: Window[] = [
    { start: D('2026-01-05T02:00:00Z'), stop: D('2026-01-05T03:00:00Z') },
    { start: D('2026-01-06T02:00:00Z'), stop: D('2026-01-06T03:00:00Z') },
  ];
  it.each([
    ['2026-01-05T01:59:59.999Z', false],
    ['2026-01-05T02:00:00Z', true],
    ['2026-01-05T02:59:59.999Z', true],
    ['2026-01-05T03:00:00Z', false],
    ['2026-01-06T02:30:00Z', true],
  ])('%s inside: %s', (t, want) => {
    expect(inWindow(D(t), ws)).toBe(want);
    expect(windowAt(D(t), ws) !== undefined).toBe(want);
  });
  it('the next window starts strictly after now', () => {
    expect(nextWindowAfter(D('2026-01-05T02:30:00Z'), ws)).toBe(ws[1]);
    expect(nextWindowAfter(D('2026-01-04T00:00:00Z'), ws)).toBe(ws[0]);
    expect(nextWindowAfter(D('2026-01-07T00:00:00Z'), ws)).toBeUndefined();
    expect(inWindow(new Date(), [])).toBe(false);
  });
  it('formatIn', () => {
    expect(formatIn(45 * 60_000)).toBe('in 45m');
    expect(formatIn((3 * 60 + 12) * 60_000 + 59_000)).toBe('in 3h 12m');
    expect(formatIn((2 * 24 + 4) * 3_600_000)).toBe('in 2d 4h');
    expect(formatIn(-5)).toBe('in 0m');
  });
});
