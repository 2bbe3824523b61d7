/**
 * The resources `gwctl create / get / rm` manage: one interface per kind, and the fixed vocabularies (kinds and
 * their versions, rule verbs, rule resource names, join roles, weekdays). The manifest validator (schema.ts) and
 * the RBAC engine (../rbac.ts) read these tables; docs/resources.md describes them.
 */

/** Kinds a manifest may hold, with the one version of each that the gateway accepts. */
export const RESOURCE_VERSIONS = {
  role: 'v7',
  user: 'v2',
  token: 'v2',
  github: 'v3',
  saml: 'v2',
  oidc: 'v3',
  cluster_maintenance_config: 'v1',
  lock: 'v2',
  autoupdate_config: 'v1',
  autoupdate_version: 'v1',
} as const;

export type ResourceKind = keyof typeof RESOURCE_VERSIONS;
export const RESOURCE_KINDS = Object.keys(RESOURCE_VERSIONS) as ResourceKind[];

/**
 * Kinds `gwctl get` reads: every kind a manifest holds, and what the cluster reports (agents, Proxies, audit, the
 * managed rollout as the Auth Service computed it: read-only).
 */
export const GET_KINDS = [...RESOURCE_KINDS, 'node', 'proxy', 'event', 'autoupdate_agent_rollout'] as const;
export type GetKind = (typeof GET_KINDS)[number];

/** A kind as a user writes it, singular or plural (`roles`, `proxies`); undefined when there is no such kind. */
export function getKindOf(text: string): GetKind | undefined {
  const singular = text === 'proxies' ? 'proxy' : text.endsWith('s') ? text.slice(0, -1) : text;
  return (GET_KINDS as readonly string[]).includes(text) ? (text as GetKind) : (GET_KINDS as readonly string[]).includes(singular) ? (singular as GetKind) : undefined;
}

/** Verbs of role rules; `*` is every verb. */
export const VERBS = ['list', 'read', 'create', 'update', 'delete', '*'] as const;
export type Verb = (typeof VERBS)[number];

/** Names that role rules may grant verbs on; `*` is every resource (cluster_maintenance_config included). */
export const RULE_RESOURCES = [
  'role',
  'user',
  'token',
  'github',
  'saml',
  'oidc',
  'cluster_maintenance_config',
  'node',
  'db',
  'app',
  'kube_cluster',
  'windows_desktop',
  'event',
  'lock',
  'proxy',
  'autoupdate_config',
  'autoupdate_version',
  'autoupdate_agent_rollout',
  '*',
] as const;
export type RuleResource = (typeof RULE_RESOURCES)[number];

/** What a join token lets an agent (or proxy) join as. */
export const TOKEN_ROLES = ['node', 'db', 'app', 'kube', 'desktop', 'proxy'] as const;
export type TokenRole = (typeof TOKEN_ROLES)[number];

/** Short weekday names in canonical order (the order weekdays are normalised to). */
export const WEEKDAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'] as const;
export type Weekday = (typeof WEEKDAYS)[number];

/** cluster_maintenance_config is a singleton: this is its only name. */
export const CLUSTER_MAINTENANCE_CONFIG_NAME = 'cluster-maintenance-config';
export const AUTOUPDATE_CONFIG_NAME = 'autoupdate-config';
export const AUTOUPDATE_VERSION_NAME = 'autoupdate-version';
export const AUTOUPDATE_AGENT_ROLLOUT_NAME = 'autoupdate-agent-rollout';

/** Kinds of which one resource exists at most, under this one name (left out of a manifest, it is this). */
export const SINGLETON_NAMES: Readonly<Partial<Record<ResourceKind, string>>> = {
  cluster_maintenance_config: CLUSTER_MAINTENANCE_CONFIG_NAME,
  autoupdate_config: AUTOUPDATE_CONFIG_NAME,
  autoupdate_version: AUTOUPDATE_VERSION_NAME,
};

/** Whether a kind is a singleton (SINGLETON_NAMES). */
export function isSingleton(kind: string): kind is keyof typeof SINGLETON_NAMES {
  return Object.hasOwn(SINGLETON_NAMES, kind);
}

// --- the resources ---------------------------------------------------------------------------------------------

export interface Metadata {
  name: string;
  description?: string;
  labels?: Record<string, string>;
  /** RFC 3339 time stamp, as written (2030-01-01T00:00:00Z). */
  expires?: string;
}

/** Any resource; the kinds below narrow kind, version and spec. */
export interface Resource<S = unknown> {
  kind: string;
  version: string;
  metadata: Metadata;
  spec: S;
}

