/**
 * SAML 2.0 sign-in (src/auth/sso/saml.ts through src/auth/ssoapi.ts): our SP-initiated AuthnRequest by the
 * HTTP-Redirect binding, answered by samlify acting as the identity provider (with its schema validator), the
 * response POSTed to our ACS and checked by @node-saml/node-saml. Hostile: an assertion signed by another key,
 * altered after signing, for another audience, from another issuer, expired, unsolicited (no InResponseTo),
 * replayed; a mapping without a role. Every refusal is checked by its code and the check it names.
 */
import { createVerify } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { inflateRawSync } from 'node:zlib';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createApiHandler } from '../../src/auth/api.js';
import { generateKeyPair } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { parseIdpMetadata } from '../../src/auth/sso/saml.js';
import { openSqliteBackend, type Backend } from '../../src/backend/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { makeTestPki } from '../helpers/tls.js';
import { rsaKeyPair, answerCode, request, startSamlIdp, type Answer, type SamlAnswer, type SamlIdp, type SamlTamper } from '../helpers/sso.js';

const ACS = 'https://gateway.example/webapi/sso/saml/acs';
const SP_ENTITY = 'https://gateway.example/saml/sp';
let dir: string;
let idp: SamlIdp;
let backend: Backend;
let auth: AuthService;
let server: https.Server;
let base: string;

const api = (path: string, options: Parameters<typeof request>[1] = {}) => request(`${base}${path}`, { ca: auth.host.tls.certPem, ...options });

/** The login start: the identity provider's URL (with our AuthnRequest) and the browser binding. */
async function start(redirect = '/web/'): Promise<{ url: string; binding: string }> {
  const started = await api(`/webapi/sso/saml/okta/login?redirect=${encodeURIComponent(redirect)}`);
  expect(started.status, started.text).toBe(302);
  return { url: started.location!, binding: /__Host-gw_sso=([^;]+)/.exec(String(started.headers['set-cookie']))![1]! };
}

/** The browser POSTs the identity provider's answer to our ACS (a cross-site form post: Origin is the provider's). */
function post(answer: SamlAnswer, binding: string | undefined, origin = 'https://idp.example'): Promise<Answer> {
  return api('/webapi/sso/saml/acs', {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json', origin, ...(binding ? { cookie: `__Host-gw_sso=${binding}` } : {}) },
    body: new URLSearchParams({ SAMLResponse: answer.SAMLResponse, RelayState: answer.RelayState }).toString(),
  });
}

async function signIn(user: string, groups: string[], tamper?: SamlTamper): Promise<Answer> {
  const s = await start();
  return post(await idp.respond(s.url, user, groups, tamper), s.binding);
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'gw-saml-'));
  idp = await startSamlIdp(dir, { entityId: SP_ENTITY, acs: ACS });
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

beforeEach(async () => {
  backend?.close();
  server?.close();
  backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'saml.example', dialer: new Dialer({ env: {} }) });
  await auth.createResources(auth.adminIdentity(), [{
    kind: 'saml', version: 'v2', metadata: { name: 'okta' },
    spec: { acs: ACS, service_provider_issuer: SP_ENTITY, entity_descriptor: idp.metadata, display: 'Okta', attributes_to_roles: [{ name: 'groups', value: 'admins', roles: ['editor'] }, { name: 'groups', value: 'dev*', roles: ['access'] }] },
  } as never], false);
  const keys = generateKeyPair();
  const cert = await auth.issueServerCert(keys.publicKeyPem, ['localhost']);
  server = https.createServer({ key: keys.privateKeyPem, cert }, createApiHandler(auth));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

