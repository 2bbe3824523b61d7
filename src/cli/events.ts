/**
 * `gwctl get events -f text`: the audit log as one row per event, with who, what resource, from where, the
 * bytes and the duration of sessions that ended. The Web UI's audit page (web/src/lib/audit.ts) shows the same
 * columns. Every cell is the event's own text with control characters replaced, so that an agent's event cannot
 * move the terminal's cursor or repaint the lines above.
 */
import { formatBytes, formatMs } from '../format.js';
import { table } from './table.js';

export const EVENT_COLUMNS = ['TIME', 'EVENT', 'USER', 'RESOURCE', 'CLIENT', 'BYTES IN/OUT', 'DURATION', 'NOTE'] as const;

const MAX_CELL = 120;

/** A cell: a string with no control characters, at most MAX_CELL characters. */
function cell(value: unknown): string {
  if (value === undefined || value === null) return '';
  // eslint-disable-next-line no-control-regex
  const text = (typeof value === 'string' ? value : JSON.stringify(value)).replace(/[\u0000-\u001f\u007f-\u009f]/g, '?');
  return text.length > MAX_CELL ? `${text.slice(0, MAX_CELL - 1)}…` : text;
}

const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined);
const str = (v: unknown): string | undefined => (typeof v === 'string' && v !== '' ? v : undefined);

/** What the event is about: a database with its protocol and user@name, a node as login@node, an app, a cluster. */
export function eventResource(e: Record<string, unknown>): string {
  if (Array.isArray(e.resources)) return e.resources.map(String).join(',');
  const resource = str(e.resource) ?? str(e.app);
  if (resource && str(e.protocol)) {
    const who = str(e.db_user) ? `, ${String(e.db_user)}${str(e.db_name) ? `@${String(e.db_name)}` : ''}` : '';
    return `${resource} (${String(e.protocol)}${who})`;
  }
  if (resource) return resource;
  if (str(e.login) && str(e.node)) return `${String(e.login)}@${String(e.node)}`;
  return str(e.node) ?? '';
}

/** One row of EVENT_COLUMNS. */
export function eventRow(e: Record<string, unknown>): string[] {
  const by = e.by as { name?: unknown } | undefined;
  const bytesIn = num(e.bytes_in);
  const bytesOut = num(e.bytes_out);
  const duration = num(e.duration_ms);
  const notes = [
    num(e.coalesced) !== undefined ? `${String(e.coalesced)} sessions coalesced${num(e.errors) ? ` (${String(e.errors)} broken)` : ''}` : undefined,
    str(e.error) ? `error: ${String(e.error)}` : undefined,
    num(e.exit_code) !== undefined ? `exit ${String(e.exit_code)}` : undefined,
  ].filter((n): n is string => n !== undefined);
  return [
    e.time,
    e.event,
    str(e.user) ?? by?.name,
    eventResource(e),
    e.client ?? e.source,
    bytesIn !== undefined || bytesOut !== undefined ? `${formatBytes(bytesIn ?? 0)}/${formatBytes(bytesOut ?? 0)}` : '',
    duration !== undefined ? formatMs(duration) : '',
    notes.join('; '),
  ].map(cell);
}

/** The table of events (oldest first, as `gwctl get events` lists them). */
export function eventTable(events: readonly Record<string, unknown>[]): string {
  return table([[...EVENT_COLUMNS], ...events.map(eventRow)]);
}
