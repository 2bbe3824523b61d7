/** The audit log, newest first, with a filter over the event's name, who did it and its fields. */
import { useState } from 'preact/hooks';
import { api } from '../api.js';
import { useLoad } from '../components/load.js';
import { Empty, ErrorBox, PageHeader, Spinner, TableBox } from '../components/ui.js';
import { filterItems } from '../lib/filter.js';
import { eventSummary } from '../lib/audit.js';
import { utcStamp } from '../lib/time.js';
import type { AuditRow } from '../types.js';
import { FilterBox, useUrlState } from './filterbox.js';

const LIMITS = [100, 200, 500] as const;

export function AuditPage() {
  const [limit, setLimit] = useState<number>(200);
  const { data, error, loading, reload } = useLoad(() => api.events(limit), [limit]);
  const [query, setQuery] = useUrlState('q');
  const events = data?.events ?? [];
  const rows = filterItems(events.map((e) => ({ e, ...eventSummary(e) })), query);
  return (
    <>
      <PageHeader title="Audit log" subtitle="What was done in the cluster, newest first (kept 30 days).">
        <select value={String(limit)} onChange={(e) => setLimit(Number(e.currentTarget.value))} data-testid="audit-limit" aria-label="How many events">
          {LIMITS.map((l) => <option key={l} value={String(l)}>last {l}</option>)}
        </select>
        <button type="button" class="btn" onClick={reload} data-testid="audit-refresh">Refresh</button>
      </PageHeader>
      <div class="card card-table">
        <div class="toolbar"><FilterBox value={query} onChange={setQuery} placeholder="Filter by event, user or field" /></div>
        <ErrorBox error={error} testid="audit-error" />
        {loading && !data ? <Spinner /> : null}
        {data && rows.length === 0 ? <Empty testid="audit-empty">{events.length === 0 ? 'No event recorded.' : 'No event matches the filter.'}</Empty> : null}
        {rows.length > 0 ? <AuditTable rows={rows.map((r) => r.e)} /> : null}
      </div>
    </>
  );
}

/** An event name that may break after each dot (session.command.start), never inside a word. */
function breakAfterDots(name: string) {
  return name.split('.').map((part, i, all) => (i < all.length - 1 ? [part, '.', <wbr key={i} />] : part));
}

function AuditTable({ rows }: { rows: AuditRow[] }) {
  return (
    <TableBox><table class="table table-dense">
      <thead><tr><th>Time (UTC)</th><th>Event</th><th>By</th><th>Resource</th><th class="wrap">Bytes in / out</th><th>Duration</th><th>Details</th></tr></thead>
      <tbody>
        {rows.map((r) => {
          const s = eventSummary(r);
          return (
            <tr key={r.name} data-testid={`audit-row-${r.name}`} data-event={s.name}>
              <td class="mono nowrap">{s.time ? utcStamp(s.time, { seconds: true }).replace(/ UTC$/, '') : ''}</td>
              <td class="mono strong" data-col="event">{breakAfterDots(s.name)}</td>
              <td data-col="by">{s.by}</td>
              <td data-col="resource">{s.resource}</td>
              <td class="mono nowrap" data-col="bytes">{s.bytes}</td>
              <td class="mono nowrap" data-col="duration">{s.duration}</td>
              <td class="mono small details">{s.details}</td>
            </tr>
          );
        })}
      </tbody>
    </table></TableBox>
  );
}