describe('SAML sign-in', () => {
  it('reads the identity provider from its metadata', () => {
    const md = parseIdpMetadata(idp.metadata);
    expect(md.entityId).toBe(idp.entityId);
    expect(md.ssoUrl).toBe('https://idp.example/sso');
    expect(md.certs[0]).toMatch(/^-----BEGIN CERTIFICATE-----/);
  });

  it('sends an AuthnRequest by HTTP-Redirect (our entity ID, our ACS, RelayState = the state)', async () => {
    const { url } = await start();
    const u = new URL(url);
    expect(u.origin + u.pathname).toBe('https://idp.example/sso');
    const xml = inflateRawSync(Buffer.from(u.searchParams.get('SAMLRequest')!, 'base64')).toString();
    expect(xml).toContain(`AssertionConsumerServiceURL="${ACS}"`);
    expect(xml).toContain(`>${SP_ENTITY}</saml:Issuer>`);
    expect(u.searchParams.get('RelayState')).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });

  it('with signing_key_pair the AuthnRequest is signed (RSA-SHA256 over the redirect binding\'s query)', async () => {
    const pair = rsaKeyPair(dir, 'sp-signing');
    await auth.createResources(auth.adminIdentity(), [{
      kind: 'saml', version: 'v2', metadata: { name: 'signed' },
      spec: { acs: ACS, service_provider_issuer: SP_ENTITY, entity_descriptor: idp.metadata, signing_key_pair: { cert: pair.cert, private_key: pair.key }, attributes_to_roles: [{ name: 'groups', value: 'x', roles: ['access'] }] },
    } as never], false);
    const u = new URL((await api('/webapi/sso/saml/signed/login')).location!);
    expect(u.searchParams.get('SigAlg')).toBe('http://www.w3.org/2001/04/xmldsig-more#rsa-sha256');
    const signed = u.search.slice(1).split('&').filter((p) => !p.startsWith('Signature=')).join('&');
    expect(createVerify('RSA-SHA256').update(signed).verify(pair.cert, u.searchParams.get('Signature')!, 'base64')).toBe(true);
  });

  it('a signed assertion for us creates the web session with the mapped roles', async () => {
    const done = await signIn('carol', ['admins', 'developers']);
    expect(done.status, done.text).toBe(302);
    expect(done.location).toBe(`${base}/web/sso-complete?redirect=%2Fweb%2F`);
    const session = /__Host-gw_session=([A-Za-z0-9_-]{43})/.exec(String(done.headers['set-cookie']))![1]!;
    const handout = await api('/webapi/sessions/bearer', { method: 'POST', headers: { cookie: `__Host-gw_session=${session}`, origin: base } });
    expect(handout.json().user).toMatchObject({ name: 'carol', roles: ['editor', 'access'] });
  });

  it('the ACS takes the browser\'s cross-site POST whatever its Origin (the provider\'s, or "null" under no-referrer)', async () => {
    const s = await start();
    const done = await post(await idp.respond(s.url, 'dave', ['developers']), s.binding, 'null');
    expect(done.status, done.text).toBe(302);
  });
});

describe('SAML metadata from entity_descriptor_url (through the Dialer, the connector\'s ca trusted)', () => {
  it('is fetched over HTTPS and used; a metadata server that is down → GW_ERR_SSO_IDP_ERROR', async () => {
    const pki = await makeTestPki();
    try {
      const cert = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
      const md = https.createServer({ key: cert.keyPem, cert: cert.certPem }, (_req, res) => res.writeHead(200, { 'content-type': 'application/xml' }).end(idp.metadata));
      await new Promise<void>((r) => md.listen(0, '127.0.0.1', r));
      const url = `https://127.0.0.1:${(md.address() as AddressInfo).port}/metadata`;
      const spec = { acs: ACS, service_provider_issuer: SP_ENTITY, entity_descriptor_url: url, ca: pki.caPem, attributes_to_roles: [{ name: 'groups', value: 'dev*', roles: ['access'] }] };
      await auth.createResources(auth.adminIdentity(), [{ kind: 'saml', version: 'v2', metadata: { name: 'by-url' }, spec } as never], false);
      const started = await api('/webapi/sso/saml/by-url/login');
      expect(started.status, started.text).toBe(302);
      expect(started.location!.startsWith('https://idp.example/sso?SAMLRequest=')).toBe(true);
      await new Promise<void>((r) => md.close(() => r()));
      await auth.createResources(auth.adminIdentity(), [{ kind: 'saml', version: 'v2', metadata: { name: 'down' }, spec: { ...spec, entity_descriptor_url: `${url}?down` } } as never], false);
      const down = await api('/webapi/sso/saml/down/login');
      expect(answerCode(down)).toBe('GW_ERR_SSO_IDP_ERROR');
    } finally {
      await pki.cleanup();
    }
  });
});

