/**
 * The Proxy-Authenticate parser: the RFC 9110 grammar (several headers, several challenges in one header,
 * auth-params and token68), what squid and the NTLM / Negotiate proxies send, its bounds, and the property that any
 * input is either a list of challenges or GW_ERR_DIAL_PROXY_MALFORMED.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { MAX_AUTH_PARAMS, MAX_CHALLENGES, offeredSchemes, parseChallenges } from '../../../src/dial/auth/challenge.js';
import { GatewayError } from '../../../src/errors.js';

const flat = (values: string[]) =>
  parseChallenges(values).map((c) => ({ scheme: c.scheme, ...(c.token68 !== undefined ? { token68: c.token68 } : {}), params: Object.fromEntries(c.params) }));

describe('Proxy-Authenticate challenges', () => {
  it.each<[string[], ReturnType<typeof flat>]>([
    [['Basic realm="gateway-test"'], [{ scheme: 'Basic', params: { realm: 'gateway-test' } }]],
    [
      ['Digest realm="gateway-test", nonce="646e0032", qop="auth", stale=false'],
      [{ scheme: 'Digest', params: { realm: 'gateway-test', nonce: '646e0032', qop: 'auth', stale: 'false' } }],
    ],
    // Squid offering both: two headers.
    [
      ['Basic realm="a"', 'Digest realm="b", nonce="n"'],
      [
        { scheme: 'Basic', params: { realm: 'a' } },
        { scheme: 'Digest', params: { realm: 'b', nonce: 'n' } },
      ],
    ],
    // Several challenges in one header, RFC 9110 section 11.6.1's example.
    [
      ['Basic realm="simple", Newauth realm="apps", type=1, title="Login to \\"apps\\""'],
      [
        { scheme: 'Basic', params: { realm: 'simple' } },
        { scheme: 'Newauth', params: { realm: 'apps', type: '1', title: 'Login to "apps"' } },
      ],
    ],
    [['NTLM, Negotiate'], [{ scheme: 'NTLM', params: {} }, { scheme: 'Negotiate', params: {} }]],
    [['Negotiate'], [{ scheme: 'Negotiate', params: {} }]],
    // A lone token after the scheme is a token68, not a parameter without a value.
    [['Basic realm'], [{ scheme: 'Basic', token68: 'realm', params: {} }]],
    [['NTLM TlRMTVNTUAACAAAA+/w=='], [{ scheme: 'NTLM', token68: 'TlRMTVNTUAACAAAA+/w==', params: {} }]],
    [['Negotiate YIIB=, Basic realm=x'], [{ scheme: 'Negotiate', token68: 'YIIB=', params: {} }, { scheme: 'Basic', params: { realm: 'x' } }]],
    // Case-insensitive names, BWS around "=", empty list elements, tabs.
    [['  , DIGEST  REALM = "r" ,, NONCE=n\t,  Basic Realm=x  '], [{ scheme: 'DIGEST', params: { realm: 'r', nonce: 'n' } }, { scheme: 'Basic', params: { realm: 'x' } }]],
    [['Basic realm="with, comma"'], [{ scheme: 'Basic', params: { realm: 'with, comma' } }]],
    [[''], []],
  ])('%j', (values, want) => {
    expect(flat(values)).toEqual(want);
  });

  it('keeps the scheme as written and a lowercase key', () => {
    const [c] = parseChallenges(['dIgEsT realm=r']);
    expect(c!.scheme).toBe('dIgEsT');
    expect(c!.key).toBe('digest');
    expect(offeredSchemes(parseChallenges(['Basic realm=a', 'basic realm=b', 'Digest realm=c']))).toEqual(['Basic', 'Digest']);
  });

  it.each([
    ['Basic realm="unterminated'],
    ['Basic realm="ends in backslash\\'],
    ['Basic realm="a"x'],
    ['Basic realm=a b'],
    ['Basic realm=a, realm=b'],
    ['Basic ="x"'],
    ['Basic{ realm=a'],
    ['Negotiate abc def'],
    ['"quoted"'],
    ['Basic realm="a\u0001b"'],
  ])('refuses %j with GW_ERR_DIAL_PROXY_MALFORMED', (value) => {
    let err: unknown;
    try {
      parseChallenges([value]);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_DIAL_PROXY_MALFORMED');
  });

  it(`refuses more than ${MAX_CHALLENGES} challenges and more than ${MAX_AUTH_PARAMS} params in one`, () => {
    expect(parseChallenges([Array.from({ length: MAX_CHALLENGES }, () => 'Basic realm=x').join(', ')])).toHaveLength(MAX_CHALLENGES);
    expect(() => parseChallenges(Array.from({ length: MAX_CHALLENGES + 1 }, () => 'Negotiate'))).toThrow(/more than 16 challenges/);
    const many = (n: number) => `Digest ${Array.from({ length: n }, (_, i) => `p${i}=v`).join(', ')}`;
    expect(parseChallenges([many(MAX_AUTH_PARAMS)])[0]!.params.size).toBe(MAX_AUTH_PARAMS);
    expect(() => parseChallenges([many(MAX_AUTH_PARAMS + 1)])).toThrow(/more than 16 parameters/);
  });

  it('any input gives challenges or GW_ERR_DIAL_PROXY_MALFORMED, never anything else', () => {
    const alphabet = fc.constantFrom(...'Basic Digest realm=",\\ \t=abc+/'.split(''));
    fc.assert(
      fc.property(fc.array(fc.string({ unit: alphabet, maxLength: 60 }), { maxLength: 4 }), (values) => {
        try {
          const out = parseChallenges(values);
          expect(out.length).toBeLessThanOrEqual(MAX_CHALLENGES);
          for (const c of out) expect(c.scheme).toMatch(/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/);
        } catch (e) {
          expect((e as GatewayError).code).toBe('GW_ERR_DIAL_PROXY_MALFORMED');
        }
      }),
      { numRuns: 2000 },
    );
  });
});
