/**
 * The stand-in API server's authorizer: RBAC PolicyRules evaluated as k8s.io/kubernetes/pkg/apis/rbac/v1's
 * helpers do (VerbMatches, APIGroupMatches, ResourceMatches with "resource/subresource" and "*\/subresource",
 * ResourceNameMatches, NonResourceURLMatches with a trailing "*"), plus how a request becomes attributes
 * (RequestInfoFactory: verb from the method, list vs get by the name, watch=true, the subresource).
 *
 * Not the real thing: the rules are not read from Role/ClusterRole/Binding objects (there is no storage); the
 * test passes bindings (subjects + rules, a namespace for a RoleBinding) and can replace them at any time. One
 * binding is built in, as the real server's bootstrap policy binds system:discovery and system:public-info-viewer
 * to system:authenticated: every authenticated user may GET the discovery paths.
 */

export interface PolicyRule {
  verbs: string[];
  apiGroups?: string[];
  resources?: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
}

/** A ClusterRoleBinding (no namespace) or a RoleBinding (namespace) with its role's rules inline. */
export interface Binding {
  users?: string[];
  groups?: string[];
  namespace?: string;
  rules: PolicyRule[];
}

export interface UserInfo {
  name: string;
  groups: string[];
  uid?: string;
  extra?: Record<string, string[]>;
}

export interface Attributes {
  user: UserInfo;
  verb: string;
  resourceRequest: boolean;
  path: string;
  apiGroup: string;
  apiVersion: string;
  namespace: string;
  resource: string;
  subresource: string;
  name: string;
}

export const DISCOVERY_BINDING: Binding = {
  groups: ['system:authenticated'],
  rules: [{ verbs: ['get'], nonResourceURLs: ['/api', '/api/*', '/apis', '/apis/*', '/version', '/version/', '/openapi', '/openapi/*', '/healthz', '/livez', '/readyz'] }],
};

const has = (list: string[] | undefined, v: string) => (list ?? []).includes('*') || (list ?? []).includes(v);

function resourceMatches(rule: PolicyRule, a: Attributes): boolean {
  const combined = a.subresource ? `${a.resource}/${a.subresource}` : a.resource;
  return (rule.resources ?? []).some((r) => r === '*' || r === combined || (a.subresource !== '' && r === `*/${a.subresource}`));
}

function nonResourceMatches(rule: PolicyRule, path: string): boolean {
  return (rule.nonResourceURLs ?? []).some((u) => u === '*' || u === path || (u.endsWith('*') && path.startsWith(u.slice(0, -1))));
}

export function ruleAllows(rule: PolicyRule, a: Attributes): boolean {
  if (!has(rule.verbs, a.verb)) return false;
  if (!a.resourceRequest) return nonResourceMatches(rule, a.path);
  return has(rule.apiGroups, a.apiGroup) && resourceMatches(rule, a) && ((rule.resourceNames ?? []).length === 0 || rule.resourceNames!.includes(a.name));
}

function applies(b: Binding, a: Attributes): boolean {
  if (b.namespace !== undefined && b.namespace !== a.namespace) return false;
  return (b.users ?? []).includes(a.user.name) || (b.groups ?? []).some((g) => a.user.groups.includes(g));
}

export function authorize(bindings: Binding[], a: Attributes): boolean {
  return [DISCOVERY_BINDING, ...bindings].some((b) => applies(b, a) && b.rules.some((r) => ruleAllows(r, a)));
}

const VERBS: Record<string, string> = { POST: 'create', PUT: 'update', PATCH: 'patch', DELETE: 'delete', GET: 'get', HEAD: 'get' };

/** RequestInfoFactory.NewRequestInfo, for /api/v1/... and /apis/<group>/<version>/...; anything else is a non-resource path. */
export function attributesOf(user: UserInfo, method: string, url: URL): Attributes {
  const path = url.pathname;
  const base: Attributes = { user, verb: (VERBS[method] ?? method.toLowerCase()), resourceRequest: false, path, apiGroup: '', apiVersion: '', namespace: '', resource: '', subresource: '', name: '' };
  const parts = path.split('/').filter((p) => p !== '');
  let rest: string[];
  if (parts[0] === 'api' && parts.length >= 3) {
    base.apiVersion = parts[1]!;
    rest = parts.slice(2);
  } else if (parts[0] === 'apis' && parts.length >= 4) {
    base.apiGroup = parts[1]!;
    base.apiVersion = parts[2]!;
    rest = parts.slice(3);
  } else {
    return base;
  }
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    base.namespace = rest[1]!;
    rest = rest.slice(2);
  } else if (rest[0] === 'namespaces' && rest.length === 2) {
    base.namespace = rest[1]!; // GET /api/v1/namespaces/x is the namespace object itself
  }
  const [resource = '', name = '', subresource = ''] = rest;
  Object.assign(base, { resourceRequest: true, resource, name, subresource });
  if (base.verb === 'get' && name === '') base.verb = url.searchParams.get('watch') === 'true' ? 'watch' : 'list';
  if (base.verb === 'delete' && name === '') base.verb = 'deletecollection';
  return base;
}
