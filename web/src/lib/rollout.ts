/**
 * The managed rollout as the agents page shows it (docs/upgrades.md, "The Web UI"): pure, from a RolloutStatus and
 * the page's clock. What must be seen at a glance comes first (a rollback in progress, a halted group, a suspended
 * rollout), then one row per group: its state and why, its next start in its own time zone, its canaries, its
 * agents counted by version, and the agents whose upgrader has gone quiet.
 *
 * The status comes from the server and is shown, never trusted to be well formed: unknown states fall back to a
 * neutral badge, an unknown time zone is said so and the time shown in UTC, and every list and text is capped (a
 * fleet of thousands must not make the page grow without end).
 */
import type { CanaryState, RolloutGroup, RolloutGroupState, RolloutStatus } from '../types.js';
import { relative, utcStamp } from './time.js';

export type BadgeKind = 'ok' | 'warn' | 'bad' | 'neutral' | 'info';

/** At most this many canaries and stale agents listed per group ("and 12 more" after). */
export const MAX_LISTED = 20;
/** At most this many groups shown (a real rollout has a handful). */
export const MAX_GROUPS = 50;
/** Texts from the server (reasons, names) are cut to this many characters. */
export const MAX_TEXT = 300;

const GROUP_BADGES: Record<RolloutGroupState, BadgeKind> = { unstarted: 'neutral', canary: 'info', active: 'info', done: 'ok', halted: 'bad', rolledback: 'warn' };
const CANARY_BADGES: Record<CanaryState, BadgeKind> = { pending: 'neutral', upgrading: 'info', healthy: 'ok', failed: 'bad', rolledback: 'warn', gone: 'warn' };
const GROUP_WORDS: Record<RolloutGroupState, string> = { unstarted: 'not started', canary: 'canaries', active: 'upgrading', done: 'done', halted: 'halted', rolledback: 'rolled back' };

/** A text from the server, as a string and cut to MAX_TEXT. */
export function clip(value: unknown, max = MAX_TEXT): string {
  const s = typeof value === 'string' ? value : value === undefined || value === null ? '' : String(value);
  return s.length > max ? `${s.slice(0, max - 1)}…` : s;
}

const own = <T extends object>(table: T, key: unknown): key is keyof T => typeof key === 'string' && Object.prototype.hasOwnProperty.call(table, key);

export function groupBadge(state: unknown): { kind: BadgeKind; text: string } {
  return own(GROUP_BADGES, state) ? { kind: GROUP_BADGES[state], text: GROUP_WORDS[state] } : { kind: 'neutral', text: clip(state, 32) || 'unknown' };
}

export function canaryBadge(state: unknown): BadgeKind {
  return own(CANARY_BADGES, state) ? CANARY_BADGES[state] : 'neutral';
}

/**
 * An instant in a group's time zone: "Mon 02:00 Europe/Berlin (in 3 h)". An unknown or absent zone shows the
 * instant in UTC and says why; an invalid instant gives "—".
 */
