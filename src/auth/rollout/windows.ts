/**
 * A rollout group's windows in its own time zone, pure: a group opens on its days at start_hour local time and
 * stays open for the window's duration. Local time is Intl's reading of the IANA zone, so daylight saving time is
 * the zone's own: on the night the clocks go forward, a start hour that does not exist that day (02:00 in
 * Europe/Paris at the end of March) opens at the first local time after it (03:00); on the night they go back, an
 * hour that happens twice (02:00 at the end of October) opens once, the first time.
 *
 * Written by hand rather than with a date library: none is a dependency, and the one rule needed (the first
 * instant on a 15-minute grid whose local time reaches start_hour on an allowed day) is a short walk over at most
 * eight days with one cached Intl formatter per zone. Every offset in use today is a multiple of 15 minutes.
 */
import type { Weekday } from '../resources/index.js';

const STEP_MS = 15 * 60_000;
/** Eight days of steps: every weekly window appears in any span this long. */
const MAX_STEPS = (8 * 24 * 3600_000) / STEP_MS;

const formatters = new Map<string, Intl.DateTimeFormat>();

function formatter(zone: string): Intl.DateTimeFormat {
  let f = formatters.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', { timeZone: zone, weekday: 'short', year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
    formatters.set(zone, f);
  }
  return f;
}

/** An instant's local reading in zone: its date (YYYY-MM-DD), weekday and minutes since local midnight. */
export function localTime(ms: number, zone: string): { date: string; weekday: Weekday; minutes: number } {
  const parts = Object.fromEntries(formatter(zone).formatToParts(new Date(ms)).map((p) => [p.type, p.value]));
  return { date: `${parts.year}-${parts.month}-${parts.day}`, weekday: parts.weekday as Weekday, minutes: Number(parts.hour) * 60 + Number(parts.minute) };
}

export interface WindowRule {
  days: readonly Weekday[];
  start_hour: number;
  time_zone: string;
}

/**
 * Answers by rule and grid instant: the controller asks again at every step (every few seconds, and after each
 * presence change) for the same quarter of an hour, and a walk is up to 768 Intl readings. Bounded; cleared whole.
 */
const answers = new Map<string, number | undefined>();
const MAX_ANSWERS = 1024;

/** The first window start at or after fromMs (on the 15-minute grid); undefined when the days list none. */
export function nextWindowStart(rule: WindowRule, fromMs: number): number | undefined {
  const start = Math.ceil(fromMs / STEP_MS) * STEP_MS;
  const key = `${rule.time_zone}|${rule.start_hour}|${rule.days.join(',')}|${start}`;
  if (answers.has(key)) return answers.get(key);
  if (answers.size >= MAX_ANSWERS) answers.clear();
  const found = walk(rule, start);
  answers.set(key, found);
  return found;
}

function walk(rule: WindowRule, start: number): number | undefined {
  if (rule.days.length === 0) return undefined;
  const target = rule.start_hour * 60;
  let t = start;
  let before = localTime(t - STEP_MS, rule.time_zone);
  for (let i = 0; i <= MAX_STEPS; i++, t += STEP_MS) {
    const now = localTime(t, rule.time_zone);
    const crossed = now.minutes >= target && (before.date !== now.date || before.minutes < target);
    if (crossed && rule.days.includes(now.weekday)) return t;
    before = now;
  }
  return undefined;
}

/**
 * When a group may start: the first moment at or after earliestMs that is inside one of its windows (a window
 * already open at earliestMs counts: it starts at once). Windows skipped (immediate, critical): earliestMs.
 */
export function startAt(rule: WindowRule, earliestMs: number, durationMs: number, skipWindows: boolean): number | undefined {
  if (skipWindows) return earliestMs;
  const open = nextWindowStart(rule, earliestMs - durationMs + 1);
  if (open === undefined) return undefined;
  return Math.max(open, earliestMs);
}

/** The window open at nowMs, as [start, end), or undefined when none is. */
export function windowAt(rule: WindowRule, nowMs: number, durationMs: number): { start: number; end: number } | undefined {
  const open = nextWindowStart(rule, nowMs - durationMs + 1);
  return open !== undefined && open <= nowMs ? { start: open, end: open + durationMs } : undefined;
}
