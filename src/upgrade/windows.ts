/**
 * Maintenance windows: one hour from `utc_start_hour` UTC
 * on each of the `weekdays`; every day with `*`. An empty list is refused, as the resource validator refuses it. Pure functions on UTC instants only, so
 * month ends, year ends, leap days and daylight-saving changes need no special case: a day is always
 * Date.UTC(y, m, d + i), which normalises itself across months and years.
 */
import type { AgentUpgrades, ClusterMaintenanceConfig } from '../auth/resources/types.js';
import { WEEKDAYS } from '../auth/resources/types.js';
import { GatewayError } from '../errors.js';

/** A window [start, stop): upgrades may start at or after `start` and before `stop`. */
export interface Window {
  start: Date;
  stop: Date;
}

/** The one-hour length of every window. */
export const WINDOW_LENGTH_MS = 60 * 60 * 1000;

/** What the windows are computed from: the resource, or its spec.agent_upgrades (weekdays in any accepted spelling). */
export type MaintenanceInput =
  | Pick<ClusterMaintenanceConfig, 'spec'>
  | AgentUpgrades
  | { utc_start_hour: number; weekdays: readonly string[] };

const LONG_NAMES = ['sunday', 'monday', 'tuesday', 'wednesday', 'thursday', 'friday', 'saturday'];

/**
 * Weekday names → the set of UTC day numbers (0 = Sunday). Short or long names, any case; `*` means every day.
 * Throws GW_ERR_CONFIG_VALUE for an empty list and for anything else.
 */
export function weekdayNumbers(weekdays: readonly string[]): Set<number> {
  const days = new Set<number>();
  if (weekdays.length === 0) {
    throw new GatewayError('GW_ERR_CONFIG_VALUE', 'cluster_maintenance_config: weekdays lists no day', {
      hint: 'List the days on which upgrades may run, or write ["*"] for every day.',
    });
  }
  for (const raw of weekdays) {
    const name = raw.trim().toLowerCase();
    if (name === '*') return new Set([0, 1, 2, 3, 4, 5, 6]);
    let n = WEEKDAYS.findIndex((d) => d.toLowerCase() === name);
    if (n < 0) n = LONG_NAMES.indexOf(name);
    if (n < 0) {
      throw new GatewayError('GW_ERR_CONFIG_VALUE', `cluster_maintenance_config: ${JSON.stringify(raw)} is not a weekday`, {
        hint: 'Use Sun, Mon, Tue, Wed, Thu, Fri, Sat (or their long names), or "*" for every day.',
      });
    }
    days.add(n);
  }
  return days;
}

function agentUpgradesOf(input: MaintenanceInput): { utc_start_hour: number; weekdays: readonly string[] } {
  return 'spec' in input ? input.spec.agent_upgrades : input;
}

/**
 * The next `count` windows that end after `from`, in time order. A window open at `from` is the first one.
 * Throws GW_ERR_CONFIG_VALUE when utc_start_hour is not an integer 0..23 or a weekday is unknown.
 */
export function nextWindows(input: MaintenanceInput, from: Date, count: number): Window[] {
  const { utc_start_hour: hour, weekdays } = agentUpgradesOf(input);
  if (!Number.isInteger(hour) || hour < 0 || hour > 23) {
    throw new GatewayError('GW_ERR_CONFIG_VALUE', `cluster_maintenance_config: utc_start_hour must be an integer from 0 to 23, got ${String(hour)}`, {
      hint: 'Set spec.agent_upgrades.utc_start_hour to the hour (UTC) at which the one-hour window opens.',
    });
  }
  const days = weekdayNumbers(weekdays);
  const t = from.getTime();
  if (!Number.isFinite(t)) throw new GatewayError('GW_ERR_INTERNAL', 'nextWindows: invalid start date');
  const out: Window[] = [];
  if (count <= 0) return out;
  // A window of an earlier UTC day ends at most at midnight of `from`'s day, so the day of `from` is the first
  // that can hold a window ending after `from`.
  const y = from.getUTCFullYear();
  const m = from.getUTCMonth();
  const d = from.getUTCDate();
  for (let i = 0; out.length < count; i++) {
    const start = Date.UTC(y, m, d + i, hour);
    if (!days.has(new Date(start).getUTCDay())) continue;
    const stop = start + WINDOW_LENGTH_MS;
    if (stop <= t) continue;
    out.push({ start: new Date(start), stop: new Date(stop) });
  }
  return out;
}

/** The window that contains `now` ([start, stop)), or undefined. */
export function windowAt(now: Date, windows: readonly Window[]): Window | undefined {
  const t = now.getTime();
  return windows.find((w) => w.start.getTime() <= t && t < w.stop.getTime());
}

/** Whether `now` lies inside one of the windows ([start, stop)). */
export function inWindow(now: Date, windows: readonly Window[]): boolean {
  return windowAt(now, windows) !== undefined;
}

/** The first window that starts after `now`, or undefined. */
export function nextWindowAfter(now: Date, windows: readonly Window[]): Window | undefined {
  const t = now.getTime();
  return [...windows].sort((a, b) => a.start.getTime() - b.start.getTime()).find((w) => w.start.getTime() > t);
}

/** "in 3h 12m", "in 45m", "in 2d 4h" for a duration in ms (rounded down to minutes, at least "in 0m"). */
export function formatIn(ms: number): string {
  const minutes = Math.max(0, Math.floor(ms / 60_000));
  const days = Math.floor(minutes / (24 * 60));
  const hours = Math.floor((minutes % (24 * 60)) / 60);
  const mins = minutes % 60;
  if (days > 0) return `in ${days}d ${hours}h`;
  if (hours > 0) return `in ${hours}h ${mins}m`;
  return `in ${mins}m`;
}

/** ISO form without milliseconds: 2026-01-05T02:00:00Z. */
export function isoSeconds(d: Date): string {
  return d.toISOString().replace(/\.\d{3}Z$/, 'Z');
}
