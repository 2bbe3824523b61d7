/**
 * The Negotiate scheme's decisions (src/dial/auth/negotiate.ts) with a stand-in GSSAPI binding: the service
 * principal it asks for, SPNEGO, a refusal ends the exchange, a loop is bounded, GSSAPI's failures and a missing
 * binding get their codes, and `can` says what dial-plan prints. The real tokens, from a real KDC and accepted by a
 * real squid, are in test/dial/lab-kerberos.test.ts.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseChallenges } from '../../../src/dial/auth/challenge.js';
import { kerberosCredentials, loadGssapi, makeNegotiateScheme, MAX_ROUNDS, negotiateSession, type GssapiBinding } from '../../../src/dial/auth/negotiate.js';
import type { ProxySpec } from '../../../src/dial/select.js';
import { codeOf, codeOfSync } from '../../helpers/errors.js';

function fakeBinding(steps: Array<string | Error>, seen: { service?: string; mech?: number; tokens: string[] }): GssapiBinding {
  return {
    GSS_MECH_OID_SPNEGO: 6,
    GSS_C_MUTUAL_FLAG: 2,
    GSS_C_SEQUENCE_FLAG: 8,
    async initializeClient(service, options) {
      seen.service = service;
      seen.mech = options?.mechOID;
      return {
        contextComplete: false,
        async step(challenge: string) {
          seen.tokens.push(challenge);
          const next = steps.shift() ?? 'more';
          if (next instanceof Error) throw next;
          return next;
        },
      };
    },
  };
}

const ch = (value: string) => parseChallenges([value]);
const proxy: ProxySpec = { protocol: 'http', host: 'proxy.corp.example', port: 3128, display: 'http://proxy.corp.example:3128', source: 'HTTPS_PROXY' };

describe('the Negotiate session', () => {
  it("asks GSSAPI for HTTP@<proxy host> with SPNEGO, sends its token, and passes the proxy's on", async () => {
    const seen = { tokens: [] as string[] };
    const s = negotiateSession('proxy.corp.example', () => fakeBinding(['YIIB', 'oRsw'], seen));
    expect(await s.respond(ch('Negotiate'))).toBe('Negotiate YIIB');
    expect(seen).toMatchObject({ service: 'HTTP@proxy.corp.example', mech: 6 });
    expect(await s.respond(ch('Negotiate oYGa'))).toBe('Negotiate oRsw');
    expect(seen.tokens).toEqual(['', 'oYGa']);
  });

  it('takes a bare Negotiate after its token as a refusal: nothing more to say', async () => {
    const s = negotiateSession('p', () => fakeBinding(['YIIB'], { tokens: [] }));
    await s.respond(ch('Negotiate'));
    expect(await s.respond(ch('Negotiate'))).toBeUndefined();
  });

  it(`answers at most ${MAX_ROUNDS} times in all (a challenge loop)`, async () => {
    const s = negotiateSession('p', () => fakeBinding([], { tokens: [] }));
    const answers: Array<string | undefined> = [];
    for (let i = 0; i < MAX_ROUNDS + 2; i++) answers.push(await s.respond(ch(i === 0 ? 'Negotiate' : 'Negotiate oYGa')));
    expect(answers.filter((a) => a !== undefined)).toHaveLength(MAX_ROUNDS);
    expect(answers.at(-1)).toBeUndefined();
  });

  it("turns GSSAPI's failure into GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED with GSSAPI's reason and the principal", async () => {
    const s = negotiateSession('proxy.corp.example', () => fakeBinding([new Error('No Kerberos credentials available (default cache: FILE:/tmp/x)')], { tokens: [] }));
    const err = await s.respond(ch('Negotiate')).then(() => undefined, (e: Error) => e);
    expect(err).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
    expect(String(err)).toContain('HTTP@proxy.corp.example');
    expect(String(err)).toContain('No Kerberos credentials available');
  });

  it('a KDC that never answers: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED at the step deadline, not a hang', async () => {
    const hung: GssapiBinding = { ...fakeBinding([], { tokens: [] }), initializeClient: () => new Promise(() => undefined) };
    const err = await negotiateSession('proxy.corp.example', () => hung, 50).respond(ch('Negotiate')).then(() => undefined, (e: Error) => e);
    expect(err).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
    expect(String(err)).toContain('KDC reachable');
  });

  it('refuses a proxy token that is not base64 or is oversized', async () => {
    for (const bad of ['Negotiate abcde', 'Negotiate a-b_', `Negotiate ${'A'.repeat(70_000)}`, 'Negotiate realm="x"']) {
      const s = negotiateSession('p', () => fakeBinding(['YIIB'], { tokens: [] }));
      await s.respond(ch('Negotiate'));
      expect(await codeOf(s.respond(ch(bad))), bad).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    }
  });

  it('says the binding is missing with GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE (no crash)', () => {
    expect(codeOfSync(() => loadGssapi('/nonexistent/kerberos'))).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE');
  });
});

describe('can: what dial-plan says, and the error a dial gets when Negotiate is all the proxy offers', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gw-negotiate-'));
  const cache = join(dir, 'ccache');
  const keytab = join(dir, 'agent.keytab');
  writeFileSync(cache, 'x');
  writeFileSync(keytab, 'x');
  const binding = fakeBinding([], { tokens: [] });

  it('without credentials the module is not looked at: what to do first is kinit', () => {
    expect(makeNegotiateScheme({ binding: '/nonexistent/kerberos', env: { KRB5CCNAME: join(dir, 'none') } }).can(proxy)).toMatchObject({ ok: false, code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
  });

  it('without the kerberos module: the fix, and GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE', () => {
    const can = makeNegotiateScheme({ binding: '/nonexistent/kerberos', env: { KRB5CCNAME: cache } }).can(proxy);
    expect(can).toMatchObject({ ok: false, code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE' });
    expect(can.why).toContain('apt-get install libkrb5-dev');
  });

  it('with a credential cache, a keytab, or neither', () => {
    expect(makeNegotiateScheme({ binding, env: { KRB5CCNAME: `FILE:${cache}` } }).can(proxy)).toEqual({
      ok: true,
      why: `Kerberos (SPNEGO) for HTTP@proxy.corp.example with the ticket in KRB5CCNAME=FILE:${cache}`,
    });
    expect(makeNegotiateScheme({ binding, env: { KRB5_CLIENT_KTNAME: keytab } }).can(proxy).why).toContain(`client keytab KRB5_CLIENT_KTNAME=${keytab}`);
    expect(makeNegotiateScheme({ binding, env: { KRB5CCNAME: join(dir, 'none') } }).can(proxy)).toMatchObject({ ok: false, code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
    expect(makeNegotiateScheme({ binding, env: { KRB5_CLIENT_KTNAME: join(dir, 'none.keytab') } }).can(proxy).ok).toBe(false);
  });

  it('the default cache /tmp/krb5cc_<uid> when no variable is set', () => {
    expect(kerberosCredentials({}, 987_654_321)).toMatchObject({ ok: false, why: expect.stringContaining('run kinit') });
    // A credential cache of another kind (KEYRING:, KCM:) is GSSAPI's to find: taken as given.
    expect(kerberosCredentials({ KRB5CCNAME: 'KEYRING:persistent:0' }).ok).toBe(true);
  });
});
