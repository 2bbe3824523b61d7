/** What the user may reach: servers, databases, apps, desktops and Kubernetes clusters, with labels and a filter. */
import { useState } from 'preact/hooks';
import { api } from '../api.js';
import { useLoad } from '../components/load.js';
import { Badge, Chips, Empty, ErrorBox, PageHeader, Spinner, TableBox } from '../components/ui.js';
import { addChipToQuery, filterItems, type Filterable } from '../lib/filter.js';
import { appLaunchStart } from '../lib/route.js';
import { navigate } from '../nav.js';
import type { AppResource, CurrentSession, DatabaseResource, DesktopResource, KubeResource, NodeResource } from '../types.js';
import { FilterBox, useUrlState } from './filterbox.js';

type Kind = 'nodes' | 'databases' | 'apps' | 'desktops' | 'kube_clusters';

const TABS: ReadonlyArray<{ kind: Kind; label: string }> = [
  { kind: 'nodes', label: 'Servers' },
  { kind: 'databases', label: 'Databases' },
  { kind: 'apps', label: 'Applications' },
  { kind: 'desktops', label: 'Desktops' },
  { kind: 'kube_clusters', label: 'Kubernetes' },
];

const filterable = (kind: Kind, r: Record<string, unknown> & { name: string; labels?: Record<string, string> }): Filterable => ({
  name: r.name,
  labels: r.labels,
  text: kind === 'nodes' ? [r.hostname as string] : kind === 'databases' ? [r.protocol as string] : kind === 'apps' ? [r.public_addr as string] : kind === 'desktops' ? [r.addr as string] : [],
});

export function ResourcesPage({ session }: { session: CurrentSession }) {
  const { data, error, loading, reload } = useLoad(() => api.resources());
  const [query, setQuery] = useUrlState('q');
  const [tab, setTab] = useUrlState('kind');
  const kind: Kind = TABS.some((t) => t.kind === tab) ? (tab as Kind) : 'nodes';
  const pick = (chip: string) => setQuery(addChipToQuery(query, chip));
  const rows = (k: Kind) => filterItems(((data?.[k] ?? []) as Array<Record<string, unknown> & { name: string }>).map((r) => ({ r, ...filterable(k, r) })), query).map((x) => x.r);

  return (
    <>
      <PageHeader title="Resources" subtitle="What your roles allow you to reach in this cluster.">
        <button type="button" class="btn" onClick={reload} data-testid="resources-refresh">Refresh</button>
      </PageHeader>
      <div class="tabs" role="tablist">
        {TABS.map((t) => (
          <button type="button" role="tab" key={t.kind} class={t.kind === kind ? 'tab active' : 'tab'} aria-selected={t.kind === kind} onClick={() => setTab(t.kind === 'nodes' ? '' : t.kind)} data-testid={`resource-tab-${t.kind}`}>
            {t.label}
            <span class="tab-count">{data ? (query ? `${rows(t.kind).length}/${(data[t.kind] ?? []).length}` : (data[t.kind] ?? []).length) : ''}</span>
          </button>
        ))}
      </div>
      <div class="card card-table">
        <div class="toolbar">
          <FilterBox value={query} onChange={setQuery} placeholder="Filter by name, or label key=value" />
        </div>
        <ErrorBox error={error} testid="resources-error" />
        {loading && !data ? <Spinner /> : data ? <ResourceTable kind={kind} rows={rows(kind)} total={(data[kind] ?? []).length} session={session} onPick={pick} /> : null}
      </div>
    </>
  );
}

function ResourceTable({ kind, rows, total, session, onPick }: { kind: Kind; rows: unknown[]; total: number; session: CurrentSession; onPick: (c: string) => void }) {
  if (rows.length === 0) {
    const what = TABS.find((t) => t.kind === kind)!.label.toLowerCase();
    return <Empty testid="resources-empty">{total === 0 ? `No ${what} that your roles allow.` : `No ${what} match the filter.`}</Empty>;
  }
  switch (kind) {
    case 'nodes':
      return <NodeTable rows={rows as NodeResource[]} logins={session.user.logins} onPick={onPick} />;
    case 'databases':
      return <SimpleTable rows={rows as DatabaseResource[]} extra={['Protocol', (r) => r.protocol ?? '']} command={(r) => `gwsh proxy db ${r.name}`} onPick={onPick} />;
    case 'apps':
      return <AppTable rows={rows as AppResource[]} onPick={onPick} />;
    case 'desktops':
      return <SimpleTable rows={rows as DesktopResource[]} extra={['Address', (r) => r.addr ?? '']} command={(r) => `gwsh proxy desktop ${r.name}`} onPick={onPick} />;
    default:
      return <SimpleTable rows={rows as KubeResource[]} onPick={onPick} />;
  }
}

