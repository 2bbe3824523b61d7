/**
 * chooseScheme, the one decision of which scheme answers a 407: the strongest offered that this client can do,
 * whatever the order of the headers; a scheme it cannot do (no credentials, a challenge it cannot answer) is
 * passed over with the reason kept for the error; and describeProxyAuth, what `gateway dial-plan` prints.
 */
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { basicScheme } from '../../../src/dial/auth/basic.js';
import { parseChallenges } from '../../../src/dial/auth/challenge.js';
import { digestScheme } from '../../../src/dial/auth/digest.js';
import { chooseScheme, describeProxyAuth, PROXY_AUTH_SCHEMES } from '../../../src/dial/auth/scheme.js';
import { makeNegotiateScheme } from '../../../src/dial/auth/negotiate.js';
import { ntlmScheme } from '../../../src/dial/auth/ntlm.js';
import type { ProxyAuthScheme } from '../../../src/dial/auth/types.js';
import type { ProxySpec } from '../../../src/dial/select.js';

const withUser: ProxySpec = { protocol: 'http', host: 'squid', port: 3128, username: 'alice', password: 'pw', display: 'http://alice:***@squid:3128', source: 'HTTPS_PROXY' };
const anonymous: ProxySpec = { ...withUser, username: undefined, password: undefined, display: 'http://squid:3128' };
const DIGEST = 'Digest realm="r", nonce="n", qop="auth"';

/** Negotiate on a machine without the kerberos module. */
const noModule = makeNegotiateScheme({ binding: '/nonexistent/kerberos', env: { KRB5CCNAME: fileURLToPath(import.meta.url) } });

/** A stand-in for a Negotiate that can: the strongest, and needs no URL credentials. */
const negotiate: ProxyAuthScheme = {
  name: 'Negotiate',
  strength: 40,
  connectionBound: false,
  preemptive: false,
  can: () => ({ ok: true, why: 'a Kerberos ticket' }),
  accepts: () => true,
  start: () => ({ respond: async () => 'Negotiate x' }),
};

describe('chooseScheme', () => {
  it('lists Negotiate, NTLM, Digest, Basic: strongest first', () => {
    expect(PROXY_AUTH_SCHEMES.map((s) => s.name)).toEqual(['Negotiate', 'NTLM', 'Digest', 'Basic']);
  });

  it.each([[['Basic realm=r', DIGEST]], [[DIGEST, 'Basic realm=r']], [[`Basic realm=r, ${DIGEST}`]]])('Digest over Basic in %j', (headers) => {
    const choice = chooseScheme(parseChallenges(headers), withUser);
    expect(choice.scheme).toBe(digestScheme);
  });

  it('Basic when it is all that is offered; the stronger plugged-in scheme when offered', () => {
    expect(chooseScheme(parseChallenges(['Basic realm=r']), withUser).scheme).toBe(basicScheme);
    const schemes = [basicScheme, negotiate, digestScheme];
    expect(chooseScheme(parseChallenges([DIGEST, 'Negotiate', 'Basic realm=r']), withUser, schemes).scheme).toBe(negotiate);
    expect(chooseScheme(parseChallenges([DIGEST, 'Negotiate', 'Basic realm=r']), anonymous, schemes).scheme).toBe(negotiate);
  });

  it('passes over a Digest challenge it cannot answer for the Basic one, saying why', () => {
    const choice = chooseScheme(parseChallenges(['Digest realm="r", nonce="n", algorithm=SHA-1', 'Basic realm=r']), withUser);
    expect(choice.scheme).toBe(basicScheme);
  });

  it('none: what was offered, and why each known scheme was declined', () => {
    const choice = chooseScheme(parseChallenges([DIGEST, 'Basic realm=r']), anonymous);
    expect(choice).toEqual({
      scheme: undefined,
      offered: ['Digest', 'Basic'],
      declined: ['Digest: needs user:password in the proxy URL', 'Basic: needs user:password in the proxy URL'],
    });
  });

  it("none, with Negotiate declined for want of its module: that scheme's code, so the error names the fix", () => {
    const choice = chooseScheme(parseChallenges(['Negotiate', DIGEST]), anonymous, [noModule, ntlmScheme, digestScheme, basicScheme]);
    expect(choice).toMatchObject({ scheme: undefined, code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE' });
  });

  it('NTLM over Digest and Basic with a user in the URL (no domain: the proxy picks it)', () => {
    const schemes = [noModule, ntlmScheme, digestScheme, basicScheme];
    expect(chooseScheme(parseChallenges(['Basic realm=r', DIGEST, 'NTLM', 'Negotiate']), withUser, schemes).scheme).toBe(ntlmScheme);
  });
});

describe('describeProxyAuth', () => {
  it('with credentials: Digest, Basic; without: none, and why', () => {
    const schemes = [noModule, ntlmScheme, digestScheme, basicScheme];
    expect(describeProxyAuth(withUser, schemes).schemes).toEqual(['NTLM', 'Digest', 'Basic']);
    expect(describeProxyAuth(withUser, schemes).each).toEqual([
      { scheme: 'Negotiate', ok: false, why: expect.stringContaining('the kerberos module cannot be loaded') },
      { scheme: 'NTLM', ok: true, why: "NTLMv2 as alice from the proxy URL (no domain: the proxy's own)" },
      { scheme: 'Digest', ok: true, why: 'user "alice" from the proxy URL; MD5, SHA-256, SHA-512-256, qop=auth' },
      { scheme: 'Basic', ok: true, why: 'user "alice" from the proxy URL' },
    ]);
    const none = describeProxyAuth(anonymous, schemes);
    expect(none.schemes).toEqual([]);
    expect(none.reason).toMatch(/^answers no authentication challenge/);
    expect(describeProxyAuth(anonymous, [negotiate, ...PROXY_AUTH_SCHEMES]).schemes).toEqual(['Negotiate']);
  });
});
