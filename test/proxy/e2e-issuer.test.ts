/**
 * Any Proxy checks a grant by itself (src/proxy/e2eissuer.ts): the issuer certificate the grant carries (x5c) must
 * chain to the cluster's host CA, be a host certificate with the role proxy named grant.iss, of a Proxy live now,
 * and the grant must be signed with its key. Each hostile token below is refused by the one check that stops it
 * (the others would pass it: each case is built to be good in every other respect).
 */
import { X509Certificate } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert, type CertAuthority } from '../../src/auth/pki.js';
import { GrantIssuers, ISSUER_CACHE_MAX } from '../../src/proxy/e2eissuer.js';
import { GRANT_TTL_MS, signGrant, type E2EGrant } from '../../src/tunnel/e2e.js';

const CLUSTER = 'issuer.example';
const NOW = Date.now();

interface Signer {
  key: string;
  x5c: string;
  name: string;
}

let hostCa: CertAuthority;
let otherCa: CertAuthority;
let proxy: Signer;
let otherProxy: Signer;
let foreignProxy: Signer;
let agent: Signer;
let userOnHostCa: Signer;
let expiredProxy: Signer;

async function signer(ca: CertAuthority, name: string, kind: 'host' | 'user', roles: string[], ttlMs = 3600_000): Promise<Signer> {
  const k = generateKeyPair();
  const pem = await issueTlsCert(ca, { publicKeyPem: k.publicKeyPem, identity: { kind, name, cluster: CLUSTER, roles }, ttlMs, usage: 'both' });
  return { key: k.privateKeyPem, x5c: new X509Certificate(pem).raw.toString('base64url'), name };
}

beforeAll(async () => {
  [hostCa, otherCa] = await Promise.all([generateAuthority('host', CLUSTER), generateAuthority('host', CLUSTER)]);
  proxy = await signer(hostCa, 'proxy-x', 'host', ['proxy']);
  otherProxy = await signer(hostCa, 'proxy-y', 'host', ['proxy']);
  foreignProxy = await signer(otherCa, 'proxy-x', 'host', ['proxy']);
  agent = await signer(hostCa, 'agent-1', 'host', ['app']);
  userOnHostCa = await signer(hostCa, 'proxy-x', 'user', ['proxy']);
  expiredProxy = await signer(hostCa, 'proxy-x', 'host', ['proxy'], 1);
});

function grant(over: Partial<E2EGrant> = {}): E2EGrant {
  return { v: 1, id: 'ab'.repeat(16), iss: 'proxy-x', sub: 'alice', key: 'k', roles: ['dev'], service: 'app', resource: 'echo', agent: 'agent-1', iat: NOW - 1000, exp: NOW + GRANT_TTL_MS, ...over };
}

/** A token signed by `by`, carrying `carried`'s certificate (by's own unless said). */
function token(by: Signer, over: Partial<E2EGrant> = {}, carried: Signer = by): string {
  return signGrant(grant({ iss: carried.name, x5c: carried.x5c, ...over }), by.key);
}

function issuers(live = new Set(['proxy-x', 'proxy-y', 'agent-1'])): GrantIssuers {
  return new GrantIssuers({ trust: { clusterName: CLUSTER, host: { tls: { certPem: hostCa.tls.certPem }, ssh: { publicKey: '' } } }, live: (id) => live.has(id) });
}

describe('GrantIssuers', () => {
  it('takes a grant of any live Proxy of the cluster, the one checking or another', () => {
    const check = issuers();
    expect(check.check(token(proxy), NOW)).toMatchObject({ ok: true, grant: { iss: 'proxy-x' } });
    expect(check.check(token(otherProxy), NOW)).toMatchObject({ ok: true, grant: { iss: 'proxy-y' } });
  });

  it('refuses an issuer certificate of another CA, even one naming a live Proxy with the role', () => {
    expect(issuers().check(token(foreignProxy), NOW)).toMatchObject({ ok: false, why: expect.stringContaining("host CA") });
  });

  it('refuses a user certificate and a host certificate without the role proxy, each signed by the host CA', () => {
    expect(issuers().check(token(userOnHostCa), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('user certificate') });
    expect(issuers().check(token(agent), NOW)).toMatchObject({ ok: false, why: expect.stringContaining("not a Proxy's") });
  });

  it('refuses a Proxy that is not live, and a grant naming another Proxy than its certificate', () => {
    expect(issuers(new Set(['proxy-y'])).check(token(proxy), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('not a live Proxy') });
    expect(issuers().check(token(proxy, { iss: 'proxy-y' }), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('names proxy-x') });
  });

  it("refuses a token re-signed by a key that is not its certificate's (an agent's key, another Proxy's)", () => {
    expect(issuers().check(token(agent, {}, proxy), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('signature') });
    expect(issuers().check(token(otherProxy, {}, proxy), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('signature') });
  });

  it('refuses an expired grant, an expired issuer certificate, a grant without x5c and an x5c that is no certificate', async () => {
    expect(issuers().check(token(proxy, { iat: NOW - 60_000, exp: NOW - 30_000 }), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('expired') });
    await new Promise((r) => setTimeout(r, 5));
    expect(issuers().check(token(expiredProxy), Date.now())).toMatchObject({ ok: false, why: expect.stringContaining('valid from') });
    expect(issuers().check(signGrant(grant(), proxy.key), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('x5c') });
    expect(issuers().check(signGrant(grant({ x5c: 'AAAA' }), proxy.key), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('not a certificate') });
  });

  it('a cached certificate is checked against the host CA again once the CA changes; the cache stays bounded', async () => {
    const trust = { clusterName: CLUSTER, host: { tls: { certPem: hostCa.tls.certPem }, ssh: { publicKey: '' } } };
    const check = new GrantIssuers({ trust, live: () => true });
    expect(check.check(token(proxy), NOW).ok).toBe(true);
    trust.host.tls.certPem = otherCa.tls.certPem;
    expect(check.check(token(proxy), NOW)).toMatchObject({ ok: false, why: expect.stringContaining('host CA') });
    trust.host.tls.certPem = hostCa.tls.certPem;
    const many = await Promise.all(Array.from({ length: ISSUER_CACHE_MAX + 3 }, (_, i) => signer(hostCa, `p${i}`, 'host', ['proxy'])));
    for (const s of many) expect(check.check(token(s), NOW).ok).toBe(true);
    expect(check.cached).toBeLessThanOrEqual(ISSUER_CACHE_MAX);
  }, 60_000);
});