export function inZone(iso: string | undefined, zone: string | undefined, now: number): string {
  const ms = iso === undefined ? NaN : Date.parse(iso);
  if (!Number.isFinite(ms)) return '—';
  const when = relative(ms, now);
  if (!zone) return `${utcStamp(ms)} (${when})`;
  let text: string;
  try {
    text = new Intl.DateTimeFormat('en-GB', { timeZone: zone, weekday: 'short', year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', hourCycle: 'h23' }).format(ms);
  } catch {
    return `${utcStamp(ms)} (${when}; unknown time zone ${clip(zone, 64)})`;
  }
  return `${text} ${clip(zone, 64)} (${when})`;
}

/** Versions by count, the most agents first, then by version text: [["17.0.1", 8], ["17.0.0", 4]]. */
export function versionCounts(versions: unknown): Array<[string, number]> {
  if (!versions || typeof versions !== 'object') return [];
  return Object.entries(versions as Record<string, unknown>)
    .filter((e): e is [string, number] => typeof e[1] === 'number' && Number.isFinite(e[1]) && e[1] >= 0)
    .map(([v, n]): [string, number] => [clip(v, 64), Math.floor(n)])
    .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
    .slice(0, MAX_LISTED);
}

/** A list capped at MAX_LISTED, and how many were left off. */
export function capped<T>(list: unknown): { shown: T[]; more: number } {
  const all = Array.isArray(list) ? (list as T[]) : [];
  return { shown: all.slice(0, MAX_LISTED), more: Math.max(0, all.length - MAX_LISTED) };
}

/** What must be seen first, most urgent first: a rollback, halted groups, a suspended or disabled rollout, stale agents. */
export function rolloutAlerts(status: RolloutStatus): Array<{ kind: 'warning' | 'info'; testid: string; text: string }> {
  const out: Array<{ kind: 'warning' | 'info'; testid: string; text: string }> = [];
  const groups = Array.isArray(status.groups) ? status.groups : [];
  if (status.rollback) {
    const scope = status.rollback.group ? `group ${clip(status.rollback.group, 64)}` : 'the whole fleet';
    const how = status.rollback.now ? 'at once (--now)' : 'through the windows and canaries';
    out.push({ kind: 'warning', testid: 'rollout-rollback', text: `Rollback in progress since ${utcStamp(status.rollback.since)}: ${scope} goes back to ${clip(status.start_version, 64) || 'the start version'} ${how}.` });
  }
  for (const g of groups.filter((x) => x.state === 'halted').slice(0, MAX_LISTED)) {
    out.push({ kind: 'warning', testid: `rollout-halted-${clip(g.name, 64)}`, text: `Group ${clip(g.name, 64)} halted: ${clip(g.reason)}` });
  }
  if (status.mode === 'suspended') out.push({ kind: 'info', testid: 'rollout-suspended', text: 'The rollout is suspended: no agent starts an upgrade until it is resumed (gwctl autoupdate resume).' });
  if (status.mode === 'disabled') out.push({ kind: 'info', testid: 'rollout-disabled', text: 'Automatic updates are disabled: no agent upgrades (autoupdate_config mode: disabled).' });
  const stale = groups.reduce((n, g) => n + (Array.isArray(g.stale) ? g.stale.length : 0), 0);
  if (stale > 0) out.push({ kind: 'warning', testid: 'rollout-stale', text: stale === 1 ? '1 agent has not run its upgrader for too long: it will not upgrade until the upgrader runs again.' : `${stale} agents have not run their upgrader for too long: they will not upgrade until it runs again.` });
  return out;
}

/** One line for the page's subtitle: "17.0.0 → 17.0.1, halt-on-error, 3 groups". */
export function rolloutSummary(status: RolloutStatus): string {
  const groups = Array.isArray(status.groups) ? status.groups.length : 0;
  const versions = status.target_version ? `${clip(status.start_version, 64) || '?'} → ${clip(status.target_version, 64)}` : 'no target version set: nothing upgrades';
  return [versions, status.strategy ? clip(status.strategy, 32) : '', `${groups} group${groups === 1 ? '' : 's'}`, status.ungrouped ? `${status.ungrouped} agents in no group` : ''].filter(Boolean).join(', ');
}

/** The groups to show, in the rollout's order, capped at MAX_GROUPS. */
export function shownGroups(status: RolloutStatus): RolloutGroup[] {
  return (Array.isArray(status.groups) ? status.groups : []).filter((g) => g && typeof g === 'object').slice(0, MAX_GROUPS);
}

/**
 * The agents page's subtitle while a managed rollout decides upgrades (managed, not disabled): the seed's one weekly
 * window then no longer does, and saying it would mislead. undefined when the channels decide (the page says their
 * window as before).
 */
export function rolloutSubtitle(status: RolloutStatus | undefined): string | undefined {
  if (!status || status.managed !== true || status.mode === 'disabled') return undefined;
  return 'Upgrades follow the managed rollout below, each group in its own window and time zone; the channels, targets and maintenance windows in the table do not apply.';
}
