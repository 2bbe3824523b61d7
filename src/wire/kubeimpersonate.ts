/**
 * Whom a Kubernetes request acts as, decided in one place for both ends that may decide it: the Proxy's kube route
 * (src/proxy/webapps.ts, the classic route: the Proxy reads the HTTP) and the agent serving an end-to-end kube
 * stream (src/agent/kubeapi.ts: the Proxy only routed the bytes, so the agent reads the HTTP and impersonates from
 * the grant). Both take the same input, the Kubernetes users and groups the user's roles allow (KubeAccess: rbac.ts
 * kubeGrant at the Proxy; the grant's kube_access at the agent, which the Proxy computed the same way), and apply it
 * the same way to a request's headers:
 *
 *   1. the client's Impersonate-User and Impersonate-Group (kubectl --as / --as-group) only pick among what is
 *      allowed (kubeImpersonation; anything else is GW_ERR_KUBE_NO_IMPERSONATION, nothing sent on);
 *   2. every Impersonate-* header the client sent (-User, -Group, -Uid, -Extra-*) is removed;
 *   3. Impersonate-User and Impersonate-Group are set to the decision; the API server then checks that the
 *      credential it sees (the agent's) may impersonate them, and what they may do.
 *
 * Also here: the /k8s/<cluster> path prefix both routes take requests under (kubePathOf), a refusal as the
 * Kubernetes Status kubectl prints (kubeStatus), and the shape check of a KubeAccess a grant carries (badKubeAccess). A transport-layer file so that the Proxy and the agent import it
 * without importing each other (test/architecture.test.ts).
 */
import { GatewayError, httpStatus } from '../errors.js';

/** Kubernetes users and groups a user may act as (rbac.ts kubeGrant: allowed minus denied, templates expanded). */
export interface KubeAccess {
  users: string[];
  groups: string[];
}

/** The path prefix of Kubernetes requests: /k8s/<cluster>/<API server path>. */
export const KUBE_PATH_PREFIX = '/k8s/';
/** Caps on a KubeAccess a grant carries: entries per list and characters per name. */
export const KUBE_ACCESS_MAX_ENTRIES = 256;
export const KUBE_ACCESS_MAX_NAME = 512;

/** The request headers impersonation reads: a Node IncomingMessage has both. */
export interface ImpersonationInput {
  headers: Record<string, string | string[] | undefined>;
  headersDistinct: Record<string, string[] | undefined>;
}

/**
 * Who the API server acts as (Impersonate-User, Impersonate-Group), as upstream decides it: the user the client
 * asked for (kubectl --as) if the roles allow it, else the one kubernetes_users entry, else (no kubernetes_users)
 * the gateway user's own name; the groups the client asked for (--as-group) if each is allowed, else every allowed
 * group. Refused (GW_ERR_KUBE_NO_IMPERSONATION) when the roles allow no user and no group, when the client asks
 * for one they do not allow, or when several users are allowed and none was asked.
 */
export function kubeImpersonation(grant: KubeAccess | undefined, name: string, asked: { user?: string | undefined; groups?: readonly string[] }): { user: string; groups: string[] } {
  const users = grant?.users ?? [];
  const groups = grant?.groups ?? [];
  requireKubeAccess(grant, name);
  const refuse = (message: string) => new GatewayError('GW_ERR_KUBE_NO_IMPERSONATION', message);
  let user: string;
  if (asked.user !== undefined) {
    if (!users.includes(asked.user)) throw refuse(`your roles do not allow acting as the Kubernetes user "${asked.user}" (allowed: ${users.join(', ') || 'none'})`);
    user = asked.user;
  } else if (users.length > 1) {
    throw refuse(`your roles allow several Kubernetes users (${users.join(', ')}): pick one with kubectl --as`);
  } else {
    user = users[0] ?? name;
  }
  const chosen = asked.groups && asked.groups.length > 0 ? [...new Set(asked.groups)] : groups;
  const foreign = chosen.filter((g) => !groups.includes(g));
  if (foreign.length > 0) throw refuse(`your roles do not allow acting in the Kubernetes group(s) ${foreign.join(', ')} (allowed: ${groups.join(', ') || 'none'})`);
  return { user, groups: chosen };
}

