/**
 * The Negotiate scheme's decisions (src/dial/negotiate.ts) with a stand-in GSSAPI binding: the service principal
 * it asks for, SPNEGO, a refusal ends the exchange, a loop is bounded, GSSAPI's failures and a missing binding get
 * their codes. The real tokens, from a real KDC and accepted by a real squid, are in lab-kerberos.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { loadGssapi, MAX_ROUNDS, negotiateScheme, type GssapiBinding } from '../../src/dial/negotiate.js';
import { codeOf, codeOfSync } from '../helpers/errors.js';

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

describe('the Negotiate scheme', () => {
  it('asks GSSAPI for HTTP@<proxy host> with SPNEGO, sends its token, and passes the proxy\'s on', async () => {
    const seen = { tokens: [] as string[] };
    const s = negotiateScheme('proxy.corp.example', fakeBinding(['YIIB', 'oRsw'], seen));
    expect(s.name).toBe('Negotiate');
    expect(await s.first()).toBe('Negotiate YIIB');
    expect(seen).toMatchObject({ service: 'HTTP@proxy.corp.example', mech: 6 });
    expect(await s.next('Negotiate oYGa')).toBe('Negotiate oRsw');
    expect(seen.tokens).toEqual(['', 'oYGa']);
  });

  it('takes a bare Negotiate after its token as a refusal, and stops', async () => {
    const s = negotiateScheme('proxy.corp.example', fakeBinding(['YIIB'], { tokens: [] }));
    await s.first();
    expect(await codeOf(s.next('Negotiate'))).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
  });

  it(`gives up after ${MAX_ROUNDS} tokens on one connection (a challenge loop)`, async () => {
    const s = negotiateScheme('proxy.corp.example', fakeBinding([], { tokens: [] }));
    await s.first();
    const codes: string[] = [];
    for (let i = 0; i < MAX_ROUNDS + 2; i++) codes.push(await codeOf(s.next('Negotiate oYGa')));
    expect(codes.filter((c) => c === 'no error')).toHaveLength(MAX_ROUNDS - 1);
    expect(codes.at(-1)).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
  });

  it("turns GSSAPI's failure into GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED with GSSAPI's reason and the principal", async () => {
    const s = negotiateScheme('proxy.corp.example', fakeBinding([new Error('No Kerberos credentials available (default cache: FILE:/tmp/x)')], { tokens: [] }));
    const err = await s.first().then(() => undefined, (e: Error) => e);
    expect(err).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED' });
    expect(String(err)).toContain('HTTP@proxy.corp.example');
    expect(String(err)).toContain('No Kerberos credentials available');
  });

  it('refuses a proxy token that is not base64 or is oversized, and a challenge before the first token', async () => {
    const s = negotiateScheme('p', fakeBinding(['YIIB'], { tokens: [] }));
    expect(await codeOf(s.next('Negotiate oYGa'))).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    await s.first();
    expect(await codeOf(s.next('Negotiate !!!!'))).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    expect(await codeOf(s.next(`Negotiate ${'A'.repeat(70_000)}`))).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
  });

  it('says the binding is missing with GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE (no crash)', async () => {
    expect(codeOfSync(() => loadGssapi('/nonexistent/kerberos'))).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE');
  });
});
