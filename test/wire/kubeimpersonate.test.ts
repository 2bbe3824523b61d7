/**
 * Whom a Kubernetes request acts as (src/wire/kubeimpersonate.ts), the one rule the Proxy's kube route and the agent
 * serving an end-to-end kube stream both apply, and the kube grant's kube_access, which carries its input to the
 * agent (src/tunnel/e2e.ts badGrant). Each check is shown refusing what it must refuse.
 */
import { describe, expect, it } from 'vitest';
import { decodeGrant, type E2EGrant } from '../../src/tunnel/e2e.js';
import { badKubeAccess, impersonate, KUBE_ACCESS_MAX_ENTRIES, kubePathOf, kubeStatus } from '../../src/wire/kubeimpersonate.js';
import { GatewayError } from '../../src/errors.js';

/** A request's headers as Node gives them: lower-case names, duplicates in headersDistinct. */
function request(headers: Record<string, string | string[]>) {
  const flat: Record<string, string | string[]> = {};
  const distinct: Record<string, string[]> = {};
  for (const [k, v] of Object.entries(headers)) {
    flat[k] = Array.isArray(v) ? v.join(', ') : v;
    distinct[k] = Array.isArray(v) ? v : [v];
  }
  return { headers: flat as Record<string, string | string[] | undefined>, headersDistinct: distinct };
}

const codeOf = (f: () => unknown) => {
  try {
    f();
  } catch (err) {
    return (err as GatewayError).code;
  }
  return 'no error';
};

describe('impersonate: the decision, every client Impersonate-* header dropped, the decision set', () => {
  const access = { users: ['alice-k8s'], groups: ['devs'] };

  it('no --as: the one allowed user and every allowed group; the headers the client sent are gone', () => {
    const req = request({ accept: 'application/json', 'impersonate-uid': '0', 'impersonate-extra-scopes': 'all' });
    const as = impersonate(req, access, 'alice');
    expect(as.headers).toEqual({ 'impersonate-user': 'alice-k8s', 'impersonate-group': ['devs'] });
    expect(req.headers).toEqual({ accept: 'application/json' });
  });

  it('--as / --as-group pick among the allowed only: system:admin and system:masters are refused, nothing is removed', () => {
    const admin = request({ 'impersonate-user': 'system:admin' });
    expect(codeOf(() => impersonate(admin, access, 'alice'))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    expect(admin.headers['impersonate-user']).toBe('system:admin');
    expect(codeOf(() => impersonate(request({ 'impersonate-group': ['devs', 'system:masters'] }), access, 'alice'))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    const picked = request({ 'impersonate-user': 'alice-k8s', 'impersonate-group': 'devs' });
    expect(impersonate(picked, { users: ['alice-k8s', 'sre'], groups: ['devs', 'ops'] }, 'alice').headers).toEqual({ 'impersonate-user': 'alice-k8s', 'impersonate-group': ['devs'] });
    expect(picked.headers).toEqual({});
  });

  it('roles that allow no user and no group: refused (a grant that says so is refused too)', () => {
    expect(codeOf(() => impersonate(request({}), { users: [], groups: [] }, 'nora'))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    expect(codeOf(() => impersonate(request({}), undefined, 'nora'))).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
    // Groups only: the user is the gateway user's own name.
    expect(impersonate(request({}), { users: [], groups: ['viewers'] }, 'nora').headers).toEqual({ 'impersonate-user': 'nora', 'impersonate-group': ['viewers'] });
  });
});

describe('kubePathOf and kubeStatus', () => {
  it('takes /k8s/<cluster> off, decoding the cluster; anything else is not a Kubernetes path', () => {
    expect(kubePathOf('/k8s/dev/api/v1/pods?watch=1')).toEqual({ cluster: 'dev', path: '/api/v1/pods?watch=1' });
    expect(kubePathOf('/k8s/my%20cluster')).toEqual({ cluster: 'my cluster', path: '/' });
    expect(kubePathOf('/api/v1/pods')).toBeUndefined();
    expect(kubePathOf('/k8s/%E0%A4%A/api')).toBeUndefined();
  });

  it('a refusal as the Status kubectl prints: code, reason, the gateway code in the message', () => {
    expect(kubeStatus(new GatewayError('GW_ERR_KUBE_NO_IMPERSONATION', 'no'))).toMatchObject({ kind: 'Status', code: 403, reason: 'Forbidden', message: expect.stringMatching(/^GW_ERR_KUBE_NO_IMPERSONATION: no/) });
  });
});

describe("a kube grant's kube_access", () => {
  const grant = (over: Record<string, unknown> = {}): E2EGrant & Record<string, unknown> => ({
    v: 1, id: '0123456789abcdef0123456789abcdef', iss: 'proxy', sub: 'alice', key: 'A'.repeat(43), roles: ['k8s-dev'],
    service: 'kube', resource: 'dev', agent: 'agent', kube_access: { users: ['alice-k8s'], groups: ['devs'] }, iat: 1, exp: 2, ...over,
  });
  const enc = (v: unknown) => `${Buffer.from(JSON.stringify(v)).toString('base64url')}.sig`;

  it('is required on a kube grant, of the right shape and bounded; other services carry none', () => {
    expect(decodeGrant(enc(grant()))).toMatchObject({ ok: true, grant: { kube_access: { users: ['alice-k8s'], groups: ['devs'] } } });
    // Without it the agent would have nothing to impersonate from: the client's own headers must never decide.
    expect(decodeGrant(enc(grant({ kube_access: undefined })))).toMatchObject({ ok: false, why: expect.stringContaining('kube_access') });
    expect(decodeGrant(enc(grant({ kube_access: { users: 'alice-k8s', groups: [] } })))).toMatchObject({ ok: false, why: expect.stringContaining('users') });
    expect(decodeGrant(enc(grant({ kube_access: { users: ['a\nb'], groups: [] } })))).toMatchObject({ ok: false, why: expect.stringContaining('printable') });
    expect(decodeGrant(enc(grant({ kube_access: { users: [], groups: Array(KUBE_ACCESS_MAX_ENTRIES + 1).fill('g') } })))).toMatchObject({ ok: false, why: expect.stringContaining('groups') });
    expect(decodeGrant(enc(grant({ kube_access: { users: [], groups: [], extra: { scopes: ['*'] } } })))).toMatchObject({ ok: false, why: expect.stringContaining('other') });
    expect(decodeGrant(enc(grant({ service: 'app' })))).toMatchObject({ ok: false, why: expect.stringContaining('kube grant only') });
    expect(decodeGrant(enc(grant({ service: 'app', kube_access: undefined })))).toMatchObject({ ok: true });
  });

  it('badKubeAccess: names of at most 512 printable characters', () => {
    expect(badKubeAccess({ users: ['x'.repeat(512)], groups: [] })).toBeUndefined();
    expect(badKubeAccess({ users: ['x'.repeat(513)], groups: [] })).toContain('printable');
    expect(badKubeAccess(null)).toBe('is not an object');
  });
});