/** The access itself, or GW_ERR_KUBE_NO_IMPERSONATION when it allows no user and no group (checked before any dial). */
export function requireKubeAccess(grant: KubeAccess | undefined, name: string): KubeAccess {
  if (!grant || (grant.users.length === 0 && grant.groups.length === 0)) {
    throw new GatewayError('GW_ERR_KUBE_NO_IMPERSONATION', `your roles allow no Kubernetes user or group (kubernetes_users and kubernetes_groups are empty for "${name}")`);
  }
  return grant;
}

/**
 * Steps 1 to 3 on one request: the decision from the client's own Impersonate-User/-Group (see kubeImpersonation),
 * every Impersonate-* header removed from req.headers, and the headers to send instead. Throws before touching
 * req when refused.
 */
export function impersonate(req: ImpersonationInput, grant: KubeAccess | undefined, name: string): { user: string; groups: string[]; headers: Record<string, string | string[]> } {
  const as = kubeImpersonation(grant, name, {
    user: req.headersDistinct['impersonate-user']?.[0],
    groups: req.headersDistinct['impersonate-group'] ?? [],
  });
  for (const h of Object.keys(req.headers)) if (h.toLowerCase().startsWith('impersonate-')) delete req.headers[h];
  return { ...as, headers: { 'impersonate-user': as.user, ...(as.groups.length > 0 ? { 'impersonate-group': as.groups } : {}) } };
}

/** A request URL under /k8s/<cluster>: the cluster (percent-decoded) and the API server's path; undefined otherwise. */
export function kubePathOf(url: string): { cluster: string; path: string } | undefined {
  if (!url.startsWith(KUBE_PATH_PREFIX)) return undefined;
  const rest = url.slice(KUBE_PATH_PREFIX.length);
  const slash = rest.indexOf('/');
  let cluster: string;
  try {
    cluster = decodeURIComponent(slash < 0 ? rest : rest.slice(0, slash));
  } catch {
    return undefined;
  }
  return { cluster, path: slash < 0 ? '/' : rest.slice(slash) };
}

/** Why a value is not a KubeAccess a grant may carry (bounded lists of printable names), or undefined. */
export function badKubeAccess(v: unknown): string | undefined {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return 'is not an object';
  const a = v as Record<string, unknown>;
  for (const f of ['users', 'groups'] as const) {
    const list = a[f];
    if (!Array.isArray(list) || list.length > KUBE_ACCESS_MAX_ENTRIES) return `has no list of at most ${KUBE_ACCESS_MAX_ENTRIES} ${f}`;
    // eslint-disable-next-line no-control-regex
    if (!list.every((x) => typeof x === 'string' && x.length > 0 && x.length <= KUBE_ACCESS_MAX_NAME && !/[\u0000-\u001f\u007f]/.test(x))) return `has ${f} that are not printable names of at most ${KUBE_ACCESS_MAX_NAME} characters`;
  }
  if (Object.keys(a).length !== 2) return 'has fields other than users and groups';
  return undefined;
}

/** Kubernetes' Status reasons by HTTP status (kubectl prints "Error from server (<reason>): <message>"). */
const KUBE_REASONS: Record<number, string> = {
  400: 'BadRequest', 401: 'Unauthorized', 403: 'Forbidden', 404: 'NotFound', 405: 'MethodNotAllowed', 409: 'Conflict',
  413: 'RequestEntityTooLarge', 429: 'TooManyRequests', 503: 'ServiceUnavailable', 504: 'Timeout',
};

/**
 * A gateway refusal as a Kubernetes Status (kind Status, reason, code, message), so that kubectl prints the
 * gateway's code, message and hint instead of "unknown"; the gateway's `error` object rides along for gateway
 * clients (kubectl ignores fields it does not know).
 */
export function kubeStatus(e: GatewayError): Record<string, unknown> {
  const code = httpStatus(e.code);
  return {
    kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure',
    message: `${e.code}: ${e.message}${e.hint ? ` (${e.hint})` : ''}`,
    reason: KUBE_REASONS[code] ?? (code >= 500 ? 'InternalError' : 'BadRequest'), code,
    error: e.toJSON(),
  };
}
