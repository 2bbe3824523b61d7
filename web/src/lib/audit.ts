/** One audit event as a table row: its name, time, who did it, and the other fields as key=value text. */
import type { Filterable } from './filter.js';

export interface EventSummary extends Filterable {
  time: string;
  by: string;
  details: string;
}

const MAX_DETAILS = 400;

function flat(value: unknown, depth = 0): string {
  if (value === null || value === undefined) return '';
  if (typeof value !== 'object') return String(value);
  if (depth >= 2) return '…';
  if (Array.isArray(value)) return value.map((v) => flat(v, depth + 1)).join(',');
  return Object.entries(value as Record<string, unknown>).map(([k, v]) => `${k}:${flat(v, depth + 1)}`).join(' ');
}

export function eventSummary(row: { name: string; event: Record<string, unknown> }): EventSummary {
  const { event: name, time, by, reported_by: reportedBy, ...rest } = row.event ?? {};
  const who = by as { kind?: string; name?: string } | undefined;
  const reporter = reportedBy as { nodename?: string } | undefined;
  const user = typeof rest.user === 'string' ? rest.user : '';
  const byText = who?.name
    ? `${who.name}${who.kind && who.kind !== 'user' && who.kind !== who.name ? ` (${who.kind})` : ''}`
    : reporter?.nodename
      ? `${user}${user ? ' on ' : ''}${reporter.nodename}`
      : user;
  const details = Object.entries(rest).map(([k, v]) => `${k}=${flat(v)}`).join(' ');
  return {
    name: typeof name === 'string' ? name : '(unnamed)',
    time: typeof time === 'string' ? time : '',
    by: byText,
    details: details.length > MAX_DETAILS ? `${details.slice(0, MAX_DETAILS)}…` : details,
    text: [byText, details],
  };
}
