/**
 * Role-based access control. A user holds a set of roles; each role allows and denies:
 *
 * - rules: verbs (list, read, create, update, delete, `*`) on resources of the cluster (role, user, token, ...,
 *   cluster_maintenance_config, `*`), which gate `gwctl` and the Auth Service API: checkAccess();
 * - label selectors: which nodes, databases, apps, Kubernetes clusters and desktops the user reaches: canAccess();
 * - logins (and database names and users), with `{{internal.<trait>}}` templates: allowedLogins();
 * - the Kubernetes users and groups a user may act as: kubeGrant() (kubeImpersonation, which applies them, is src/wire/kubeimpersonate.ts, re-exported here).
 *
 * Across all roles, deny wins over allow: one matching deny in any role refuses, whatever the others allow.
 * docs/resources.md describes the semantics for administrators.
 */
import { expandTemplates, matchValue, TEMPLATE } from './resources/match.js';
import { durationMs } from './resources/schema.js';
import type { Labels, RoleConditions, RoleResource, Rule, Traits, Verb } from './resources/types.js';
import type { DatabaseGrant } from '../tunnel/protocol.js';
import type { KubeGrant } from './pki/identity.js';

export type { Verb } from './resources/types.js';
export type Role = RoleResource;

export type AccessDecision =
  | { allowed: true }
  | {
      allowed: false;
      /** For the user: which roles were consulted and what is missing (or which role denies). */
      reason: string;
      /** The rule a role would need: resources and verbs. */
      missing: { resources: string[]; verbs: string[] };
    };

/** The kinds of resources users reach through the proxy, each selected by a label field of the role. */
export type AccessKind = 'node' | 'db' | 'app' | 'kube_cluster' | 'windows_desktop';

export const LABEL_FIELDS = {
  node: 'node_labels',
  db: 'db_labels',
  app: 'app_labels',
  kube_cluster: 'kubernetes_labels',
  windows_desktop: 'windows_desktop_labels',
} as const satisfies Record<AccessKind, keyof RoleConditions>;

// --- preset roles ------------------------------------------------------------------------------------------------

const ALL: Labels = { '*': '*' };

function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value)) deepFreeze(v);
  }
  return value;
}

/**
 * The roles every cluster has (a stored role of the same name replaces one). None grants any verb on
 * cluster_maintenance_config: managing the maintenance window needs a role made for it (docs/resources.md).
 */
export const PRESET_ROLES: Role[] = deepFreeze([
  {
    kind: 'role',
    version: 'v7',
    metadata: {
      name: 'access',
      description: "Reach every node, database, app, Kubernetes cluster and desktop, with the logins from the user's traits.",
    },
    spec: {
      allow: {
        logins: ['{{internal.logins}}'],
        node_labels: { ...ALL },
        db_labels: { ...ALL },
        app_labels: { ...ALL },
        kubernetes_labels: { ...ALL },
        windows_desktop_labels: { ...ALL },
        db_names: ['{{internal.db_names}}'],
        db_users: ['{{internal.db_users}}'],
        kubernetes_users: ['{{internal.kubernetes_users}}'],
        kubernetes_groups: ['{{internal.kubernetes_groups}}'],
      },
    },
  },
  {
    kind: 'role',
    version: 'v7',
    metadata: {
      name: 'editor',
      description: 'Manage users, roles, tokens, connectors, locks and the inventory; read the audit log. Not cluster_maintenance_config.',
    },
    spec: {
      allow: {
        rules: [
          {
            resources: ['role', 'user', 'token', 'github', 'saml', 'oidc', 'node', 'db', 'app', 'kube_cluster', 'windows_desktop', 'lock'],
            verbs: ['*'],
          },
          { resources: ['event', 'proxy'], verbs: ['list', 'read'] },
        ],
      },
    },
  },
  {
    kind: 'role',
    version: 'v7',
    metadata: { name: 'auditor', description: 'Read the audit log.' },
    spec: { allow: { rules: [{ resources: ['event'], verbs: ['list', 'read'] }] } },
  },
]);

// --- rules -------------------------------------------------------------------------------------------------------

function ruleMatches(rule: Rule, resource: string, verb: Verb): boolean {
  return (rule.resources.includes('*') || (rule.resources as readonly string[]).includes(resource)) && (rule.verbs.includes('*') || rule.verbs.includes(verb));
}

/** Whether roles let their holder do verb on resource (a rule resource name such as role or cluster_maintenance_config). */
export function checkAccess(roles: readonly Role[], resource: string, verb: Verb): AccessDecision {
  const missing = { resources: [resource], verbs: [verb] };
  for (const role of roles) {
    if ((role.spec.deny?.rules ?? []).some((r) => ruleMatches(r, resource, verb))) {
      return { allowed: false, reason: `role ${JSON.stringify(role.metadata.name)} denies "${verb}" on ${JSON.stringify(resource)}`, missing };
    }
  }
  if (roles.some((role) => (role.spec.allow?.rules ?? []).some((r) => ruleMatches(r, resource, verb)))) return { allowed: true };
  const names = [...new Set(roles.map((r) => r.metadata.name))];
  const reason =
    names.length === 0
      ? `you have no roles, so nothing allows "${verb}" on ${JSON.stringify(resource)}`
      : `none of your roles (${names.join(', ')}) allows "${verb}" on ${JSON.stringify(resource)}`;
  return { allowed: false, reason, missing };
}

