/**
 * One audit event as a table row: its name, time, who did it, what resource (a database with its protocol and
 * user@name, a node as login@node, an app, a desktop, a Kubernetes cluster), the bytes and the duration of a session
 * that ended, and the other fields as key=value text. The same columns as `gwctl get events --format table`
 * (src/cli/events.ts).
 */
// The one formatting of sizes and durations, shared with gwctl (src/format.ts: pure, no Node imports).
import { formatBytes, formatMs } from '../../../src/format.js';
import type { Filterable } from './filter.js';

export interface EventSummary extends Filterable {
  time: string;
  by: string;
  resource: string;
  /** "in / out" of a session that ended, e.g. "1.2 kB / 5.6 MB"; empty for other events. */
  bytes: string;
  /** A session end's duration, e.g. "4m05s"; empty for other events. */
  duration: string;
  details: string;
}

/** The fields shown in their own columns, left out of the details. */
const COLUMNS = new Set(['resource', 'resources', 'protocol', 'db_user', 'db_name', 'login', 'node', 'bytes_in', 'bytes_out', 'duration_ms', 'start']);

const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined);
const str = (v: unknown): string | undefined => (typeof v === 'string' && v !== '' ? v : undefined);

/** What the event is about: "pg (postgres, orders@shop)", "root@web-1", "grafana", several coalesced ones. */
export function eventResource(e: Record<string, unknown>): string {
  if (Array.isArray(e.resources)) return e.resources.map(String).join(', ');
  const resource = str(e.resource) ?? str(e.app);
  if (resource && str(e.protocol)) {
    const who = str(e.db_user) ? `, ${String(e.db_user)}${str(e.db_name) ? `@${String(e.db_name)}` : ''}` : '';
    return `${resource} (${String(e.protocol)}${who})`;
  }
  if (resource) return resource;
  if (str(e.login) && str(e.node)) return `${String(e.login)}@${String(e.node)}`;
  return str(e.node) ?? '';
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
  const details = Object.entries(rest).filter(([k]) => !COLUMNS.has(k)).map(([k, v]) => `${k}=${flat(v)}`).join(' ');
  const resource = eventResource(rest);
  const bytesIn = num(rest.bytes_in);
  const bytesOut = num(rest.bytes_out);
  const duration = num(rest.duration_ms);
  return {
    name: typeof name === 'string' ? name : '(unnamed)',
    time: typeof time === 'string' ? time : '',
    by: byText,
    resource,
    bytes: bytesIn !== undefined || bytesOut !== undefined ? `${formatBytes(bytesIn ?? 0, ' ')} / ${formatBytes(bytesOut ?? 0, ' ')}` : '',
    duration: duration !== undefined ? formatMs(duration) : '',
    details: details.length > MAX_DETAILS ? `${details.slice(0, MAX_DETAILS)}…` : details,
    text: [byText, resource, details],
  };
}