/**
 * Label selectors of a role: every key must match. A value is a literal, a glob with `*`, a regular expression
 * written `^...$`, or a list of those (any may match). `'*': '*'` matches every resource, even one without labels.
 */
export type Labels = Record<string, string | string[]>;

export interface Rule {
  resources: RuleResource[];
  verbs: Verb[];
}

export interface RoleConditions {
  /** OS logins; `{{internal.<trait>}}` / `{{external.<trait>}}` expand to the user's trait values. */
  logins?: string[];
  node_labels?: Labels;
  db_labels?: Labels;
  app_labels?: Labels;
  kubernetes_labels?: Labels;
  windows_desktop_labels?: Labels;
  db_names?: string[];
  db_users?: string[];
  /** Kubernetes users the gateway may impersonate for the user (kubectl --as picks one of several). */
  kubernetes_users?: string[];
  /** Kubernetes groups the gateway impersonates for the user. */
  kubernetes_groups?: string[];
  rules?: Rule[];
}

export interface RoleOptions {
  /** A duration such as 8h, 30m or 1h30m. */
  max_session_ttl?: string;
}

export interface RoleSpec {
  allow?: RoleConditions;
  deny?: RoleConditions;
  options?: RoleOptions;
}

export interface RoleResource extends Resource<RoleSpec> {
  kind: 'role';
  version: 'v7';
}

/** Trait name → values (logins, db_users, ...), as the local user database or an identity provider gives them. */
export type Traits = Record<string, string[]>;

/** Set on users that a single sign-on created (src/auth/sso): the connector that vouched for them. */
export interface UserCreatedBy {
  connector: string;
  kind: 'oidc' | 'saml' | 'github';
  /** RFC 3339: the sign-in that last wrote the record. */
  time: string;
}

export interface UserSpec {
  roles: string[];
  traits?: Traits;
  created_by?: UserCreatedBy;
}

export interface UserResource extends Resource<UserSpec> {
  kind: 'user';
  version: 'v2';
}

export interface TokenSpec {
  roles: TokenRole[];
  /** How many joins the token allows; 0 = unlimited until it expires. */
  uses?: number;
}

/** metadata.name is the token itself: a secret (withoutSecrets replaces it with tokenId()). */
export interface TokenResource extends Resource<TokenSpec> {
  kind: 'token';
  version: 'v2';
}

export interface SigningKeyPair {
  cert: string;
  /** Secret: only present when read with --with-secrets. */
  private_key?: string;
}

export interface TeamMapping {
  organization: string;
  team: string;
  roles: string[];
}

export interface GithubSpec {
  client_id: string;
  /** Secret: only present when read with --with-secrets. */
  client_secret?: string;
  redirect_url: string;
  /** The code-hosting service's web address (its OAuth pages); default https://github.com. */
  endpoint_url?: string;
  /** Its REST API; default https://api.github.com. */
  api_endpoint_url?: string;
  /** PEM CA certificate(s) trusted for the identity provider, besides the system's. */
  ca?: string;
  teams_to_roles: TeamMapping[];
  display?: string;
  signing_key_pair?: SigningKeyPair;
}

export interface GithubConnector extends Resource<GithubSpec> {
  kind: 'github';
  version: 'v3';
}

export interface AttributeMapping {
  name: string;
  value: string;
  roles: string[];
}

export interface SamlSpec {
  /** Assertion consumer service URL. */
  acs: string;
  /** The gateway's entity ID as service provider (the audience of assertions); default the acs URL. */
  service_provider_issuer?: string;
  /** PEM CA certificate(s) trusted for entity_descriptor_url, besides the system's. */
  ca?: string;
  /** The identity provider's metadata XML; exactly one of entity_descriptor and entity_descriptor_url. */
  entity_descriptor?: string;
  entity_descriptor_url?: string;
  attributes_to_roles: AttributeMapping[];
  signing_key_pair?: SigningKeyPair;
  display?: string;
}

export interface SamlConnector extends Resource<SamlSpec> {
  kind: 'saml';
  version: 'v2';
}

/** `claim` is the canonical key; manifests may also write it `name` (the spelling of the specification's table). */
export interface ClaimMapping {
  claim: string;
  value: string;
  roles: string[];
}

export interface OidcSpec {
  issuer_url: string;
  client_id: string;
  /** Secret: only present when read with --with-secrets. */
  client_secret?: string;
  redirect_url: string;
  /** The claim naming the user; default email (verified: see allow_unverified_email). No fallback to another claim. */
  username_claim?: string;
  /** true: an e-mail address names the user even when email_verified is absent or false. */
  allow_unverified_email?: boolean;
  /** Scopes asked for besides openid; default email and profile. */
  scope?: string[];
  /** PEM CA certificate(s) trusted for the identity provider, besides the system's. */
  ca?: string;
  claims_to_roles: ClaimMapping[];
  signing_key_pair?: SigningKeyPair;
  display?: string;
}

