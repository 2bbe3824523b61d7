/**
 * `gwctl get KIND --format text`: one table per kind (table.ts), with the columns a person looks for first; the
 * whole resource is in `--format yaml` (the default, which `gwctl create` reads back) and `--format json`. Events
 * are the audit table of events.ts. Cells are the resource's own text with control characters replaced, as in
 * events.ts, so that a name from a manifest or an agent cannot move the terminal's cursor.
 */
import type { Resource } from '../auth/resources/index.js';
import { eventTable } from './events.js';
import { table } from './table.js';

const MAX_CELL = 80;

type Spec = Record<string, unknown>;

/** A cell: text without control characters, at most MAX_CELL characters; lists joined with commas. */
function cell(value: unknown): string {
  if (value === undefined || value === null) return '';
  const text = Array.isArray(value) ? value.map(String).join(',') : typeof value === 'object' ? JSON.stringify(value) : String(value);
  // eslint-disable-next-line no-control-regex
  const clean = text.replace(/[\u0000-\u001f\u007f-\u009f]/g, '?');
  return clean.length > MAX_CELL ? `${clean.slice(0, MAX_CELL - 1)}…` : clean;
}

const labels = (l: unknown): string => (l && typeof l === 'object' ? Object.entries(l as Record<string, unknown>).map(([k, v]) => `${k}=${cell(v)}`).join(',') : '');
const at = (o: unknown, key: string): unknown => (o && typeof o === 'object' ? (o as Record<string, unknown>)[key] : undefined);

/** The mappings of a connector (teams, attributes or claims to roles), as "value -> roles" pairs. */
function mappings(spec: Spec): string {
  const list = (spec.teams_to_roles ?? spec.attributes_to_roles ?? spec.claims_to_roles) as Array<Record<string, unknown>> | undefined;
  if (!Array.isArray(list)) return '';
  return list.map((m) => `${String(m.team ?? m.value ?? '')}->${cell(m.roles)}`).join(' ');
}

/** Column headings and one row per resource, by kind. */
const COLUMNS: Record<string, { head: string[]; row: (r: Resource, spec: Spec) => unknown[] }> = {
  role: {
    head: ['Role', 'Logins', 'Node labels', 'Rules', 'Description'],
    row: (r, s) => [r.metadata.name, at(s.allow, 'logins'), labels(at(s.allow, 'node_labels')), ((at(s.allow, 'rules') as unknown[] | undefined) ?? []).length, r.metadata.description],
  },
  user: { head: ['User', 'Roles', 'Logins', 'Created by'], row: (r, s) => [r.metadata.name, s.roles, at(s.traits, 'logins'), at(s.created_by, 'connector') ?? 'local'] },
  token: { head: ['Id', 'Types', 'Uses', 'Expires'], row: (r, s) => [r.metadata.name, s.roles, s.uses === 0 ? `${String(s.used ?? 0)}/any` : `${String(s.used ?? 0)}/${String(s.uses ?? '')}`, r.metadata.expires] },
  github: { head: ['Name', 'Display', 'Teams to roles'], row: (r, s) => [r.metadata.name, s.display, mappings(s)] },
  saml: { head: ['Name', 'Display', 'Attributes to roles'], row: (r, s) => [r.metadata.name, s.display, mappings(s)] },
  oidc: { head: ['Name', 'Display', 'Issuer', 'Claims to roles'], row: (r, s) => [r.metadata.name, s.display, s.issuer_url, mappings(s)] },
  cluster_maintenance_config: {
    head: ['Name', 'UTC start hour', 'Weekdays'],
    row: (r, s) => [r.metadata.name, at(s.agent_upgrades, 'utc_start_hour'), at(s.agent_upgrades, 'weekdays') ?? 'every day'],
  },
  lock: {
    head: ['Name', 'Target', 'Message', 'Expires', 'Created by'],
    row: (r, s) => [r.metadata.name, Object.entries((s.target as Record<string, unknown> | undefined) ?? {}).map(([k, v]) => `${k}=${cell(v)}`).join(','), s.message, s.expires ?? 'never', s.created_by],
  },
  autoupdate_config: {
    head: ['Mode', 'Strategy', 'Groups (time zone, canaries)'],
    row: (_r, s) => [at(s.agents, 'mode'), at(s.agents, 'strategy'), ((at(at(s.agents, 'schedules'), 'regular') as Spec[] | undefined) ?? []).map((g) => `${cell(g.name)} (${cell(g.time_zone)}, ${cell(g.canary_count)})`).join(', ')],
  },
  autoupdate_version: { head: ['Start', 'Target', 'Schedule', 'Mode', 'Critical'], row: (_r, s) => [at(s.agents, 'start_version'), at(s.agents, 'target_version'), at(s.agents, 'schedule'), at(s.agents, 'mode'), at(s.agents, 'critical')] },
  autoupdate_agent_rollout: {
    head: ['Rollout', 'Versions', 'Groups'],
    row: (_r, s) => [s.rollout_id, `${cell(s.start_version)} -> ${cell(s.target_version)}`, ((s.groups as Spec[] | undefined) ?? []).map((g) => `${cell(g.name)}: ${cell(g.state)}`).join(', ')],
  },
  node: {
    head: ['Host ID', 'Hostname', 'Status', 'Services', 'Labels', 'Connected since'],
    row: (r, s) => [r.metadata.name, s.hostname, s.status, s.services ?? s.roles, labels(r.metadata.labels), s.connected_since],
  },
  proxy: { head: ['Host ID', 'Hostname', 'Version', 'Public address', 'Last heartbeat'], row: (r, s) => [r.metadata.name, s.hostname, s.version, s.public_addr, s.last_heartbeat] },
};

/** The text table of resources of one kind (the kind as the Auth Service names it in each resource). */
export function resourceTable(kind: string, resources: readonly Resource[]): string {
  if (kind === 'event') return eventTable(resources.map((r) => r.spec as Spec));
  const columns = (Object.hasOwn(COLUMNS, kind) ? COLUMNS[kind] : undefined) ?? { head: ['Kind', 'Name'], row: (r: Resource) => [r.kind, r.metadata.name] };
  return table([columns.head, ...resources.map((r) => columns.row(r, (r.spec ?? {}) as Spec).map(cell))]);
}