describe('SAML: what is refused', () => {
  it.each([
    ['signed by another key', 'signature', { otherKey: true }],
    ['altered after signing', 'signature', { alter: (xml: string) => xml.replace('>developers<', '>admins<') }],
    ['for another audience', 'audience', { audience: 'https://someone-else.example/sp' }],
    ['expired', 'expired', { shiftMs: -3600_000 }],
    ['unsolicited (no InResponseTo)', 'in_response_to', { unsolicited: true }],
    ['from another issuer', 'issuer', { issuer: 'https://evil.example/idp' }],
  ] as Array<[string, string, SamlTamper]>)('an assertion %s → GW_ERR_SSO_TOKEN_INVALID naming the %s check', async (_what, check, tamper) => {
    const refused = await signIn('carol', ['developers'], tamper);
    expect(answerCode(refused), refused.text).toBe('GW_ERR_SSO_TOKEN_INVALID');
    expect(refused.status).toBe(401);
    expect(refused.json().error.message).toContain(`the ${check} check`);
    expect(String(refused.headers['set-cookie'] ?? '')).not.toMatch(/__Host-gw_session=[^;]/);
  });

  it('a replayed response → GW_ERR_SSO_STATE_INVALID', async () => {
    const s = await start();
    const answer = await idp.respond(s.url, 'carol', ['developers']);
    expect((await post(answer, s.binding)).status).toBe(302);
    expect(answerCode(await post(answer, s.binding))).toBe('GW_ERR_SSO_STATE_INVALID');
  });

  it('the answer to another sign-in request (InResponseTo of another state) → refused', async () => {
    const first = await start();
    const second = await start();
    const answer = await idp.respond(first.url, 'carol', ['developers']);
    const swapped = { ...answer, RelayState: new URL(second.url).searchParams.get('RelayState')! };
    const refused = await post(swapped, second.binding);
    expect(answerCode(refused)).toBe('GW_ERR_SSO_TOKEN_INVALID');
    expect(refused.json().error.message).toContain('the in_response_to check');
  });

  it('a user whose attributes map to no role → GW_ERR_SSO_NO_ROLES', async () => {
    const refused = await signIn('eve', ['marketing']);
    expect(answerCode(refused)).toBe('GW_ERR_SSO_NO_ROLES');
    expect(refused.status).toBe(403);
  });

  it('a response over the ACS\'s size cap is refused before it is parsed → GW_ERR_API_TOO_LARGE', async () => {
    const s = await start();
    const huge = await post({ SAMLResponse: 'A'.repeat(300 * 1024), RelayState: new URL(s.url).searchParams.get('RelayState')! }, s.binding);
    expect(answerCode(huge)).toBe('GW_ERR_API_TOO_LARGE');
    expect(huge.status).toBe(413);
  });

  it('garbage instead of a response, and no RelayState, are refused with codes', async () => {
    const s = await start();
    const garbage = await post({ SAMLResponse: Buffer.from('<not-saml/>').toString('base64'), RelayState: new URL(s.url).searchParams.get('RelayState')! }, s.binding);
    expect(answerCode(garbage)).toBe('GW_ERR_SSO_TOKEN_INVALID');
    expect(answerCode(await post({ SAMLResponse: 'AAAA', RelayState: '' }, s.binding))).toBe('GW_ERR_SSO_STATE_INVALID');
  });
});
