/** The cluster_maintenance_config manifest the maintenance form saves (POST /v1/resources, as gwctl create). */
import { WEEKDAYS, type Weekday } from './time.js';

export interface AgentUpgrades {
  utc_start_hour: number;
  weekdays: Weekday[];
}

/** The window of a cluster_maintenance_config resource as GET /v1/resources returns it; undefined when unset. */
export function upgradesOf(resource: unknown): AgentUpgrades | undefined {
  const spec = (resource as { spec?: { agent_upgrades?: { utc_start_hour?: unknown; weekdays?: unknown } } } | undefined)?.spec;
  const u = spec?.agent_upgrades;
  if (!u || typeof u.utc_start_hour !== 'number' || !Array.isArray(u.weekdays)) return undefined;
  return { utc_start_hour: u.utc_start_hour, weekdays: WEEKDAYS.filter((d) => (u.weekdays as unknown[]).includes(d)) };
}

/**
 * The manifest text. Only known weekdays and an hour 0..23 are written (anything else throws before the request:
 * the form offers nothing else, so this is a bug or a tampered page); the server checks again.
 */
export function maintenanceManifest(weekdays: readonly string[], hour: number): string {
  if (!Number.isInteger(hour) || hour < 0 || hour > 23) throw new RangeError(`the start hour must be a whole number 0..23, got ${hour}`);
  const unknown = weekdays.filter((d) => !WEEKDAYS.includes(d as Weekday));
  if (unknown.length > 0) throw new RangeError(`unknown weekday ${JSON.stringify(unknown[0])}`);
  const days = WEEKDAYS.filter((d) => weekdays.includes(d));
  return [
    'kind: cluster_maintenance_config',
    'version: v1',
    'metadata:',
    '  name: cluster-maintenance-config',
    'spec:',
    '  agent_upgrades:',
    `    utc_start_hour: ${hour}`,
    `    weekdays: [${days.join(', ')}]`,
    '',
  ].join('\n');
}

/** The role the seed gives for managing the window (no preset role holds it); docs/resources.md shows the same. */
export const MAINTENANCE_ROLE = 'maintenance-admin';

/** A word as a POSIX shell reads it: as is when it is plain, else in single quotes. */
function shellWord(s: string): string {
  return /^[A-Za-z0-9._@%+=:,/-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * The commands that give `user` the maintenance window: create the role (-f: or write it again as the seed gives
 * it, when another admin made it first), add it to the user's roles. The README
 * prints the same lines for its first admin (test/web/logic.test.ts compares them), and the maintenance page shows
 * them to a user who may grant the role but lacks it (acl.maintenance.grant).
 */
export function maintenanceRoleSteps(user: string, roles: readonly string[]): string {
  const next = roles.includes(MAINTENANCE_ROLE) ? [...roles] : [...roles, MAINTENANCE_ROLE];
  return [
    "gwctl create -f - <<'EOF'",
    'kind: role',
    'version: v7',
    `metadata: { name: ${MAINTENANCE_ROLE} }`,
    'spec:',
    '  allow:',
    '    rules:',
    '      - resources: [cluster_maintenance_config]',
    '        verbs: [create, read, update, delete]',
    'EOF',
    `gwctl users update ${shellWord(user)} --set-roles=${shellWord(next.join(','))}`,
    '',
  ].join('\n');
}
