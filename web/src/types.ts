/** The JSON shapes of the API the page reads (docs/web.md lists the routes; the server is the reference). */

export interface SessionUser {
  name: string;
  roles: string[];
  logins: string[];
}

export interface Acl {
  /** grant: may create roles and set users' roles (the page then shows how to get the maintenance role); absent from older servers. */
  maintenance: { read: boolean; update: boolean; grant?: boolean };
  tokens: { list: boolean; create: boolean; delete: boolean };
  events: { list: boolean };
  /** Whether the agents page is offered (node list or read); absent from older servers: offered, the server decides. */
  agents?: { list: boolean };
  /** Whether the agents page asks for the rollout (autoupdate_agent_rollout read); absent from older servers: it asks. */
  rollout?: { read: boolean };
}

export interface CurrentSession {
  user: SessionUser;
  expires_at: string;
  /** The SSO connector the user signed in through (absent for a local user). */
  connector?: { kind: string; name: string; display?: string };
  acl: Acl;
}

export interface SessionCreated {
  token: string;
  expires_at: string;
  user: SessionUser;
}

export interface Ping {
  cluster_name: string;
  server_version: string;
  /** The Proxy's addresses; ssh.public_addr is its web address as clients and agents dial it (gwctl tokens add prints it). */
  proxy?: { ssh?: { public_addr?: string } };
  auth?: { type: string; connector?: { kind: string; name: string; display?: string } };
}

export interface Connector {
  kind: 'oidc' | 'saml' | 'github';
  name: string;
  display?: string;
}

export interface Labeled {
  name: string;
  labels?: Record<string, string>;
}

export interface NodeResource extends Labeled {
  host_id?: string;
  hostname?: string;
  agent?: string;
  online?: boolean;
}

export interface DatabaseResource extends Labeled {
  protocol?: string;
  uri?: string;
}

export interface AppResource extends Labeled {
  public_addr?: string;
  launch?: boolean;
}

export interface DesktopResource extends Labeled {
  addr?: string;
}

export interface KubeResource extends Labeled {}

export interface Resources {
  nodes: NodeResource[];
  databases: DatabaseResource[];
  apps: AppResource[];
  desktops: DesktopResource[];
  kube_clusters: KubeResource[];
}

export interface AgentRow {
  host_id: string;
  nodename: string;
  services: string[];
  /** null: the agent did not report its version (an older agent). */
  version: string | null;
  channel?: string | null;
  target_version?: string | null;
  outdated?: boolean;
  online: boolean;
  proxy?: string | null;
  next_window: { start: string; end: string } | null;
  in_window_now: boolean;
}

export interface Agents {
  agents: AgentRow[];
  maintenance: { agent_upgrades?: { utc_start_hour: number; weekdays: string[] } } | null;
}

export interface TokenRow {
  id: string;
  roles: string[];
  expires: string;
  uses: number;
  used: number;
  createdAt?: string;
  createdBy?: string;
}

export interface TokenCreated {
  token: string;
  id: string;
  expiresAt: string;
  roles: string[];
  /** The cluster's CA pin (sha256:...), for the joining command line. */
  ca_pin?: string;
}

export interface AuditRow {
  name: string;
  event: Record<string, unknown>;
}

/**
 * GET /webapi/autoupdate/status: the managed rollout (src/wire/autoupdate.ts RolloutStatus, which the Proxy forwards
 * as it is; test/web/rollout.test.ts checks that the two stay assignable).
 */
export type RolloutGroupState = 'unstarted' | 'canary' | 'active' | 'done' | 'halted' | 'rolledback';
export type CanaryState = 'pending' | 'upgrading' | 'healthy' | 'failed' | 'rolledback' | 'gone';

export interface RolloutGroup {
  name: string;
  state: RolloutGroupState;
  reason: string;
  since?: string;
  next_start?: string;
  time_zone?: string;
  canaries: Array<{ host_id: string; nodename: string; state: CanaryState; detail?: string }>;
  versions: Record<string, number>;
  stale: Array<{ host_id: string; nodename: string; last_run?: string }>;
}

export interface RolloutStatus {
  managed: boolean;
  mode?: 'enabled' | 'disabled' | 'suspended';
  strategy?: 'halt-on-error' | 'time-based';
  start_version?: string;
  target_version?: string;
  rollout_id?: string;
  rollback?: { since: string; now: boolean; group?: string };
  groups: RolloutGroup[];
  ungrouped?: number;
}