function NodeTable({ rows, logins, onPick }: { rows: NodeResource[]; logins: string[]; onPick: (c: string) => void }) {
  return (
    <TableBox><table class="table">
      <thead>
        <tr><th>Name</th><th>Hostname</th><th>Labels</th><th>Status</th><th class="right">Connect</th></tr>
      </thead>
      <tbody>
        {rows.map((n) => (
          <tr key={n.name} data-testid={`resource-row-${n.name}`}>
            <td class="strong">{n.name}</td>
            <td class="mono">{n.hostname ?? ''}</td>
            <td><Chips labels={n.labels} onPick={onPick} /></td>
            <td>{n.online === false ? <Badge kind="bad">offline</Badge> : <Badge kind="ok">online</Badge>}</td>
            <td class="right"><ConnectButton node={n.name} logins={logins} disabled={n.online === false} /></td>
          </tr>
        ))}
      </tbody>
    </table></TableBox>
  );
}

function ConnectButton({ node, logins, disabled }: { node: string; logins: string[]; disabled: boolean }) {
  const [login, setLogin] = useState(logins[0] ?? '');
  if (logins.length === 0) return <span class="muted" title="Your roles give you no login on servers">no login</span>;
  const go = () => navigate(`/web/terminal/${encodeURIComponent(node)}?login=${encodeURIComponent(login)}`);
  return (
    <span class="connect">
      {logins.length > 1 ? (
        <select value={login} onChange={(e) => setLogin(e.currentTarget.value)} data-testid={`login-select-${node}`} aria-label="Login">
          {logins.map((l) => <option key={l} value={l}>{l}</option>)}
        </select>
      ) : (
        <span class="mono muted">{login}@</span>
      )}
      <button type="button" class="btn btn-primary btn-small" disabled={disabled} onClick={go} data-testid={`resource-connect-${node}`}>Connect</button>
    </span>
  );
}

function AppTable({ rows, onPick }: { rows: AppResource[]; onPick: (c: string) => void }) {
  const [busy, setBusy] = useState<string | undefined>(undefined);
  const [error, setError] = useState<Error | undefined>(undefined);
  // The launch starts on the app's own host (a nonce for this browser), which sends the page to /web/launch.
  const open = (a: AppResource) => {
    setError(undefined);
    if (!a.public_addr) return setError(new Error(`app "${a.name}" has no public address to open it at`));
    setBusy(a.name);
    window.location.assign(appLaunchStart(a.public_addr, location.port, a.name, location.host));
  };
  return (
    <>
      <ErrorBox error={error} testid="app-launch-error" />
      <TableBox><table class="table">
        <thead><tr><th>Name</th><th>Address</th><th>Labels</th><th class="right">Open</th></tr></thead>
        <tbody>
          {rows.map((a) => (
            <tr key={a.name} data-testid={`resource-row-${a.name}`}>
              <td class="strong">{a.name}</td>
              <td class="mono">{a.public_addr ?? ''}</td>
              <td><Chips labels={a.labels} onPick={onPick} /></td>
              <td class="right">
                <button type="button" class="btn btn-primary btn-small" disabled={busy !== undefined || a.launch === false} onClick={() => open(a)} data-testid={`app-open-${a.name}`}>
                  {busy === a.name ? 'Opening…' : 'Open'}
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table></TableBox>
    </>
  );
}

/** Databases, desktops and Kubernetes clusters: reached with gwsh (the command is shown to copy). */
function SimpleTable<T extends { name: string; labels?: Record<string, string> }>({ rows, extra, command, onPick }: { rows: T[]; extra?: [string, (r: T) => string]; command?: (r: T) => string; onPick: (c: string) => void }) {
  return (
    <TableBox><table class="table">
      <thead><tr><th>Name</th>{extra ? <th>{extra[0]}</th> : null}<th>Labels</th>{command ? <th>Connect with</th> : null}</tr></thead>
      <tbody>
        {rows.map((r) => (
          <tr key={r.name} data-testid={`resource-row-${r.name}`}>
            <td class="strong">{r.name}</td>
            {extra ? <td class="mono">{extra[1](r)}</td> : null}
            <td><Chips labels={r.labels} onPick={onPick} /></td>
            {command ? <td><code class="cli">{command(r)}</code></td> : null}
          </tr>
        ))}
      </tbody>
    </table></TableBox>
  );
}

