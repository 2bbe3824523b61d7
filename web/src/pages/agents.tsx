/**
 * Every agent: online or not, its version against its upgrade channel's target, and its next maintenance window;
 * above them the managed rollout when there is one (rollout.tsx), and then the subtitle says that the rollout, not
 * the maintenance window, decides.
 */
import { api } from '../api.js';
import { useLoad } from '../components/load.js';
import { Badge, Empty, ErrorBox, PageHeader, Spinner, TableBox } from '../components/ui.js';
import { filterItems } from '../lib/filter.js';
import { formatWindow, relative, WEEKDAYS } from '../lib/time.js';
import type { AgentRow, Agents, CurrentSession } from '../types.js';
import { rolloutSubtitle } from '../lib/rollout.js';
import { FilterBox, useUrlState } from './filterbox.js';
import { RolloutPanel } from './rollout.js';

function Summary({ agents, now }: { agents: AgentRow[]; now: number }) {
  const online = agents.filter((a) => a.online).length;
  const outdated = agents.filter((a) => a.outdated).length;
  const inWindow = agents.filter((a) => a.in_window_now).length;
  const next = agents.map((a) => (a.next_window ? Date.parse(a.next_window.start) : NaN)).filter((t) => Number.isFinite(t) && t > now).sort((a, b) => a - b)[0];
  return (
    <div class="stats">
      <div class="stat" data-testid="agents-total"><span class="stat-value">{agents.length}</span><span class="stat-label">agents</span></div>
      <div class="stat" data-testid="agents-online"><span class="stat-value">{online}</span><span class="stat-label">online</span></div>
      <div class={outdated > 0 ? 'stat stat-warn' : 'stat'} data-testid="agents-outdated"><span class="stat-value">{outdated}</span><span class="stat-label">out of date</span></div>
      <div class="stat" data-testid="agents-in-window">
        <span class="stat-value">{inWindow}</span>
        <span class="stat-label">in a window now{next !== undefined ? ` · next ${relative(next, now)}` : ''}</span>
      </div>
    </div>
  );
}

function schedule(m: Agents['maintenance']): string {
  const u = m?.agent_upgrades;
  if (!u) return 'No maintenance window: agents install only critical releases.';
  const days = WEEKDAYS.filter((d) => u.weekdays.includes(d));
  return `Maintenance window: ${days.join(', ') || 'no day'} at ${String(u.utc_start_hour).padStart(2, '0')}:00 UTC for one hour.`;
}

export function AgentsPage({ session }: { session: CurrentSession }) {
  const { data, error, loading, reload: reloadAgents } = useLoad(() => api.agents());
  // Asked only of a user who may read it (a refusal would be one more error on every visit of the page).
  const mayReadRollout = session.acl?.rollout?.read !== false;
  const rollout = useLoad(() => (mayReadRollout ? api.rollout() : Promise.resolve({ managed: false, groups: [] })));
  const reload = () => {
    reloadAgents();
    rollout.reload();
  };
  const [query, setQuery] = useUrlState('q');
  const now = Date.now();
  const agents = data?.agents ?? [];
  const rows = filterItems(agents.map((a) => ({ a, name: a.nodename, text: [a.host_id, a.version ?? '', a.channel ?? '', a.services.join(' '), a.outdated ? 'outdated' : ''] })), query).map((x) => x.a);
  return (
    <>
      <PageHeader title="Agents" subtitle={rolloutSubtitle(rollout.data) ?? (data ? schedule(data.maintenance) : 'Versions, upgrade channels and maintenance windows.')}>
        <button type="button" class="btn" onClick={reload} data-testid="agents-refresh">Refresh</button>
      </PageHeader>
      <ErrorBox error={error} testid="agents-error" />
      {data ? <Summary agents={agents} now={now} /> : null}
      <RolloutPanel status={rollout.data} error={rollout.error} now={now} />
      <div class={error && !data ? 'hidden' : 'card card-table'}>
        <div class="toolbar"><FilterBox value={query} onChange={setQuery} placeholder="Filter by name, version, channel or 'outdated'" /></div>
        {loading && !data ? <Spinner /> : null}
        {data && rows.length === 0 ? <Empty testid="agents-empty">{agents.length === 0 ? 'No agent has joined this cluster yet.' : 'No agent matches the filter.'}</Empty> : null}
        {rows.length > 0 ? <AgentTable rows={rows} now={now} /> : null}
      </div>
    </>
  );
}

function AgentTable({ rows, now }: { rows: AgentRow[]; now: number }) {
  return (
    <TableBox><table class="table">
      <thead>
        <tr><th>Agent</th><th>Services</th><th>Status</th><th>Version</th><th>Channel</th><th>Target</th><th>Next window</th></tr>
      </thead>
      <tbody>
        {rows.map((a) => (
          <tr key={a.host_id} class={a.outdated ? 'row-warn' : ''} data-testid={`agent-row-${a.nodename}`} data-host-id={a.host_id}>
            <td>
              <div class="strong">{a.nodename}</div>
              <div class="mono muted small" title="Host ID">{a.host_id}</div>
            </td>
            <td>{a.services.join(', ')}</td>
            <td>{a.online ? <Badge kind="ok">online</Badge> : <Badge kind="bad">offline</Badge>}</td>
            <td class="mono">
              {a.version ?? <span class="muted" title="The agent did not report its version">unknown</span>}{' '}
              {a.outdated ? <Badge kind="warn" testid={`agent-outdated-${a.nodename}`}>out of date</Badge> : a.target_version ? <Badge kind="neutral">up to date</Badge> : null}
            </td>
            <td>{a.channel ?? <span class="muted">—</span>}</td>
            {/* The version server writes channels' versions with a leading "v" (static_version: v17.0.0); agents report theirs without. */}
            <td class="mono">{a.target_version?.replace(/^v(?=\d)/, '') ?? <span class="muted">—</span>}</td>
            <td data-testid={`agent-window-${a.nodename}`}>
              {a.in_window_now ? <Badge kind="info">in window now</Badge> : null} <span class="small">{formatWindow(a.next_window, now)}</span>
            </td>
          </tr>
        ))}
      </tbody>
    </table></TableBox>
  );
}