// --- labels ------------------------------------------------------------------------------------------------------

/**
 * Whether a role's label selector selects a resource: every key of the selector must be a label of the resource
 * whose value matches one of the selector's values (exact, glob with `*`, or `^regex$`). `'*': '*'` selects every
 * resource, even one without labels. An absent or empty selector selects nothing.
 */
export function matchLabels(roleLabels: Labels | undefined, resourceLabels: Readonly<Record<string, string>>): boolean {
  const entries = Object.entries(roleLabels ?? {});
  if (entries.length === 0) return false;
  return entries.every(([key, value]) => {
    const patterns = Array.isArray(value) ? value : [value];
    if (key === '*') return patterns.includes('*');
    const actual = Object.hasOwn(resourceLabels, key) ? resourceLabels[key] : undefined;
    return typeof actual === 'string' && patterns.some((p) => matchValue(p, actual));
  });
}

/** Whether roles reach a resource of kind with labels: some role allows it and no role denies it. */
export function canAccess(roles: readonly Role[], kind: AccessKind, labels: Readonly<Record<string, string>>): boolean {
  const field = LABEL_FIELDS[kind];
  if (roles.some((r) => matchLabels(r.spec.deny?.[field], labels))) return false;
  return roles.some((r) => matchLabels(r.spec.allow?.[field], labels));
}

// --- logins ------------------------------------------------------------------------------------------------------

function allowedValues(roles: readonly Role[], field: 'logins' | 'db_names' | 'db_users' | 'kubernetes_users' | 'kubernetes_groups', traits: Readonly<Traits>): string[] {
  const allow = roles.flatMap((r) => expandTemplates(r.spec.allow?.[field], traits));
  const deny = new Set(roles.flatMap((r) => expandTemplates(r.spec.deny?.[field], traits)));
  return [...new Set(allow)].filter((v) => !deny.has(v)).sort();
}

/**
 * The longest session the roles allow: the shortest spec.options.max_session_ttl among them (ms), or undefined
 * when none sets one. Certificates (gwsh login, SSO), web sessions and what they carry never outlive it.
 */
export function maxSessionTtlMs(roles: readonly Role[]): number | undefined {
  let cap: number | undefined;
  for (const role of roles) {
    const text = role.spec.options?.max_session_ttl;
    const ms = text === undefined ? undefined : durationMs(text);
    if (ms !== undefined && ms > 0 && (cap === undefined || ms < cap)) cap = ms;
  }
  return cap;
}

/** OS logins the roles allow for a user with traits: allowed minus denied, templates expanded, sorted, unique. */
export function allowedLogins(roles: readonly Role[], traits: Readonly<Traits>): string[] {
  return allowedValues(roles, 'logins', traits);
}

/** Database names and users the roles allow, like allowedLogins. */
export function allowedDatabaseAccess(roles: readonly Role[], traits: Readonly<Traits>): { names: string[]; users: string[] } {
  return { names: allowedValues(roles, 'db_names', traits), users: allowedValues(roles, 'db_users', traits) };
}

/**
 * What the agent serving a database checks the client's startup against (docs/resources.md, "Database users and
 * names"): db_users and db_names of every role, templates expanded from the traits, allowed and denied kept apart
 * so that a deny still wins over an allowed `*`.
 */
export function databaseGrant(roles: readonly Role[], traits: Readonly<Traits>): DatabaseGrant {
  // `*` (any value) only as a role writes it: a trait value "*" (from an identity provider) grants nothing.
  const allowed = (values: readonly string[] | undefined) =>
    (values ?? []).flatMap((v) => (TEMPLATE.test(v) ? expandTemplates([v], traits).filter((x) => x !== '*') : expandTemplates([v], traits)));
  const list = (field: 'db_names' | 'db_users') => ({
    allow: [...new Set(roles.flatMap((r) => allowed(r.spec.allow?.[field])))].sort(),
    deny: [...new Set(roles.flatMap((r) => expandTemplates(r.spec.deny?.[field], traits)))].sort(),
  });
  return { users: list('db_users'), names: list('db_names') };
}

/** kubernetes_users and kubernetes_groups of every role, templates expanded, a deny in any role removing a value. */
export function kubeGrant(roles: readonly Role[], traits: Readonly<Traits>): KubeGrant {
  return { users: allowedValues(roles, 'kubernetes_users', traits), groups: allowedValues(roles, 'kubernetes_groups', traits) };
}

/** Whom a Kubernetes request acts as: one function for the Proxy's kube route and the agent's end-to-end kube streams. */
export { kubeImpersonation } from '../wire/kubeimpersonate.js';