export interface OidcConnector extends Resource<OidcSpec> {
  kind: 'oidc';
  version: 'v3';
}

export interface AgentUpgrades {
  /** 0..23; the maintenance window is one hour from this hour (UTC). */
  utc_start_hour: number;
  /** Normalised: short names, canonical order, no duplicates. */
  weekdays: Weekday[];
}

export interface ClusterMaintenanceSpec {
  agent_upgrades: AgentUpgrades;
}

export interface ClusterMaintenanceConfig extends Resource<ClusterMaintenanceSpec> {
  kind: 'cluster_maintenance_config';
  version: 'v1';
}

/** Who a lock locks: exactly one of a user (by name), a role (every user holding it) or an agent (host ID). */
export interface LockTarget {
  user?: string;
  role?: string;
  node?: string;
}

export const LOCK_TARGET_KINDS = ['user', 'role', 'node'] as const;
export type LockTargetKind = (typeof LOCK_TARGET_KINDS)[number];

export interface LockSpec {
  target: LockTarget;
  /** Shown to the locked identity with every refusal. */
  message?: string;
  /** RFC 3339; absent = until the lock is removed. */
  expires?: string;
  /** Set by the Auth Service when the lock is stored (a manifest's values are replaced). */
  created_at?: string;
  created_by?: string;
}

export interface LockResource extends Resource<LockSpec> {
  kind: 'lock';
  version: 'v2';
}

/** The managed rollout's modes and strategies (docs/upgrades.md, "Managed rollouts"). */
export const AUTOUPDATE_MODES = ['enabled', 'disabled', 'suspended'] as const;
export type AutoupdateMode = (typeof AUTOUPDATE_MODES)[number];
export const AUTOUPDATE_STRATEGIES = ['halt-on-error', 'time-based'] as const;
export type AutoupdateStrategy = (typeof AUTOUPDATE_STRATEGIES)[number];
/** The most groups one autoupdate_config declares (bounds the metrics' group label, too). */
export const AUTOUPDATE_MAX_GROUPS = 16;
export const AUTOUPDATE_MAX_CANARIES = 5;
/** A group's name: what agents say in their hello and upgraders in their query. */
export const AUTOUPDATE_GROUP_NAME = /^[a-z0-9-]{1,32}$/;

/** One rollout group: its window (days and start hour in its own time zone), its wait and its canaries. */
export interface AutoupdateGroup {
  name: string;
  /** Normalised as cluster_maintenance_config's weekdays; left out: every day. */
  days: Weekday[];
  /** 0..23, local time in time_zone. */
  start_hour: number;
  /** An IANA name (Europe/Paris); default UTC. */
  time_zone: string;
  /** halt-on-error: hours after the previous group is done before this one may start. */
  wait_hours: number;
  /** 0..5 agents upgraded first. */
  canary_count: number;
}

export interface AutoupdateConfigSpec {
  agents: {
    mode: AutoupdateMode;
    strategy: AutoupdateStrategy;
    /** How long a group's window stays open (a duration: 1h). */
    maintenance_window_duration: string;
    /** How long every canary stays healthy on the target before its group goes on (≥ 10s). */
    canary_healthy_for: string;
    /** A canary not healthy on the target this long after it was chosen is a failure. */
    canary_deadline: string;
    /** An agent whose upgrader has not run for this long is listed as stale. */
    stale_after: string;
    /** The group of agents in none: a group's name, or disabled; left out: the last group. */
    catch_all?: string;
    schedules: { regular: AutoupdateGroup[] };
  };
}

export interface AutoupdateConfig extends Resource<AutoupdateConfigSpec> {
  kind: 'autoupdate_config';
  version: 'v1';
}

export interface AutoupdateVersionSpec {
  agents: {
    /** What agents run before the rollout, and return to on a rollback (x.y.z, no leading v). */
    start_version: string;
    target_version: string;
    /** regular: each group in its windows; immediate: windows skipped (canaries still first). */
    schedule: 'regular' | 'immediate';
    mode: AutoupdateMode;
    /** A critical release skips windows (canaries still first). */
    critical: boolean;
  };
}

export interface AutoupdateVersion extends Resource<AutoupdateVersionSpec> {
  kind: 'autoupdate_version';
  version: 'v1';
}

export type AnyResource =
  | RoleResource
  | UserResource
  | TokenResource
  | GithubConnector
  | SamlConnector
  | OidcConnector
  | ClusterMaintenanceConfig
  | LockResource
  | AutoupdateConfig
  | AutoupdateVersion;
