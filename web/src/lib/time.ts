/** Times as the page shows them: UTC for maintenance windows (they are defined in UTC), relative for expiries. */

export const WEEKDAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'] as const;
export type Weekday = (typeof WEEKDAYS)[number];

const HOUR = 3600_000;
const DAY = 24 * HOUR;

function pad(n: number): string {
  return String(n).padStart(2, '0');
}

/** "in 3 h 5 min", "2 min ago", "now": for expiries and windows. */
export function relative(target: number, now: number): string {
  const diff = target - now;
  const abs = Math.abs(diff);
  if (abs < 60_000) return 'now';
  const d = Math.floor(abs / DAY);
  const h = Math.floor((abs % DAY) / HOUR);
  const m = Math.floor((abs % HOUR) / 60_000);
  const parts = d > 0 ? [`${d} d`, h > 0 ? `${h} h` : ''] : h > 0 ? [`${h} h`, m > 0 ? `${m} min` : ''] : [`${m} min`];
  const text = parts.filter(Boolean).join(' ');
  return diff > 0 ? `in ${text}` : `${text} ago`;
}

/** "Tue 2026-11-24 03:00 UTC" (with seconds: "03:00:07"). Invalid input gives "—". */
export function utcStamp(time: string | number, options: { seconds?: boolean } = {}): string {
  const ms = typeof time === 'number' ? time : Date.parse(time);
  if (!Number.isFinite(ms)) return '—';
  const d = new Date(ms);
  const secs = options.seconds ? `:${pad(d.getUTCSeconds())}` : '';
  return `${WEEKDAYS[d.getUTCDay()]} ${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}${secs} UTC`;
}

/** A window {start, end} as "Tue 2026-11-24 03:00–04:00 UTC (in 5 h)"; null or invalid gives "none". */
export function formatWindow(window: { start: string; end: string } | null | undefined, now: number): string {
  if (!window) return 'none';
  const start = Date.parse(window.start);
  const end = Date.parse(window.end);
  if (!Number.isFinite(start) || !Number.isFinite(end) || end < start) return 'none';
  const endDate = new Date(end);
  const sameDay = end - start < DAY && new Date(start).getUTCDate() === endDate.getUTCDate();
  const endText = sameDay ? `${pad(endDate.getUTCHours())}:${pad(endDate.getUTCMinutes())} UTC` : utcStamp(end);
  const when = start <= now && now < end ? 'open now' : relative(start, now);
  return `${utcStamp(start).replace(/ UTC$/, '')}–${endText} (${when})`;
}

/**
 * The next one-hour window of a weekly schedule (weekdays, UTC start hour) that has not ended at now: the one
 * open now if any. Undefined when no weekday is chosen or the hour is out of range.
 */
export function nextWindow(weekdays: readonly string[], hour: number, now: number): { start: number; end: number } | undefined {
  if (!Number.isInteger(hour) || hour < 0 || hour > 23) return undefined;
  const days = new Set(weekdays.map((d) => WEEKDAYS.indexOf(d as Weekday)).filter((i) => i >= 0));
  if (days.size === 0) return undefined;
  const today = new Date(now);
  const midnight = Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate());
  for (let i = 0; i <= 7; i++) {
    const start = midnight + i * DAY + hour * HOUR;
    if (days.has(new Date(start).getUTCDay()) && start + HOUR > now) return { start, end: start + HOUR };
  }
  return undefined;
}

/** Token lifetimes offered by the create form, with the label shown. */
export const TOKEN_TTLS: ReadonlyArray<{ label: string; ms: number }> = [
  { label: '15 minutes', ms: 15 * 60_000 },
  { label: '1 hour', ms: HOUR },
  { label: '4 hours', ms: 4 * HOUR },
  { label: '24 hours', ms: DAY },
];
